#!/usr/bin/env bash
# Sets up and runs Hindsight's embedded default (SQLite under var/, ingest in-process, no Docker):
# loads a demo incident from the fixture audit logs and serves http://127.0.0.1:8000/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
py=.venv/bin/python
fixtures=${HINDSIGHT_FIXTURES:-../shared/fixtures}
port=${PORT:-8000}
export SITE_URL=${SITE_URL:-http://127.0.0.1:$port}

$py manage.py migrate --noinput -v0
password_file=var/admin_password
if [ ! -s "$password_file" ]; then
  $py -c 'import secrets; print(secrets.token_urlsafe(12))' > "$password_file"
fi
DJANGO_SUPERUSER_PASSWORD=$(cat "$password_file") \
  $py manage.py createsuperuser --noinput --username admin --email admin@localhost 2>/dev/null || true

if ! $py manage.py shell -c 'from incidents.models import Incident; import sys; sys.exit(0 if Incident.objects.filter(title="Demo: fixture audit logs").exists() else 1)' 2>/dev/null; then
  # Audit logs, Kubernetes Events, component logs and a sonobuoy bundle on one timeline. One
  # fixture (falco/fal_01_003.json) is malformed on purpose: its upload shows the error.
  $py manage.py ingest "$fixtures"/audit/*.log "$fixtures"/audit/falco/*.json \
    "$fixtures"/events/* "$fixtures"/klog/* "$fixtures"/bundles/sonobuoy-results-0.10.tar.gz \
    --incident "Demo: fixture audit logs" || true
fi

echo
echo "Hindsight is at $SITE_URL/  (user: admin, password: $(cat "$password_file"))"
exec $py manage.py runserver --noreload "127.0.0.1:$port"
