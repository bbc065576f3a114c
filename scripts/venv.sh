#!/usr/bin/env bash
# Create (once) the project's virtualenv in the cache, install the locked Python
# dependencies, and install this checkout into it (editable). Re-runs only what the
# lock or the checkout path changed. Prints the venv path on stdout.
set -euo pipefail
top="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${NOPSTREAM_CACHE:-$HOME/.cache/nopstream}"
VENV="$CACHE/venv"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
want="$(cat "$top/requirements.lock" "$top/pyproject.toml" | sha256sum | cut -c1-16) $top"
if [[ -f "$VENV/.nopstream-stamp" && "$(cat "$VENV/.nopstream-stamp")" == "$want" ]]; then
  echo "$VENV"; exit 0
fi
start=$SECONDS
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --require-hashes -r "$top/requirements.lock" >&2
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -e "$top" >&2
echo "$want" > "$VENV/.nopstream-stamp"
echo "[venv] ready in $((SECONDS - start))s: $VENV" >&2
echo "$VENV"
