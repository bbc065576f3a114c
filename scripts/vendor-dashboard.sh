#!/usr/bin/env bash
# Refresh the dashboard's vendored libraries from the versions pinned in
# dashboard/package-lock.json (npm ci: exact versions, integrity checked), and write
# their checksums to nopstream/node/view/dashboard/vendor/SHA256SUMS, which a test checks.
# Run it after changing a version in dashboard/package.json (then `npm install
# --package-lock-only` there). The vendored files are committed: neither `make run`,
# `make test` nor the runtime image needs Node.js.
set -euo pipefail
top="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${NOPSTREAM_CACHE:-$HOME/.cache/nopstream}"
work="$CACHE/dashboard-npm"
rm -rf "$work" && mkdir -p "$work"
cp "$top/dashboard/package.json" "$top/dashboard/package-lock.json" "$work/"
(cd "$work" && npm ci --ignore-scripts --no-audit --no-fund --cache "$CACHE/npm-cache" >&2)
vendor="$top/nopstream/node/view/dashboard/vendor"
rm -rf "$vendor" && mkdir -p "$vendor"
cp "$work/node_modules/cytoscape/dist/cytoscape.min.js" \
   "$work/node_modules/cytoscape-dagre/dist/cytoscape-dagre.min.js" \
   "$work/node_modules/uplot/dist/uPlot.iife.min.js" \
   "$work/node_modules/uplot/dist/uPlot.min.css" "$vendor/"
for pkg in cytoscape cytoscape-dagre uplot; do
  cp "$work/node_modules/$pkg/LICENSE" "$vendor/LICENSE.$pkg"
done
(cd "$vendor" && sha256sum -- * | grep -v ' SHA256SUMS$' > SHA256SUMS)
echo "vendored into $vendor:" >&2
cat "$vendor/SHA256SUMS" >&2
