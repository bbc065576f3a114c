#!/usr/bin/env bash
# Install or build, once, the real servers the tests use: etcd and PostgreSQL 15
# (Debian), MinIO (its Go module), a Kafka broker (its jars from Maven Central), the
# Kubernetes control plane, a schema registry (Apicurio Registry, built by Quarkus from its
# jars on Maven Central), Ory Hydra (an OAuth 2.0 server: its Go module), kubectl,
# kubelet and kube-proxy (k8s.io/kubernetes at one release), helm (its Go module), and
# the node of the e2e cluster: containerd and CoreDNS (their Go modules), runc, the CNI
# plugins, iptables, conntrack, buildah and mmdebstrap (Debian), the runtime image (built
# on a Debian base made here), Lua 5.1 with lua-cjson (Debian) for the Argo CD health
# check, Chromium with its ChromeDriver (Debian) for the dashboard's browser test, and for
# each Python 3.11-3.13 found a wheelhouse of the runtime lock for the wheel test.
# Everything lands in a cache outside the repository; a second run finds it there and
# only prints what it reused.
#
# Usage: scripts/install-servers.sh [etcd] [postgres] [minio] [kafka] [registry] [hydra] [kube] [helm] [node] [image] [lua] [browser] [wheels]
#        (default: all)
set -euo pipefail

CACHE="${NOPSTREAM_CACHE:-$HOME/.cache/nopstream}"
BIN="$CACHE/bin"
MINIO_VERSION="v0.0.0-20260212201848-7aac2a2c5b7c"   # minio master of 2026-02-12
KUBE_VERSION="v1.35.4"
HELM_VERSION="v3.22.0"
CONTAINERD_VERSION="v2.4.2"
COREDNS_VERSION="v1.14.7"
KUBE_ROUTER_VERSION="v2.1.0"   # its NetworkPolicy firewall only, in the test cluster's namespaces
KAFKA_VERSION="4.4.0"   # also in scripts/kafka/pom.xml and e2e/servers.py
REGISTRY_VERSION="2.4.2.Final"   # also in scripts/schema-registry/pom.xml and e2e/servers.py
HYDRA_VERSION="v2.3.0"
TOP="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$BIN"

log() { printf '[install-servers] %s\n' "$*" >&2; }

timed() {  # timed NAME STAMP-FILE COMMAND...: run COMMAND unless STAMP-FILE exists
  local name="$1" stamp="$2"; shift 2
  if [[ -f "$stamp" ]]; then
    log "$name: cached ($(cat "$stamp"))"
    return 0
  fi
  local start=$SECONDS
  log "$name: building..."
  "$@"
  echo "$name built in $((SECONDS - start))s on $(date -u +%FT%TZ)" > "$stamp"
  log "$name: built in $((SECONDS - start))s"
}

install_etcd() {
  if command -v etcd >/dev/null 2>&1 || [[ -x /usr/bin/etcd ]]; then
    log "etcd: present ($(etcd --version 2>/dev/null | head -1))"
    return 0
  fi
  local start=$SECONDS
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends etcd-server >/dev/null
  # Debian starts the packaged service where systemd runs; tests start their own.
  log "etcd: installed from Debian in $((SECONDS - start))s"
}

install_postgres() {
  if [[ -x /usr/lib/postgresql/15/bin/postgres ]]; then
    log "postgres: present ($(/usr/lib/postgresql/15/bin/postgres --version))"
    return 0
  fi
  local start=$SECONDS
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # the server binaries and the `postgres` user; tests run their own clusters (initdb)
  apt-get install -y -qq --no-install-recommends postgresql-15 >/dev/null
  # the package may start its own cluster where it can: tests never use it
  pg_ctlcluster 15 main stop >/dev/null 2>&1 || true
  log "postgres: installed from Debian in $((SECONDS - start))s"
}

build_minio() {
  GOBIN="$BIN" go install "github.com/minio/minio@$MINIO_VERSION"
}

fetch_kafka() {
  # kafka_2.13 and its runtime dependencies (45 jars), cached in ~/.m2 as well
  local dir="$CACHE/kafka-$KAFKA_VERSION"
  rm -rf "$dir/libs.partial"
  mvn -q -B -Dstyle.color=never -f "$TOP/scripts/kafka/pom.xml" dependency:copy-dependencies -DoutputDirectory="$dir/libs.partial"
  rm -rf "$dir/libs"
  mv "$dir/libs.partial" "$dir/libs"
}

build_registry() {
  # the Quarkus build of Apicurio Registry's app jar: a runner jar and its lib/ (130 MB)
  local dir="$CACHE/schema-registry-$REGISTRY_VERSION"
  rm -rf "$dir.partial"
  mvn -q -B -Dstyle.color=never -f "$TOP/scripts/schema-registry/pom.xml" package -Dbuild.dir="$dir.partial"
  rm -rf "$dir"
  mkdir -p "$dir"
  mv "$dir.partial/schema-registry-1-runner.jar" "$dir.partial/lib" "$dir/"
  rm -rf "$dir.partial"
}

build_hydra() {
  # Built inside its own module, as Hydra's own build does: its go.mod replaces pop, which a
  # module depending on it would not honour; cgo and sqlite for its in-memory storage.
  local src="$CACHE/hydra-src-$HYDRA_VERSION" dir
  dir="$(cd "$TOP" && GOFLAGS=-mod=mod go mod download -json "github.com/ory/hydra/v2@$HYDRA_VERSION" \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')"
  rm -rf "$src"
  cp -r "$dir" "$src"
  chmod -R u+w "$src"
  # its client's replacement (./internal/httpclient) is a module of its own, left out of the
  # published zip: the same code is published as hydra-client-go
  (cd "$src" && go mod edit -dropreplace github.com/ory/hydra-client-go/v2 \
     && CGO_ENABLED=1 GOFLAGS=-mod=mod go build -tags sqlite,sqlite_omit_load_extension -o "$BIN/hydra" .)
  rm -rf "$src"
}

build_helm() {
  # Stamp the release, as helm's own build does, so `helm version` reports it.
  GOBIN="$BIN" go install -ldflags "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
}

kube_module() {  # the Go module that builds k8s.io/kubernetes commands; prints its directory
  # k8s.io/kubernetes requires its staging modules at v0.0.0 (they are replaced by
  # local paths in its own tree), so a module that builds it must replace each one
  # with the published version of the same release: v1.X.Y -> v0.X.Y.
  local mod="$CACHE/kube-build-$KUBE_VERSION" staging="v0${KUBE_VERSION#v1}"
  mkdir -p "$mod"
  if [[ ! -f "$mod/.ready" ]]; then
    local gomod
    gomod=$(cd "$mod" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" \
            | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
    {
      echo "module nopstream.local/kubebuild"
      echo
      echo "go 1.25"
      echo
      echo "require k8s.io/kubernetes $KUBE_VERSION"
      echo
      grep -oE '^\s*k8s\.io/[a-z0-9-]+ => \./staging/' "$gomod" | awk '{print $1}' | sort -u \
        | while read -r m; do echo "replace $m => $m $staging"; done
    } > "$mod/go.mod"
    {
      printf '//go:build tools\n\npackage kubebuild\n\nimport (\n'
      local cmd
      for cmd in "${KUBE_COMMANDS[@]}"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$cmd"; done
      printf ')\n'
    } > "$mod/tools.go"
    (cd "$mod" && GOFLAGS=-mod=mod go mod tidy -e >/dev/null 2>&1 || true)
    touch "$mod/.ready"
  fi
  echo "$mod"
}

KUBE_COMMANDS=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)

build_kube() {  # build_kube CMD...: k8s.io/kubernetes/cmd/CMD into the cache's bin
  local mod
  mod=$(kube_module)
  # Stamp the release into the binaries, as the Kubernetes release build does, so
  # /version and `kubectl version` report it (helm reads it).
  local minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
  local pkg ldflags=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  local cmd
  for cmd in "$@"; do
    (cd "$mod" && GOFLAGS=-mod=mod go build -ldflags "$ldflags" -o "$BIN/$cmd" "k8s.io/kubernetes/cmd/$cmd")
    log "  built $cmd"
  done
}

install_debian_packages() {  # install_debian_packages LABEL PACKAGE...: those missing, from Debian
  local label="$1" missing=() p; shift
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  if [[ ${#missing[@]} -eq 0 ]]; then
    log "$label: present ($(dpkg-query -W -f='${Package} ${Version}' "$1"))"
    return 0
  fi
  local start=$SECONDS
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  log "$label: installed ${missing[*]} from Debian in $((SECONDS - start))s"
}

build_containerd() {
  # The shim is exec'd by containerd for every pod; static, as containerd's releases ship it.
  local module="github.com/containerd/containerd/v2"
  local ldflags="-X $module/version.Version=$CONTAINERD_VERSION"
  GOBIN="$BIN" go install -tags "no_btrfs no_devmapper" -ldflags "$ldflags" \
    "$module/cmd/containerd@$CONTAINERD_VERSION" "$module/cmd/ctr@$CONTAINERD_VERSION"
  CGO_ENABLED=0 GOBIN="$BIN" go install -ldflags "$ldflags" \
    "$module/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION"
}

build_coredns() {
  GOBIN="$BIN" go install "github.com/coredns/coredns@$COREDNS_VERSION"
}

build_kube_router() {
  GOBIN="$BIN" go install "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$KUBE_ROUTER_VERSION"
}

# Each Python 3.11, 3.12, 3.13 this machine has (on PATH or under pyenv): its path, one per line.
pythons() {
  local v py
  for v in 3.11 3.12 3.13; do
    py=""
    if command -v "python$v" >/dev/null 2>&1 && "python$v" -c '' 2>/dev/null; then
      py="$(command -v "python$v")"
    else
      py="$(ls -d "$HOME"/.pyenv/versions/"$v".*/bin/"python$v" 2>/dev/null | sort -V | tail -1 || true)"
    fi
    [[ -n "$py" ]] && echo "$py"
  done
  return 0
}

# The runtime lock's wheels (and the build backend's) for one Python: the wheel test installs
# nopstream's built wheel into a fresh virtualenv from them, offline.
build_wheelhouse() {
  local py="$1" house="$2"
  rm -rf "$house.tmp" && mkdir -p "$house.tmp"
  "$py" -m pip wheel -q --disable-pip-version-check --require-hashes -r "$TOP/runtime-image/requirements.lock" -w "$house.tmp"
  "$py" -m pip download -q --disable-pip-version-check --only-binary=:all: setuptools==84.2.1 wheel==0.48.0 -d "$house.tmp"
  mv "$house.tmp" "$house"
}

wheelhouses() {
  local lock_hash py v
  lock_hash="$(sha256sum "$TOP/runtime-image/requirements.lock" | cut -c1-16)"
  for py in $(pythons); do
    v="$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
    timed "wheelhouse for Python $v" "$CACHE/wheelhouse-$v-$lock_hash/.built" \
      build_wheelhouse "$py" "$CACHE/wheelhouse-$v-$lock_hash"
    echo "$py" > "$CACHE/wheelhouse-$v-$lock_hash/python"
  done
}

what=("$@")
[[ ${#what[@]} -gt 0 ]] || what=(etcd postgres minio kafka registry hydra kube helm node image lua browser wheels)
for w in "${what[@]}"; do
  case "$w" in
    etcd) install_etcd ;;
    postgres) install_postgres ;;
    kafka) mkdir -p "$CACHE/kafka-$KAFKA_VERSION"
           # stamped with the pom's digest: a changed pom fetches the jars again
           timed "kafka $KAFKA_VERSION" "$CACHE/kafka-$KAFKA_VERSION/.fetched-$(sha256sum "$TOP/scripts/kafka/pom.xml" | cut -c1-12)" fetch_kafka ;;
    registry) # stamped with its sources' digest: a changed pom or class builds it again
              timed "schema registry $REGISTRY_VERSION" "$CACHE/schema-registry-$REGISTRY_VERSION/.built-$(
                find "$TOP/scripts/schema-registry" -type f -print0 | sort -z | xargs -0 cat | sha256sum | cut -c1-12)" build_registry ;;
    minio) timed "minio $MINIO_VERSION" "$BIN/.minio-$MINIO_VERSION" build_minio ;;
    hydra) timed "hydra $HYDRA_VERSION" "$BIN/.hydra-$HYDRA_VERSION" build_hydra ;;
    helm) timed "helm $HELM_VERSION" "$BIN/.helm-$HELM_VERSION-stamped" build_helm ;;
    kube) timed "kubernetes $KUBE_VERSION" "$BIN/.kube-$KUBE_VERSION-stamped" \
            build_kube kube-apiserver kube-controller-manager kube-scheduler kubectl ;;
    node) install_debian_packages "node packages" runc containernetworking-plugins iptables ipset conntrack buildah mmdebstrap
          timed "kubelet and kube-proxy $KUBE_VERSION" "$BIN/.kubenode-$KUBE_VERSION" build_kube kubelet kube-proxy
          timed "containerd $CONTAINERD_VERSION" "$BIN/.containerd-$CONTAINERD_VERSION" build_containerd
          timed "coredns $COREDNS_VERSION" "$BIN/.coredns-$COREDNS_VERSION" build_coredns
          timed "kube-router $KUBE_ROUTER_VERSION" "$BIN/.kube-router-$KUBE_ROUTER_VERSION" build_kube_router ;;
    image) "$TOP/scripts/build-image.sh" ;;
    # Argo CD runs health checks in Lua 5.1 (gopher-lua): the StreamJob check is tested on it
    lua) install_debian_packages "lua" lua5.1 lua-cjson ;;
    browser) install_debian_packages "browser" chromium chromium-driver ;;
    wheels) wheelhouses ;;
    *) log "unknown server '$w' (known: etcd postgres minio kafka registry hydra kube helm node image lua browser wheels)"; exit 2 ;;
  esac
done
