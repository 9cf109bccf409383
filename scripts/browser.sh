#!/usr/bin/env bash
# Installs Debian's Chromium for the browser tests and the figure benchmark (Playwright drives it
# through executable_path; `playwright install` cannot download browsers here). Needs root or
# sudo when Chromium is missing; does nothing when it is there.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
as_root=()
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "Chromium is missing: run 'apt-get install chromium' as root." >&2; exit 1; }
  as_root=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -qq
"${as_root[@]}" apt-get install -y -qq --no-install-recommends chromium fonts-liberation >/dev/null
/usr/bin/chromium --headless=new --version >/dev/null 2>&1 || true
test -x /usr/bin/chromium
