#!/usr/bin/env bash
# Create (once) a virtualenv in the cache with the locked Python dependencies, keyed by
# the lock's hash so that every checkout with the same lock shares it. The project
# itself is not installed into it: the Makefile puts the checkout on PYTHONPATH and
# runs `python -m nopstream`. Prints the venv path on stdout.
set -euo pipefail
top="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${NOPSTREAM_CACHE:-$HOME/.cache/nopstream}"
lock_hash="$(sha256sum "$top/requirements.lock" | cut -c1-16)"
VENV="$CACHE/venv-$lock_hash"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if [[ -f "$VENV/.nopstream-ready" ]]; then
  echo "$VENV"; exit 0
fi
start=$SECONDS
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --require-hashes -r "$top/requirements.lock" >&2
touch "$VENV/.nopstream-ready"
echo "[venv] ready in $((SECONDS - start))s: $VENV" >&2
echo "$VENV"
