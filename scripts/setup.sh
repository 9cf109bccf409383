#!/usr/bin/env bash
# Creates .venv, installs the pinned requirements and builds the plotly.js bundle
# (scripts/assets.sh). Idempotent; quick when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
stamp=.venv/.requirements.sha256
want=$(sha256sum requirements.txt | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -r requirements.txt
  echo "$want" > "$stamp"
fi
scripts/assets.sh  # the plotly.js bundle of the incident page
scripts/native.sh  # the C scanner of audit-log ingest
# The project's bytecode, once: where PYTHONDONTWRITEBYTECODE is set, every process would
# compile its modules again (0.15-0.2 s per `manage.py` start on the bench machine).
.venv/bin/python -m compileall -q hindsight incidents timelines streams >/dev/null
