#!/usr/bin/env bash
# Builds assets/dist/plotly-timeline.min.js: plotly.js with only the trace types the incident
# page draws (1.5 MB instead of the plotly package's 4.8 MB), from the npm registry at the
# versions in assets/package-lock.json. Idempotent; quick when nothing changed. Without npm it
# installs Debian's nodejs and npm as root; otherwise (or if that fails) it warns and exits 0, and
# the page serves the plotly package's full plotly.min.js. A failed build exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/../assets"
out=dist/plotly-timeline.min.js
# npm ci starts by deleting node_modules, so the stamp goes with an interrupted install.
stamp=node_modules/.hindsight-build.sha256
want=$(sha256sum package.json package-lock.json plotly-timeline.js build.js | sha256sum | cut -d' ' -f1)
if [ -s "$out" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
# No bundle rather than a stale one: it might lack a trace type the figures now use, whereas the
# full plotly.min.js has them all.
rm -f "$out"

fallback() {
  echo "WARNING: $1, so the small plotly.js bundle is not built and the incident page loads" \
       "the full plotly.min.js (4.8 MB, slower first paint). Install Node.js and npm" \
       "(Debian: apt-get install nodejs npm), then run scripts/assets.sh." >&2
  exit 0
}
if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    fallback "npm is missing"
  fi
  echo "Installing Debian's nodejs and npm for the plotly.js bundle…" >&2
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null; } \
    || fallback "npm is missing and apt-get could not install it"
fi

# --ignore-scripts: nothing here needs an install script (esbuild finds its binary in its
# platform package), so none of the 250 packages gets to run code at install time.
npm ci --no-audit --no-fund --ignore-scripts --loglevel=error
node build.js
echo "$want" > "$stamp"
