"""The runtime image's Dockerfile and the Helm chart: consistent with the code, and accepted by the tools.

No container engine runs here: the Dockerfile is checked for what it installs and
runs. The chart goes through `helm lint`, `helm template` and a server-side dry run on
the real API server.
"""

from __future__ import annotations

import json
import re
import subprocess
import tomllib

import pytest
import yaml
from nopstream_operator.resources import PodSettings

from e2e import servers
from nopstream.cli.arguments import parser
from nopstream.cli.jobs import dump_crd
from tests.conftest import ROOT

# the session's one cluster: under pytest-xdist these tests all run on one worker
pytestmark = pytest.mark.xdist_group("kube")
CHART = ROOT / "charts" / "nopstream"
DOCKERFILE = ROOT / "runtime-image" / "Dockerfile"


def pins(lock: str) -> dict[str, str]:
    return dict(re.findall(r"^([a-z0-9][a-z0-9._-]*)==([^\s\\]+)", lock, flags=re.MULTILINE))


def test_the_dockerfile_installs_the_runtime_lock_and_runs_commands_that_exist():
    text = DOCKERFILE.read_text()
    assert "--require-hashes -r /src/requirements.lock" in text
    assert "COPY runtime-image/requirements.lock /src/requirements.lock" in text
    image_pins = pins((ROOT / "runtime-image" / "requirements.lock").read_text())
    repo_pins = pins((ROOT / "requirements.lock").read_text())
    # every runtime pin is the repository's pin: tests run what the image runs
    assert {k: repo_pins.get(k) for k in image_pins} == image_pins
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["operator"]]
    names = {re.split(r"[<>=!\[ ]", d, maxsplit=1)[0].lower().replace("_", "-") for d in wanted}
    assert names <= set(image_pins), names - set(image_pins)
    assert not {"pytest", "ruff", "mypy", "hypothesis"} & set(image_pins)  # no dev tools in the image
    # the entrypoint is the console script, and the pods' commands are its subcommands
    assert project["scripts"]["nopstream"] == "nopstream.__main__:main"  # the collector off as it loads
    assert 'ENTRYPOINT ["nopstream"]' in text
    assert re.search(r"^USER 10001$", text, flags=re.MULTILINE)  # not root
    # both stages on one base: the public slim image by default (the e2e node builds on its own)
    assert "ARG BASE=python:3.11-slim-bookworm" in text and text.count("FROM ${BASE}") == 2
    assert project["requires-python"] == ">=3.11,<3.14"  # the image runs 3.11, the oldest supported
    commands = set(parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["operator"]["command"] == ["nopstream", "operator"]
    assert values["pods"]["command"] == list(PodSettings(etcd="x").command) == ["nopstream"]
    assert {"task", "coordinator", "operator"} <= commands


def test_the_chart_crd_is_the_generated_one():
    assert (CHART / "crds" / "streamjob.yaml").read_text() == dump_crd()


def template(tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    """`helm template rel CHART --kube-version 1.35.4 ARGS`."""
    return helm("template", "rel", str(CHART), "--kube-version", "1.35.4", *args, tmp_path=tmp_path)


def helm(*args: str, tmp_path) -> subprocess.CompletedProcess[str]:
    env = {
        "HELM_CACHE_HOME": str(tmp_path / "cache"),
        "HELM_CONFIG_HOME": str(tmp_path / "config"),
        "HELM_DATA_HOME": str(tmp_path / "data"),
        "PATH": "/usr/bin:/bin",
    }
    return subprocess.run(
        [servers.binary("helm"), *args], capture_output=True, text=True, env=env, check=False
    )


QUICK_START = [
    "--set", "operator.replicas=2",
    "--set", "etcd.bundled=true",
    "--set", "minio.bundled=true",
    "--set", "storageSecret.create=true",
    "--set", "storageSecret.accessKey=nopstream",
    "--set", "storageSecret.secretKey=nopstream-secret",
]  # fmt: skip


def test_helm_lint_and_template(tmp_path):
    lint = helm("lint", str(CHART), "--strict", *QUICK_START, tmp_path=tmp_path)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    rendered = template(tmp_path, "-n", "ns1", *QUICK_START)
    assert rendered.returncode == 0, rendered.stderr
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    kinds = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in docs)
    assert kinds == [
        "ClusterKopfPeering/rel",
        "ClusterRole/rel-operator",
        "ClusterRoleBinding/rel-operator",
        "Deployment/rel-etcd",
        "Deployment/rel-minio",
        "Deployment/rel-operator",
        "NetworkPolicy/rel-operator",
        "Secret/nopstream-storage",
        "Service/rel-etcd",
        "Service/rel-minio",
        "ServiceAccount/nopstream-operator",
    ]
    operator = next(d for d in docs if d["metadata"]["name"] == "rel-operator" and d["kind"] == "Deployment")
    env = {e["name"]: e.get("value") for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["NOPSTREAM_ETCD"] == "rel-etcd.ns1.svc:2379"
    assert env["NOPSTREAM_OPERATOR_PEERING"] == "rel"
    assert (env["NOPSTREAM_NETWORK_POLICY"], env["NOPSTREAM_NETWORK_POLICY_FROM"]) == ("true", "[]")
    assert env["NOPSTREAM_ALLOWED_SECRETS"] == '["nopstream-storage"]'  # a job mounts the storage's only
    pod = operator["spec"]["template"]["spec"]
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
    }
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
    assert policy["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": 8080}]}]
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    # least privilege: each job's own Secret and NetworkPolicy, nothing else of either
    assert [r for r in role["rules"] if {"secrets", "networkpolicies"} & set(r["resources"])] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create", "delete"]},
        {
            "apiGroups": ["networking.k8s.io"],
            "resources": ["networkpolicies"],
            "verbs": ["get", "create", "delete"],
        },
    ]
    for allowed, expected in (("{kafka-auth}", '["kafka-auth","nopstream-storage"]'), ("{*}", None)):
        more = template(tmp_path, "-n", "ns1", *QUICK_START, "--set", f"jobs.allowedSecrets={allowed}")
        deployment = next(
            d
            for d in yaml.safe_load_all(more.stdout)
            if d and d["kind"] == "Deployment" and d["metadata"]["name"] == "rel-operator"
        )
        given = {
            e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        assert given.get("NOPSTREAM_ALLOWED_SECRETS") == expected
    assert "NOPSTREAM_ETCD_ACCESS" not in env and "etcd-access" not in json.dumps(operator)
    secured = template(tmp_path, "-n", "ns1", *QUICK_START, "--set", "etcd.accessSecret=etcd-client")
    deployment = next(
        d
        for d in yaml.safe_load_all(secured.stdout)
        if d and d["kind"] == "Deployment" and d["metadata"]["name"] == "rel-operator"
    )
    spec = deployment["spec"]["template"]["spec"]
    given = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert (given["NOPSTREAM_ETCD_ACCESS"], given["NOPSTREAM_ETCD_ACCESS_SECRET"]) == (
        "/var/run/nopstream/etcd-access",
        "etcd-client",
    )
    assert {"name": "etcd-access", "secret": {"secretName": "etcd-client"}} in spec["volumes"]
    mount = {"name": "etcd-access", "mountPath": "/var/run/nopstream/etcd-access", "readOnly": True}
    assert mount in spec["containers"][0]["volumeMounts"]
    bad = template(tmp_path, "--set", "etcd.endpoint=nohost")
    assert bad.returncode == 1
    assert "at '/etcd/endpoint': 'nohost' does not match pattern" in bad.stderr


def test_the_bundled_etcd_and_minio_serve_tls_only_when_given_their_certificates(tmp_path):
    def rendered(*more: str) -> dict[str, dict]:
        done = template(tmp_path, "-n", "ns1", *QUICK_START, *more)
        assert done.returncode == 0, done.stderr
        return {f"{d['kind']}/{d['metadata']['name']}": d for d in yaml.safe_load_all(done.stdout) if d}

    def server(docs: dict[str, dict], name: str) -> tuple[list[str], list[dict], list[dict]]:
        spec = docs[f"Deployment/rel-{name}"]["spec"]["template"]["spec"]
        return spec["containers"][0]["command"], spec["containers"][0]["volumeMounts"], spec["volumes"]

    plain = rendered()
    command, mounts, volumes = server(plain, "etcd")
    assert command[2:] == [
        "--listen-client-urls=http://0.0.0.0:2379",
        "--advertise-client-urls=http://rel-etcd:2379",
    ]
    assert [v["name"] for v in volumes] == ["data"] and [m["name"] for m in mounts] == ["data"]
    assert server(plain, "minio")[0] == ["minio", "server", "/data", "--address", ":9000"]
    assert "ca.crt" not in plain["Secret/nopstream-storage"]["stringData"]

    tls = (
        "--set",
        "etcd.tlsSecret=etcd-tls",
        "--set",
        "minio.tlsSecret=minio-tls",
        "--set",
        "storageSecret.ca=PEM",
    )
    secured = rendered(*tls)
    command, mounts, volumes = server(secured, "etcd")
    assert command[2:] == [
        "--listen-client-urls=https://0.0.0.0:2379",
        "--advertise-client-urls=https://rel-etcd:2379",
        "--cert-file=/tls/tls.crt",
        "--key-file=/tls/tls.key",
        "--client-cert-auth",
        "--trusted-ca-file=/tls/ca.crt",
    ]
    assert {"name": "tls", "secret": {"secretName": "etcd-tls"}} in volumes
    assert {"name": "tls", "mountPath": "/tls", "readOnly": True} in mounts
    command, mounts, volumes = server(secured, "minio")
    assert command == ["minio", "server", "/data", "--address", ":9000", "--certs-dir", "/certs"]
    items = [{"key": "tls.crt", "path": "public.crt"}, {"key": "tls.key", "path": "private.key"}]
    assert {"name": "certs", "secret": {"secretName": "minio-tls", "items": items}} in volumes
    assert {"name": "certs", "mountPath": "/certs", "readOnly": True} in mounts
    assert secured["Secret/nopstream-storage"]["stringData"]["ca.crt"] == "PEM"


MONITORING = [
    "--set",
    "monitoring.grafanaDashboard.enabled=true",
    "--set",
    "monitoring.podMonitor.enabled=true",
    "--set",
    "monitoring.prometheusRule.enabled=true",
]


def test_monitoring_is_asked_for_and_its_operator_kinds_made_only_where_their_crds_exist(tmp_path):
    def kinds(*args: str) -> dict[str, dict]:
        rendered = template(tmp_path, *args)
        assert rendered.returncode == 0, rendered.stderr
        names = {"rel-grafana-dashboard", "rel-jobs", "rel-alerts"}
        docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
        return {d["kind"]: d for d in docs if d["metadata"]["name"] in names}

    assert "ConfigMap" not in kinds()  # off by default
    without_crds = kinds(*MONITORING)
    assert sorted(without_crds) == ["ConfigMap"]
    crds = ["--api-versions", "monitoring.coreos.com/v1/PodMonitor"]
    crds += ["--api-versions", "monitoring.coreos.com/v1/PrometheusRule"]
    made = kinds(*MONITORING, *crds)
    assert sorted(made) == ["ConfigMap", "PodMonitor", "PrometheusRule"]
    dashboard = made["ConfigMap"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = (CHART / "files" / "grafana-dashboard.json").read_text()
    assert dashboard["data"]["nopstream.json"] == shipped.rstrip("\n")
    assert made["PodMonitor"]["spec"]["podMetricsEndpoints"] == [
        {
            "port": "http",
            "path": "/metrics",
            "scheme": "https",
            "tlsConfig": {"insecureSkipVerify": True},
            "interval": "15s",
        }
    ]
    assert made["PrometheusRule"]["spec"] == yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())


def test_the_rendered_chart_is_accepted_by_the_api_server(kube_cluster, tmp_path):
    apiserver = kube_cluster
    rendered = template(tmp_path, "--include-crds", *QUICK_START)
    assert rendered.returncode == 0, rendered.stderr
    crds = "\n---\n".join(
        d for d in rendered.stdout.split("\n---\n") if "kind: CustomResourceDefinition" in d
    )
    apiserver.kubectl("apply", "-f", "-", input=crds)
    apiserver.kubectl(
        "wait",
        "--for=condition=Established",
        "crd/clusterkopfpeerings.kopf.dev",
        "crd/streamjobs.nopstream.io",
    )
    out = apiserver.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered.stdout)
    assert "deployment.apps/rel-operator created (server dry run)" in out.stdout
    assert "clusterkopfpeering.kopf.dev/rel created (server dry run)" in out.stdout
