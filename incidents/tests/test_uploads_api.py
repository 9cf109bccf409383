"""``POST /api/v1/uploads/`` and ``GET /api/v1/uploads/{id}/``.

The ingest that a request starts runs on commit (a Celery task here, a thread in the embedded
mode), which never happens inside a test transaction: these tests run it explicitly with
``ingest_upload`` where they need the result.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from hindsight.testing import requests_in
from incidents.models import Incident, Upload
from timelines.ingest import ingest_upload
from timelines.models import Event

pytestmark = pytest.mark.django_db

UPLOADS_URL = "/api/v1/uploads/"


@pytest.fixture
def post_upload(client):
    def post(key, path: Path | None = None, content: bytes | None = None, name=None, **fields):
        data = dict(fields)
        if path is not None or content is not None:
            body = content if content is not None else path.read_bytes()
            data["file"] = SimpleUploadedFile(name or (path.name if path else "upload.log"),
                                              body)
        headers = {"Authorization": f"Token {key}"} if key else {}
        return client.post(UPLOADS_URL, data, headers=headers)

    return post


@pytest.fixture
def get(client):
    def run(url, key):
        return client.get(url, headers={"Authorization": f"Token {key}"})

    return run


# --- creating an upload ------------------------------------------------------------------------

def test_upload_with_a_title_creates_an_incident_and_answers_202(
        post_upload, token_for, owner, team, demo_log):
    response = post_upload(token_for(owner), demo_log, incident="API outage 3 May")

    assert response.status_code == 202, response.content
    body = response.json()
    upload = Upload.objects.get(pk=body["id"])
    incident = upload.incident
    assert incident.title == "API outage 3 May"
    assert incident.team == team
    assert incident.created_by == owner
    assert upload.uploaded_by == owner
    assert upload.name == demo_log.name
    assert upload.status == Upload.Status.PENDING
    assert upload.path_is_copy is True
    assert Path(upload.path).read_bytes() == demo_log.read_bytes()
    assert body["url"] == f"http://testserver/api/v1/uploads/{upload.pk}/"
    assert body["incident"]["id"] == incident.pk
    assert body["incident"]["url"] == f"http://testserver/incidents/{incident.pk}/"
    assert body["status"] == "pending"
    assert body["bytes_total"] == demo_log.stat().st_size


def test_uploaded_file_is_ingested_and_its_copy_deleted(
        post_upload, token_for, owner, demo_log):
    response = post_upload(token_for(owner), demo_log, incident="ingest me")
    upload = Upload.objects.get(pk=response.json()["id"])
    copy = Path(upload.path)
    assert copy.is_file()

    result = ingest_upload(upload.pk)

    assert result.status == "done"
    expected = requests_in(demo_log)
    assert result.event_count == result.new_events == len(expected)
    assert Event.objects.filter(incident=upload.incident).count() == len(expected)
    assert not copy.exists()
    assert result.path == ""


def test_upload_with_incident_id_adds_to_that_incident(
        post_upload, token_for, owner, incident, demo_log, fixtures_dir):
    other = fixtures_dir / "audit" / "openshift-requestresponse.log"
    key = token_for(owner)

    first = post_upload(key, demo_log, incident_id=str(incident.pk))
    second = post_upload(key, other, incident_id=incident.pk)

    assert first.status_code == second.status_code == 202
    assert first.json()["incident"]["id"] == second.json()["incident"]["id"] == incident.pk
    assert Incident.objects.count() == 1
    for response in (first, second):
        ingest_upload(response.json()["id"])
    assert Event.objects.filter(incident=incident).count() == (
        len(requests_in(demo_log)) + len(requests_in(other)))


def test_viewer_may_not_upload(post_upload, token_for, teammate, incident, demo_log):
    response = post_upload(token_for(teammate), demo_log, incident_id=incident.pk)

    assert response.status_code == 403
    assert not Upload.objects.exists()


def test_viewer_may_not_create_an_incident_by_upload(post_upload, token_for, teammate,
                                                     demo_log):
    response = post_upload(token_for(teammate), demo_log, incident="not allowed")

    assert response.status_code == 403
    assert not Incident.objects.exists()
    assert not Upload.objects.exists()


def test_outsider_gets_404_for_another_teams_incident(post_upload, token_for, outsider,
                                                      incident, demo_log):
    response = post_upload(token_for(outsider), demo_log, incident_id=incident.pk)

    assert response.status_code == 404
    assert not Upload.objects.exists()


def test_unknown_incident_id_is_404(post_upload, token_for, owner, incident, demo_log):
    response = post_upload(token_for(owner), demo_log, incident_id=incident.pk + 1000)

    assert response.status_code == 404


def test_without_a_file_is_400(post_upload, token_for, owner):
    response = post_upload(token_for(owner), incident="no file")

    assert response.status_code == 400
    assert "file" in response.json()
    assert not Incident.objects.exists()


def test_without_incident_or_incident_id_is_400(post_upload, token_for, owner, demo_log):
    response = post_upload(token_for(owner), demo_log)

    assert response.status_code == 400
    assert "incident" in response.json()
    assert not Upload.objects.exists()


def test_over_the_size_limit_is_413_with_a_clear_message(
        post_upload, token_for, owner, demo_log, settings):
    size = demo_log.stat().st_size
    settings.MAX_UPLOAD_BYTES = size - 1

    response = post_upload(token_for(owner), demo_log, incident="too big")

    assert response.status_code == 413
    message = json.dumps(response.json())
    assert str(size) in message
    assert re.search(rf"at most {size - 1} bytes", message)
    assert not Upload.objects.exists()
    assert not Incident.objects.exists()


def test_exactly_at_the_size_limit_is_accepted(post_upload, token_for, owner, demo_log,
                                               settings):
    settings.MAX_UPLOAD_BYTES = demo_log.stat().st_size

    response = post_upload(token_for(owner), demo_log, incident="just fits")

    assert response.status_code == 202


def test_upload_needs_a_token(post_upload, demo_log):
    response = post_upload(None, demo_log, incident="anonymous")

    assert response.status_code == 401
    assert not Incident.objects.exists()


def test_file_name_is_made_safe_on_disk(post_upload, token_for, owner, demo_log, settings):
    response = post_upload(token_for(owner), demo_log, incident="names",
                           name="../../etc/passwd audit.log")

    assert response.status_code == 202
    upload = Upload.objects.get(pk=response.json()["id"])
    path = Path(upload.path).resolve()
    assert Path(settings.UPLOAD_DIR).resolve() in path.parents
    assert " " not in path.name and "/" not in upload.name


# --- upload status -----------------------------------------------------------------------------

def test_status_reports_progress_counts_and_errors(post_upload, get, token_for, owner, demo_log):
    good = [line for line in demo_log.read_text(encoding="utf-8").splitlines() if line.strip()]
    content = "\n".join([good[0], "this is not json", good[1], "{\"kind\": 0}", good[2]]) + "\n"
    key = token_for(owner)
    created = post_upload(key, content=content.encode(), name="mixed.log", incident="status")
    url = created.json()["url"]

    before = get(url, key)
    assert before.status_code == 200
    assert before.json()["status"] == "pending"
    assert before.json()["progress"] == 0.0

    ingest_upload(created.json()["id"])
    body = get(url, key).json()

    assert body["status"] == "done"
    assert body["progress"] == 1.0
    assert body["events"] == body["new_events"] == 3
    assert body["skipped_lines"] == 2
    assert body["bytes_read"] == body["bytes_total"] == len(content.encode())
    assert [e.split(":")[:2] for e in body["errors"]] == [["mixed.log", "2"], ["mixed.log", "4"]]
    assert body["message"] == ""
    assert body["finished_at"] is not None


def test_status_of_a_failed_upload_has_the_message(post_upload, get, token_for, owner,
                                                   fixtures_dir):
    path = fixtures_dir / "audit" / "falco" / "fal_01_003.json"
    key = token_for(owner)
    created = post_upload(key, path, incident="bad evidence")

    ingest_upload(created.json()["id"])
    body = get(created.json()["url"], key).json()

    assert body["status"] == "failed"
    assert path.name in body["message"]


def test_status_of_another_teams_upload_is_404(post_upload, get, token_for, owner, outsider,
                                               demo_log):
    created = post_upload(token_for(owner), demo_log, incident="private")

    assert get(created.json()["url"], token_for(outsider)).status_code == 404
    assert get(created.json()["url"], token_for(owner)).status_code == 200


def test_teammate_may_read_upload_status(post_upload, get, token_for, owner, teammate,
                                         demo_log):
    created = post_upload(token_for(owner), demo_log, incident="shared")

    assert get(created.json()["url"], token_for(teammate)).status_code == 200


# --- upload-only tokens ------------------------------------------------------------------------

def test_upload_scope_token_may_upload_and_read_status_only(
        post_upload, get, token_for, owner, demo_log):
    key = token_for(owner, scope="upload")

    created = post_upload(key, demo_log, incident="from CI")

    assert created.status_code == 202
    body = created.json()
    assert get(body["url"], key).status_code == 200
    incident_id = body["incident"]["id"]
    ingest_upload(body["id"])
    assert get(f"/api/v1/incidents/{incident_id}/events/", key).status_code == 403
    assert get("/api/v1/incidents/", key).status_code == 403
    assert get(f"/api/v1/incidents/{incident_id}/", key).status_code == 403
    event = Event.objects.filter(incident_id=incident_id).first()
    assert get(f"/api/v1/events/{event.pk}/", key).status_code == 403
    # the same user's full token reads them
    full = token_for(owner)
    assert get(f"/api/v1/incidents/{incident_id}/events/", full).status_code == 200
