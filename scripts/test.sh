#!/usr/bin/env bash
# Sets up and runs the whole test suite: lint, then the PostgreSQL + Redis pass (including a real
# Celery worker; one pytest-xdist worker per CPU), then the embedded pass (SQLite, in-process
# tasks). Fails, never skips, when PostgreSQL or Redis is unreachable.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/browser.sh

export DATABASE_URL=${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
export CELERY_BROKER_URL=${TEST_BROKER_URL:-redis://127.0.0.1:6379/15}
data_dir=$(mktemp -d)
trap 'rm -rf "$data_dir"' EXIT
export HINDSIGHT_DATA_DIR=$data_dir

.venv/bin/python - <<'PY'
import os, sys
import psycopg, redis
try:
    psycopg.connect(os.environ["DATABASE_URL"], connect_timeout=5).close()
except Exception as exc:
    sys.exit(f"PostgreSQL is unreachable at {os.environ['DATABASE_URL']}: {exc}")
try:
    redis.Redis.from_url(os.environ["CELERY_BROKER_URL"], socket_connect_timeout=5).ping()
except Exception as exc:
    sys.exit(f"Redis is unreachable at {os.environ['CELERY_BROKER_URL']}: {exc}")
PY

.venv/bin/ruff check .
# the PostgreSQL pass on every CPU (up to four), each pytest-xdist worker with a test database,
# a Redis database and a data directory of its own (hindsight/pytest_workers.py)
.venv/bin/python -m pytest -p no:cacheprovider -n auto --maxprocesses 4 "$@"
env -u DATABASE_URL -u CELERY_BROKER_URL HINDSIGHT_DATA_DIR="$data_dir/embedded" \
  .venv/bin/python -m pytest -p no:cacheprovider -m embedded "$@"
