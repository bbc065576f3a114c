{{- define "nopstream.labels" -}}
app.kubernetes.io/name: nopstream
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- define "nopstream.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{- define "nopstream.etcdEndpoint" -}}
{{- if .Values.etcd.bundled -}}
{{ .Release.Name }}-etcd.{{ .Release.Namespace }}.svc:2379
{{- else -}}
{{ .Values.etcd.endpoint }}
{{- end -}}
{{- end -}}

{{- /* A pod spec's nodeSelector and tolerations from a values section ("" when it sets neither). */ -}}
{{- define "nopstream.placement" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
