#!/usr/bin/env bash
# Sets up and runs the whole test suite: lint, then the PostgreSQL + Redis pass (including a real
# Celery worker; pytest-xdist workers side by side), then the embedded pass (SQLite, in-process
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
# The PostgreSQL pass in pytest-xdist workers, each with a test database, a Redis database and a
# data directory of its own (hindsight/pytest_workers.py): one more than the CPUs (up to five),
# since a test waits for PostgreSQL, a browser or a worker process part of its time; an idle
# worker takes tests from a busy one (worksteal), so that no long test is left queued at the end.
workers=$(( $(nproc) + 1 ))
.venv/bin/python -m pytest -p no:cacheprovider -n $(( workers > 5 ? 5 : workers )) \
  --dist worksteal "$@"
env -u DATABASE_URL -u CELERY_BROKER_URL HINDSIGHT_DATA_DIR="$data_dir/embedded" \
  .venv/bin/python -m pytest -p no:cacheprovider -m embedded "$@"
