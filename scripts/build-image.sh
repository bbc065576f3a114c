#!/usr/bin/env bash
# Build the images the e2e cluster runs, with no Docker engine and no registry:
#   nopstream-base      Debian bookworm with python3 (3.11), made by mmdebstrap from Debian's packages
#   nopstream/runtime   runtime-image/Dockerfile, unmodified, built by buildah on that base
#   nopstream/runtime-e2e   runtime-image/Dockerfile.e2e (the e2e jobs' user functions)
#   nopstream-e2e/etcd, nopstream-e2e/minio   the base with this machine's etcd and MinIO binaries,
#                       for the chart's bundled etcd and MinIO
#   nopstream-e2e/pause the pod sandbox image: tini waiting for a signal
# Each is saved as a docker archive in $CACHE/images (what `docker save` writes, so
# `ctr images import` and `kind load image-archive` take it) and rebuilt only when its
# inputs change: a stamp beside it holds the hash of the inputs.
#
# Usage: scripts/build-image.sh
set -euo pipefail

CACHE="${NOPSTREAM_CACHE:-$HOME/.cache/nopstream}"
TOP="$(cd "$(dirname "$0")/.." && pwd)"
OUT="$CACHE/images"
TAG="0.1.0"
SUITE="bookworm"
BASE_PACKAGES="python3,python3-venv,python-is-python3,passwd,ca-certificates,tini"
mkdir -p "$OUT"

log() { printf '[build-image] %s\n' "$*" >&2; }

# buildah keeps its layers in the cache. It runs in a mount namespace of its own, so
# the overlay mounts of its builds end with it, even when it is killed: none is left here.
buildah_() {
  unshare --mount --propagation private -- \
    buildah --root "$CACHE/buildah-overlay/root" --runroot "$CACHE/buildah-overlay/run" --storage-driver overlay "$@"
}

base_in_store() {  # the base from its archive, when buildah's store (a cache) does not hold it
  buildah_ inspect --type image "localhost/nopstream-base:$SUITE" >/dev/null 2>&1 \
    || buildah_ pull --quiet "docker-archive:$OUT/base.tar" >/dev/null
}

hash_of() {  # hash_of PATH...: one hash of the contents and names of every file under PATHs
  find "$@" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 | sort -z \
    | xargs -0 sha256sum | sha256sum | cut -c1-16
}

built() {  # built NAME HASH COMMAND...: run COMMAND unless NAME's archive was built from HASH
  local name="$1" hash="$2"; shift 2
  local stamp="$OUT/$name.inputs"
  if [[ -f "$OUT/$name.tar" && -f "$stamp" && "$(cat "$stamp")" == "$hash" ]]; then
    log "$name: cached (inputs $hash)"
    return 0
  fi
  local start=$SECONDS
  log "$name: building (inputs $hash)..."
  rm -f "$stamp"
  "$@"
  echo "$hash" > "$stamp"
  log "$name: built in $((SECONDS - start))s"
}

save() {  # save IMAGE NAME: IMAGE from buildah's store as $OUT/NAME.tar, tagged as IMAGE on docker.io
  rm -f "$OUT/$1.tar.partial"
  buildah_ push --quiet "localhost/$1" "docker-archive:$OUT/$2.tar.partial:docker.io/$1" >/dev/null
  mv "$OUT/$2.tar.partial" "$OUT/$2.tar"
}

build_base() {
  local rootfs="$OUT/base-rootfs.tar"
  # The host's own apt sources: the same mirror and snapshot its packages come from.
  local sources=/etc/apt/sources.list.d/debian.sources
  [[ -f "$sources" ]] || sources=/etc/apt/sources.list
  mmdebstrap --quiet --variant=minbase --include="$BASE_PACKAGES" --format=tar \
    "$SUITE" "$rootfs" "$sources"
  local c
  c=$(buildah_ from scratch)
  buildah_ add --quiet "$c" "$rootfs" / >/dev/null
  buildah_ config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$c"
  buildah_ commit --quiet --rm "$c" "localhost/nopstream-base:$SUITE" >/dev/null
  rm -f "$rootfs"
  save "nopstream-base:$SUITE" base
}

build_runtime() {
  base_in_store
  # pip inside the build reaches the package index through this machine's CA bundle and
  # pip configuration: both are mounted for the RUN steps only, not copied into the image.
  local mounts=()
  [[ -f /etc/ssl/certs/ca-certificates.crt ]] \
    && mounts+=(--volume /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
  [[ -f /etc/pip.conf ]] && mounts+=(--volume /etc/pip.conf:/etc/pip.conf:ro)
  (cd "$TOP" && buildah_ build --quiet --isolation chroot --layers --pull=never "${mounts[@]}" \
     --build-arg "BASE=localhost/nopstream-base:$SUITE" \
     -f runtime-image/Dockerfile -t "localhost/nopstream/runtime:$TAG" . >/dev/null)
  (cd "$TOP" && buildah_ build --quiet --isolation chroot --layers --pull=never \
     -f runtime-image/Dockerfile.e2e -t "localhost/nopstream/runtime-e2e:$TAG" . >/dev/null)
  save "nopstream/runtime:$TAG" runtime
  save "nopstream/runtime-e2e:$TAG" runtime-e2e
}

build_server_image() {  # build_server_image NAME BINARY: the base with BINARY as /usr/local/bin/NAME
  base_in_store
  local c
  c=$(buildah_ from --pull=never "localhost/nopstream-base:$SUITE")
  buildah_ copy --quiet "$c" "$2" "/usr/local/bin/$1" >/dev/null
  buildah_ commit --quiet --rm "$c" "localhost/nopstream-e2e/$1:$TAG" >/dev/null
  save "nopstream-e2e/$1:$TAG" "$1"
}

build_pause() {
  base_in_store
  local c
  c=$(buildah_ from --pull=never "localhost/nopstream-base:$SUITE")
  buildah_ config --entrypoint '["/usr/bin/tini", "--", "sleep", "infinity"]' "$c"
  buildah_ commit --quiet --rm "$c" "localhost/nopstream-e2e/pause:$TAG" >/dev/null
  save "nopstream-e2e/pause:$TAG" pause
}

BASE_RECIPE=2  # bump when build_base changes
base_hash=$(printf '%s %s %s' "$SUITE" "$BASE_PACKAGES" "$BASE_RECIPE" | sha256sum | cut -c1-16)
built base "$base_hash" build_base
runtime_hash=$( (cat "$OUT/base.inputs"; cd "$TOP" && hash_of runtime-image pyproject.toml README.md \
  nopstream operator tests/operator/e2efns.py examples/enrichment.py) | sha256sum | cut -c1-16)
built runtime "$runtime_hash" build_runtime
built pause "$(cat "$OUT/base.inputs")" build_pause
for server in etcd minio; do
  binary=$(command -v "$server" || echo "$CACHE/bin/$server")
  built "$server" "$( (cat "$OUT/base.inputs"; sha256sum "$binary") | sha256sum | cut -c1-16)" \
    build_server_image "$server" "$binary"
done
