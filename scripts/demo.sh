#!/usr/bin/env bash
# Sets up and runs Hindsight's embedded default (SQLite under var/, ingest in-process, no Docker):
# loads the fixture evidence as demo incidents, one real story each, and serves
# http://127.0.0.1:8000/. Each incident's link opens its page on its findings.
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

mkdir -p var/demo
# demo TITLE FILE…: ingest the files as the incident TITLE unless it exists, then say what it
# holds: its events, its findings by severity, and every file rejected with the reason. A
# rejected file is an outcome shown on the incident's page, not an error of the demo: the
# ingest's own report and exit code go to var/demo/, the summary is read from its --json line.
demo() {
  local title=$1
  shift
  local slug
  slug=$(printf '%s' "$title" | tr -cs 'A-Za-z0-9' '-' | tr 'A-Z' 'a-z')
  if ! $py manage.py shell -v0 -c "from incidents.models import Incident; import sys; sys.exit(0 if Incident.objects.filter(title='''$title''').exists() else 1)" 2>/dev/null; then
    echo "loading \"$title\" …"
    $py manage.py ingest "$@" --incident "$title" --json > "var/demo/$slug.json" \
      2> "var/demo/$slug.log" || true
  fi
  DEMO_TITLE=$title $py manage.py shell -v0 -c '
import os
from collections import Counter
from django.conf import settings
from incidents.models import Incident, Upload
from timelines.analysis import insights
from timelines.models import Event
title = os.environ["DEMO_TITLE"]
incident = Incident.objects.filter(title=title).order_by("-pk").first()
if incident is None:
    print(f"  {title}: not loaded (see var/demo/)")
    raise SystemExit(0)
found, _ = insights.current(incident.pk)
severity = Counter(i["severity"] for i in found)
events = Event.objects.filter(incident=incident).count()
print(f"  {incident.title}: {events:,} events, "
      + (", ".join(f"{severity[s]} {s}" for s in insights.SEVERITIES if severity[s])
         or "no findings")
      + f"\n    {settings.SITE_URL}{incident.get_absolute_url()}#insights")
for upload in Upload.objects.filter(incident=incident, status=Upload.Status.FAILED):
    reason = upload.message or "; ".join(upload.errors[:1])
    if not reason.startswith(upload.name):
        reason = f"{upload.name}: {reason}"
    print(f"    rejected upload: {reason}")
' || true
}

echo "demo incidents:"
# A user's session that audit2rbac turns into RBAC rules: impersonation and 403s.
demo "Demo: RBAC session (audit2rbac)" "$fixtures"/audit/audit2rbac-demo.log
# falco's minikube session of 26 October 2018 (clusterroles, pods, secrets, exec), and one
# trace that is malformed on purpose: the incident shows it as a rejected upload.
mapfile -t falco < <(grep -l '"2018-10-26T' "$fixtures"/audit/falco/*.json | grep -v fal_01_003)
demo "Demo: minikube session (falco traces)" "${falco[@]}" "$fixtures"/audit/falco/fal_01_003.json
# A kind cluster's apiserver and controller-manager starting up.
demo "Demo: kind cluster start (component logs)" "$fixtures"/klog/*
# A Deployment rolled out to two pods, as its Events and objects tell.
demo "Demo: Deployment rollout (Kubernetes Events)" "$fixtures"/events/kspan-deployment-2-pods.yaml
# Diagnose bundles of two other tools, each as it comes.
demo "Demo: sonobuoy run" "$fixtures"/bundles/sonobuoy-results-0.10.tar.gz
demo "Demo: troubleshoot support bundle" "$fixtures"/bundles/troubleshoot-supportbundle-baseline.tar.gz
# An OpenShift 4.8 install on AWS as its must-gather holds it (165,000 Events, pod and node log
# lines): the longest to load, a few minutes on SQLite, the first time only.
demo "Demo: OpenShift install on AWS (must-gather)" \
  "$fixtures"/bundles/openshift-must-gather-aws.tar.xz

echo
echo "Hindsight is at $SITE_URL/  (user: admin, password: $(cat "$password_file"))"
exec $py manage.py runserver --noreload "127.0.0.1:$port"
