"""Upload from CI in one line: the README's curl command, run for real against a live server,
with ``incident_key`` (one incident per CI job) and ``Idempotency-Key`` (retries make no second
upload), and big uploads streamed to disk.

The ingest a request starts goes to a Celery queue of this test's own that no worker reads, and
the queue is deleted afterwards: these tests are about what the request answers and stores.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import tracemalloc
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from incidents.models import Incident, Upload

# every test on a queue of its own (root conftest): uploads queued here are never consumed
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("task_queue")]

# The README's line, with the host of the live server.
ONE_LINER = ('curl -fsS -H "Authorization: Token $HINDSIGHT_TOKEN" -F file=@bundle.tar.gz '
             '-F incident_key="$CI_JOB_URL" -F title="nightly e2e" {host}/api/v1/uploads/')
JOB_URL = "https://ci.example.com/platform/hindsight/-/jobs/4242"


@pytest.fixture
def ci(live_server, tmp_path, fixtures_dir, owner, token_for):
    """``ci(command, **env)`` → (exit code, stdout, stderr) of a shell command run in a
    directory holding bundle.tar.gz, with HINDSIGHT_TOKEN (the owner's) and CI_JOB_URL set."""
    shutil.copy(fixtures_dir / "bundles" / "sonobuoy-results-0.10.tar.gz",
                tmp_path / "bundle.tar.gz")
    token = token_for(owner)

    def run(command: str, **env) -> tuple[int, str, str]:
        done = subprocess.run(
            ["bash", "-c", command.replace("{host}", live_server.url)], cwd=tmp_path,
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "HINDSIGHT_TOKEN": token, "CI_JOB_URL": JOB_URL, **env})
        return done.returncode, done.stdout, done.stderr

    return run


def with_status(command: str) -> str:
    """The command printing the body, then the HTTP status on a line of its own."""
    return command.replace("curl -fsS", "curl -sS -w '\\n%{http_code}'")


def answer(stdout: str) -> tuple[dict, int]:
    body, _, code = stdout.rpartition("\n")
    return json.loads(body), int(code)


def test_the_readme_one_liner_uploads_a_bundle_and_answers_where_to_look(ci, live_server,
                                                                          team, owner):
    code, stdout, stderr = ci(with_status(ONE_LINER))

    assert code == 0, stderr
    body, status = answer(stdout)
    assert status == 202
    upload = Upload.objects.get(pk=body["id"])
    incident = upload.incident
    assert (incident.title, incident.key, incident.team) == ("nightly e2e", JOB_URL, team)
    assert upload.uploaded_by == owner and upload.name == "bundle.tar.gz"
    assert body["incident_id"] == incident.pk
    assert body["incident_url"] == f"{live_server.url}/incidents/{incident.pk}/"
    assert body["incident"] == {"id": incident.pk, "title": "nightly e2e",
                                "url": body["incident_url"]}
    assert body["status"] == "pending"


def test_the_readme_shows_this_very_line():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")

    assert ONE_LINER.replace("{host}", "https://hindsight.example.com") in readme


def test_the_same_incident_key_adds_to_the_same_incident(ci):
    first = ci(ONE_LINER)
    second = ci(ONE_LINER.replace('title="nightly e2e"', 'title="ignored the second time"'))
    other_job = ci(ONE_LINER, CI_JOB_URL=JOB_URL + "1")

    assert [r[0] for r in (first, second, other_job)] == [0, 0, 0]
    ids = [json.loads(r[1])["incident_id"] for r in (first, second, other_job)]
    assert ids[0] == ids[1] != ids[2]
    incident = Incident.objects.get(pk=ids[0])
    assert incident.title == "nightly e2e"
    assert incident.uploads.count() == 2
    assert Incident.objects.count() == 2


def test_a_retried_request_with_an_idempotency_key_returns_the_first_upload(ci):
    retried = ONE_LINER.replace("curl -fsS", 'curl -fsS -H "Idempotency-Key: k1"')

    first = answer(ci(with_status(retried))[1])
    again = answer(ci(with_status(retried))[1])

    assert (first[1], again[1]) == (202, 200)
    assert again[0]["id"] == first[0]["id"]
    assert Upload.objects.count() == 1
    # the retry's file did not stay behind in the upload directory
    assert len(list(django_settings.UPLOAD_DIR.iterdir())) == 1


def test_racing_retries_make_one_incident_and_one_upload(ci):
    racing = with_status(ONE_LINER.replace("curl -fsS", 'curl -fsS -H "Idempotency-Key: race"'))
    results = [None] * 6

    def post(n: int) -> None:
        results[n] = ci(racing, CI_JOB_URL=JOB_URL + "/race")

    threads = [threading.Thread(target=post, args=(n,)) for n in range(len(results))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    answers = [answer(stdout) for _, stdout, _ in results]
    assert {body["id"] for body, _ in answers} == {Upload.objects.get().pk}
    assert sorted(status for _, status in answers) == [200] * 5 + [202]
    assert Incident.objects.count() == 1


def test_idempotency_keys_belong_to_their_user(ci, live_server, teammate, team, token_for):
    from incidents.models import Membership

    Membership.objects.filter(user=teammate).update(role="editor")
    retried = ONE_LINER.replace("curl -fsS", 'curl -fsS -H "Idempotency-Key: shared-name"')

    mine = json.loads(ci(retried)[1])
    theirs = json.loads(ci(retried, HINDSIGHT_TOKEN=token_for(teammate))[1])

    assert mine["id"] != theirs["id"]
    assert mine["incident_id"] == theirs["incident_id"]  # the same key in the same team


def test_a_big_upload_streams_to_disk(ci, tmp_path):
    size = 24 * 1024**2
    with (tmp_path / "big.log").open("wb") as out:
        for _ in range(size // 1024**2):
            out.write(os.urandom(1024**2))
    command = ('curl -fsS -H "Authorization: Token $HINDSIGHT_TOKEN" -F file=@big.log '
               '-F incident="big" {host}/api/v1/uploads/')

    tracemalloc.start()
    try:
        code, stdout, stderr = ci(command)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert code == 0, stderr
    upload = Upload.objects.get(pk=json.loads(stdout)["id"])
    assert upload.bytes_total == size
    assert peak < 8 * 1024**2, f"{peak} bytes held at once"


def test_too_big_is_413_with_a_clear_message(ci, settings):
    settings.MAX_UPLOAD_BYTES = 1000

    code, stdout, _ = ci(with_status(ONE_LINER))

    body, status = answer(stdout)
    assert status == 413
    assert "accepts at most 1000 bytes (HINDSIGHT_MAX_UPLOAD_BYTES)" in json.dumps(body)
    assert not Upload.objects.exists() and not Incident.objects.exists()
    assert ci(ONE_LINER)[0] == 22  # curl -f fails the CI step


def test_incident_key_and_incident_id_together_are_refused(ci, incident):
    command = with_status(ONE_LINER.replace("-F title=", f"-F incident_id={incident.pk} -F x="))

    body, status = answer(ci(command)[1])

    assert status == 400 and "incident_key" in body
    assert not Upload.objects.exists()
