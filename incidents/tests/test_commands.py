"""``manage.py ingest`` (the JSON contract for scripts and CI) and
``manage.py create_api_token``."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from io import StringIO
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import connection

from hindsight.testing import requests_in
from incidents.models import ApiToken, Incident, Membership, Team, Upload
from timelines.analysis.registry import registered
from timelines.models import Event, IncidentInsights

ROOT = Path(__file__).resolve().parents[2]


def last_json_line(text: str) -> dict:
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines, "nothing on stdout"
    return json.loads(lines[-1])


@pytest.fixture
def audit_files(fixtures_dir) -> list[Path]:
    return [fixtures_dir / "audit" / "audit2rbac-demo.log",
            fixtures_dir / "audit" / "openshift-requestresponse.log",
            fixtures_dir / "audit" / "falco" / "create_configmap_sensitive_values.json"]


def run_ingest(*paths, **options) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("ingest", *map(str, paths), json=True, stdout=out, stderr=err, **options)
    return out.getvalue(), err.getvalue()


# --- manage.py ingest --------------------------------------------------------------------------

@pytest.mark.django_db
def test_ingest_json_summary_is_the_last_line_and_counts_match_the_files(audit_files):
    out, _ = run_ingest(*audit_files, incident="from CI")

    summary = last_json_line(out)
    incident = Incident.objects.get(pk=summary["incident"]["id"])
    assert incident.title == "from CI"
    assert incident.team is None  # no --team: superusers only
    assert summary["incident"]["url"] == (
        f"{django_settings.SITE_URL}/incidents/{incident.pk}/")
    uploads = summary["uploads"]
    assert [u["name"] for u in uploads] == [p.name for p in audit_files]
    for entry, path in zip(uploads, audit_files, strict=True):
        for key in ("name", "status", "events", "skipped_lines", "redacted", "errors"):
            assert key in entry
        assert entry["status"] == "done"
        assert entry["events"] == len(requests_in(path))
        assert entry["skipped_lines"] == 0
        assert entry["errors"] == []
    assert uploads[2]["redacted"] > 0  # the ConfigMaps with credentials
    assert Event.objects.filter(incident=incident).count() == sum(
        len(requests_in(p)) for p in audit_files)
    # the files are read in place and left alone
    assert all(p.is_file() for p in audit_files)
    rows = {u.name: u for u in Upload.objects.filter(incident=incident)}
    assert all(not u.path_is_copy for u in rows.values())
    assert rows[audit_files[2].name].redacted == uploads[2]["redacted"]


@pytest.mark.django_db
def test_ingest_into_an_existing_incident_with_team(team, incident, audit_files):
    out, _ = run_ingest(audit_files[0], incident_id=incident.pk)

    assert last_json_line(out)["incident"]["id"] == incident.pk
    assert Event.objects.filter(incident=incident).count() == len(requests_in(audit_files[0]))


@pytest.mark.django_db
def test_ingest_with_team_creates_the_incident_in_that_team(team, audit_files):
    out, _ = run_ingest(audit_files[1], incident="team one", team=team.name)

    assert Incident.objects.get(pk=last_json_line(out)["incident"]["id"]).team == team


@pytest.mark.django_db
def test_ingest_with_an_unknown_team_is_an_error(audit_files):
    with pytest.raises(CommandError, match="no team"):
        run_ingest(audit_files[1], incident="x", team="nope")


@pytest.mark.django_db
def test_ingest_bad_file_among_good_ones_fails_but_keeps_the_good(
        audit_files, fixtures_dir, tmp_path):
    bad = fixtures_dir / "audit" / "falco" / "fal_01_003.json"
    paths = [audit_files[0], bad, audit_files[1]]
    out, err = StringIO(), StringIO()

    with pytest.raises(CommandError) as excinfo:
        call_command("ingest", *map(str, paths), incident="partly bad", json=True,
                     stdout=out, stderr=err)

    assert "1 of 3" in str(excinfo.value)
    summary = last_json_line(out.getvalue())
    statuses = {u["name"]: u["status"] for u in summary["uploads"]}
    assert statuses == {audit_files[0].name: "done", bad.name: "failed",
                        audit_files[1].name: "done"}
    by_name = {u["name"]: u for u in summary["uploads"]}
    assert by_name[audit_files[0].name]["events"] == len(requests_in(audit_files[0]))
    assert by_name[audit_files[1].name]["events"] == len(requests_in(audit_files[1]))
    assert bad.name in by_name[bad.name]["message"]
    incident = Incident.objects.get(pk=summary["incident"]["id"])
    assert Event.objects.filter(incident=incident).count() == (
        len(requests_in(audit_files[0])) + len(requests_in(audit_files[1])))
    db_status = dict(Upload.objects.filter(incident=incident).values_list("name", "status"))
    assert db_status == statuses


@pytest.mark.django_db
def test_ingest_without_json_prints_the_incident_url(audit_files):
    out = StringIO()

    call_command("ingest", str(audit_files[1]), incident="human", stdout=out, stderr=StringIO())

    incident = Incident.objects.get(title="human")
    assert out.getvalue().strip().splitlines()[-1] == (
        f"Incident {incident.pk}: {django_settings.SITE_URL}/incidents/{incident.pk}/")


@pytest.mark.django_db
def test_ingest_reads_a_directory_as_a_bundle_with_paths_inside_it(tmp_path, audit_files):
    folder = tmp_path / "logs"
    (folder / "node-b").mkdir(parents=True)
    (folder / "a.log").write_bytes(audit_files[0].read_bytes())
    (folder / "node-b" / "b.log").write_bytes(audit_files[1].read_bytes())

    out, _ = run_ingest(folder, incident="dir")

    summary = last_json_line(out)
    assert sorted(u["name"] for u in summary["uploads"]) == ["a.log", "node-b/b.log"]
    assert [b["files"] for b in summary["bundles"]] == [2]
    assert sum(u["events"] for u in summary["uploads"]) == (
        len(requests_in(audit_files[0])) + len(requests_in(audit_files[1])))


def _subprocess_env(tmp_path) -> dict:
    db = connection.settings_dict
    host = db["HOST"] or "127.0.0.1"
    port = db["PORT"] or 5432
    return {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}@{host}:{port}/{db['NAME']}",
        "HINDSIGHT_DATA_DIR": str(tmp_path / "data"),
    }


@pytest.mark.django_db(transaction=True)
def test_ingest_as_a_real_process_exit_code_and_last_line(audit_files, fixtures_dir, tmp_path):
    env = _subprocess_env(tmp_path)
    good = [str(p) for p in audit_files[:2]]

    # --jobs 2: each file in a forked process of its own
    ok = subprocess.run([sys.executable, "manage.py", "ingest", *good, "--incident", "proc",
                         "--json", "--jobs", "2"], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=120)

    assert ok.returncode == 0, ok.stderr
    summary = last_json_line(ok.stdout)
    # it returned once the events were readable; the analyses run behind, in a process of
    # their own, which marks the files done
    assert [(u["status"], u["stage"]) for u in summary["uploads"]] == [("running", "ready")] * 2
    assert summary["ready_s"] > 0 and summary["complete_s"] is None
    assert [u["events"] for u in summary["uploads"]] == [
        len(requests_in(p)) for p in audit_files[:2]]
    # the process wrote to this test's database
    incident = Incident.objects.get(pk=summary["incident"]["id"])
    assert incident.title == "proc"
    assert Event.objects.filter(incident=incident).count() == sum(
        len(requests_in(p)) for p in audit_files[:2])
    deadline = time.monotonic() + 60
    while incident.uploads.exclude(status=Upload.Status.DONE).exists():
        assert time.monotonic() < deadline, "the analyses behind the first answer never ended"
        time.sleep(0.1)
    total = len(registered())
    assert list(incident.uploads.values_list("stage", "analyses")) == [
        ("complete", {"done": total, "total": total})] * 2
    assert IncidentInsights.objects.filter(incident=incident).exists()

    bad = str(fixtures_dir / "audit" / "falco" / "fal_01_003.json")
    failed = subprocess.run([sys.executable, "manage.py", "ingest", good[1], bad,
                             "--incident", "proc bad", "--json", "--wait-complete"], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=120)

    assert failed.returncode == 1
    summary = last_json_line(failed.stdout)
    assert [u["status"] for u in summary["uploads"]] == ["done", "failed"]
    assert summary["complete_s"] >= summary["ready_s"] > 0
    assert "1 of 2" in failed.stderr


# --- manage.py create_api_token ----------------------------------------------------------------

def create_token(*args, **options) -> str:
    out = StringIO()
    call_command("create_api_token", *args, stdout=out, stderr=StringIO(), **options)
    return out.getvalue().strip().splitlines()[-1]


@pytest.mark.django_db
def test_create_api_token_makes_user_team_editor_and_a_working_token(client):
    key = create_token("ci-bot", team="sre")

    user = get_user_model().objects.get(username="ci-bot")
    team = Team.objects.get(name="sre")
    assert Membership.objects.get(user=user, team=team).role == Membership.Role.EDITOR
    assert not user.has_usable_password()
    response = client.get("/api/v1/incidents/", headers={"Authorization": f"Token {key}"})
    assert response.status_code == 200
    token = ApiToken.objects.get(user=user)
    assert token.scope == ApiToken.Scope.FULL


@pytest.mark.django_db
def test_create_api_token_twice_gives_two_working_tokens(client):
    first = create_token("ci-bot", team="sre")
    second = create_token("ci-bot", team="sre")

    assert first != second
    assert ApiToken.objects.filter(user__username="ci-bot").count() == 2
    assert Membership.objects.filter(user__username="ci-bot").count() == 1
    for key in (first, second):
        response = client.get("/api/v1/incidents/", headers={"Authorization": f"Token {key}"})
        assert response.status_code == 200


@pytest.mark.django_db
def test_create_api_token_stores_only_the_hash():
    key = create_token("ci-bot", team="sre")

    token = ApiToken.objects.get(user__username="ci-bot")
    assert token.key_hash == hashlib.sha256(key.encode()).hexdigest()
    with connection.cursor() as cursor:
        cursor.execute("SELECT t::text FROM incidents_apitoken t")
        rows = [r[0] for r in cursor.fetchall()]
    assert rows
    assert all(key not in row for row in rows)
    assert all(key[10:] not in row for row in rows)  # not even the secret part


@pytest.mark.django_db
def test_token_from_the_command_can_upload_to_a_new_incident_of_its_team(client, fixtures_dir):
    from django.core.files.uploadedfile import SimpleUploadedFile

    key = create_token("ci-bot", team="sre")
    path = fixtures_dir / "audit" / "openshift-requestresponse.log"

    response = client.post("/api/v1/uploads/",
                           {"incident": "from CI", "file": SimpleUploadedFile(
                               path.name, path.read_bytes())},
                           headers={"Authorization": f"Token {key}"})

    assert response.status_code == 202
    assert Incident.objects.get(pk=response.json()["incident"]["id"]).team.name == "sre"


@pytest.mark.django_db
def test_an_upload_scoped_token_only_uploads(client, fixtures_dir):
    from django.core.files.uploadedfile import SimpleUploadedFile

    key = create_token("ci-bot", "--scope", "upload", team="sre")
    headers = {"Authorization": f"Token {key}"}
    path = fixtures_dir / "audit" / "openshift-requestresponse.log"

    uploaded = client.post("/api/v1/uploads/", {"incident": "from CI", "file": SimpleUploadedFile(
        path.name, path.read_bytes())}, headers=headers)
    listed = client.get("/api/v1/incidents/", headers=headers)

    assert ApiToken.objects.get(user__username="ci-bot").scope == ApiToken.Scope.UPLOAD
    assert uploaded.status_code == 202
    assert client.get(uploaded.json()["url"], headers=headers).status_code == 200
    assert listed.status_code == 403 and "only upload" in listed.json()["detail"]


@pytest.mark.django_db
def test_a_token_made_to_expire_works_until_then(client):
    from datetime import timedelta

    from django.utils import timezone

    before = timezone.now()
    key = create_token("ci-bot", "--expires-in", "7", "--scope", "full")

    token = ApiToken.objects.get(user__username="ci-bot")
    assert before + timedelta(days=7) <= token.expires_at <= timezone.now() + timedelta(days=7)
    assert token.scope == ApiToken.Scope.FULL
    headers = {"Authorization": f"Token {key}"}
    assert client.get("/api/v1/incidents/", headers=headers).status_code == 200
    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now())
    assert client.get("/api/v1/incidents/", headers=headers).status_code == 401


@pytest.mark.django_db
@pytest.mark.parametrize(("args", "message"), [
    (["--scope", "admin"], "--scope must be one of full, upload, not 'admin'"),
    (["--scope", "FULL"], "--scope must be one of full, upload"),
    (["--expires-in", "0"], "--expires-in must be a whole number of days from 1 to 3650"),
    (["--expires-in", "-3"], "not '-3'"),
    (["--expires-in", "1.5"], "not '1.5'"),
    (["--expires-in", "a week"], "not 'a week'"),
    (["--expires-in", "3651"], "from 1 to 3650"),
    (["--team", " "], "--team must name a team"),
])
def test_create_api_token_refuses_bad_values_and_creates_nothing(args, message):
    with pytest.raises(CommandError, match=re.escape(message)):
        create_token("ci-bot", *args)

    assert not get_user_model().objects.filter(username="ci-bot").exists()
    assert not ApiToken.objects.exists() and not Team.objects.exists()


def test_create_api_token_says_what_it_made_and_bad_values_exit_1(tmp_path):
    """From the command line: the key alone on stdout's last line, a clear error and exit code
    1 for a bad value."""
    env = {**os.environ, "HINDSIGHT_DATA_DIR": str(tmp_path)}
    env.pop("DATABASE_URL", None)  # a database of its own: SQLite in tmp_path
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "-v0"], cwd=ROOT, env=env, check=True)

    made = subprocess.run([*manage, "create_api_token", "ci-bot", "--scope", "upload",
                           "--expires-in", "30"], cwd=ROOT, env=env, capture_output=True,
                          text=True)
    refused = subprocess.run([*manage, "create_api_token", "ci-bot", "--expires-in", "soon"],
                             cwd=ROOT, env=env, capture_output=True, text=True)

    assert made.returncode == 0, made.stderr
    assert re.fullmatch(r"hs_[A-Za-z0-9_-]{43}", made.stdout.strip().splitlines()[-1])
    assert "scope upload, expires " in made.stderr
    assert refused.returncode == 1
    assert "CommandError: --expires-in must be a whole number of days" in refused.stderr
    assert "Traceback" not in refused.stderr


@pytest.mark.django_db
def test_create_api_token_promotes_a_viewer_to_editor(teammate, team):
    create_token(teammate.username, team=team.name)

    assert Membership.objects.get(user=teammate, team=team).role == Membership.Role.EDITOR
    assert teammate.memberships.count() == 1
