"""The pages: incident list, incident page (uploads, events table, filters, paging), upload form."""

from __future__ import annotations

import html
import json
import re
import uuid
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from incidents.models import Incident, Upload

pytestmark = pytest.mark.django_db

SOURCE_CELL = re.compile(r'<td class="src"[^>]*>([^<]*)</td>')
NEXT_LINK = re.compile(r'<a href="([^"]*)" rel="next">')


def lines_of(path: Path) -> list[tuple[int, dict]]:
    return [(n, json.loads(line)) for n, line in
            enumerate(path.read_text(encoding="utf-8").splitlines(), start=1) if line.strip()]


def source_cells(response) -> list[str]:
    return SOURCE_CELL.findall(response.content.decode())


@pytest.fixture
def owner_client(client, owner):
    client.force_login(owner)
    return client


# --- list --------------------------------------------------------------------------------------

def test_anonymous_is_sent_to_login(client, incident):
    for url in ("/", reverse("incidents:detail", args=[incident.pk])):
        response = client.get(url)
        assert response.status_code == 302
        assert response.url.startswith(reverse("login"))
        assert "next=" in response.url


def test_owner_sees_the_incident_list(owner_client, incident, other_team, ingest_file,
                                      demo_log):
    hidden = Incident.objects.create(title="payments-secret-incident", team=other_team)
    ingest_file(incident, demo_log)

    response = owner_client.get("/")

    assert response.status_code == 200
    page = response.content.decode()
    assert incident.title in page
    assert incident.get_absolute_url() in page
    assert hidden.title not in page
    listed = list(response.context["incidents"])
    assert listed == [incident]
    assert listed[0].event_count == len(lines_of(demo_log))
    assert listed[0].upload_count == 1


# --- incident page -----------------------------------------------------------------------------

def test_incident_page_shows_uploads_and_every_event(owner_client, incident, ingest_file,
                                                     demo_log, fixtures_dir):
    bad = fixtures_dir / "audit" / "falco" / "fal_01_003.json"
    ingest_file(incident, demo_log)
    ingest_file(incident, bad)
    expected = {f"{demo_log.name}:{n}" for n, _ in lines_of(demo_log)}

    response = owner_client.get(incident.get_absolute_url())

    assert response.status_code == 200
    page = response.content.decode()
    rows = re.findall(r'<tr data-upload="(\d+)".*?</tr>', page, re.S)
    assert len(rows) == 2
    good_row = re.search(r'<tr data-upload="\d+"[^>]*>\s*<td>audit2rbac-demo\.log'
                         r'(?: <span class="hint">audit</span>)</td>(.*?)</tr>', page,
                         re.S).group(1)
    assert 'data-field="status">done<' in good_row
    assert f'data-field="events">{len(expected)}<' in good_row
    assert 'data-field="skipped_lines">0<' in good_row
    bad_row = re.search(r'<tr data-upload="\d+"[^>]*>\s*<td>fal_01_003\.json</td>(.*?)</tr>',
                        page, re.S).group(1)  # no format: nothing could read it
    assert 'data-field="status">failed<' in bad_row
    assert "fal_01_003.json" in html.unescape(re.search(r"<strong>(.*?)</strong>", bad_row,
                                                        re.S).group(1))
    cells = source_cells(response)
    assert len(cells) == len(expected)
    assert set(cells) == expected
    assert f"{len(expected)} events" in page
    # the owner (editor) gets the upload form
    assert reverse("incidents:upload", args=[incident.pk]) in page


def test_filter_narrows_the_events_table(owner_client, incident, ingest_file, demo_log):
    ingest_file(incident, demo_log)
    lists = {f"{demo_log.name}:{n}" for n, e in lines_of(demo_log) if e["verb"] == "list"}
    assert 0 < len(lists) < len(lines_of(demo_log))

    response = owner_client.get(incident.get_absolute_url(), {"verb": "list"})

    assert response.status_code == 200
    assert set(source_cells(response)) == lists
    assert len(source_cells(response)) == len(lists)


def test_filters_and_on_the_page(owner_client, incident, ingest_file, demo_log):
    ingest_file(incident, demo_log)
    expected = {f"{demo_log.name}:{n}" for n, e in lines_of(demo_log)
                if e["verb"] == "list" and e["responseStatus"]["code"] == 403
                and (e.get("impersonatedUser") or {}).get("username") == "bob"}
    lists = {n for n, e in lines_of(demo_log) if e["verb"] == "list"}
    assert 0 < len(expected) < len(lists)

    response = owner_client.get(incident.get_absolute_url(),
                                {"verb": "list", "code": "403", "impersonated_user": "bob"})

    assert set(source_cells(response)) == expected


def test_bad_filter_value_shows_an_error_not_a_crash(owner_client, incident, ingest_file,
                                                     demo_log):
    ingest_file(incident, demo_log)

    response = owner_client.get(incident.get_absolute_url(), {"code": "abc"})

    assert response.status_code == 200
    assert 'class="flash error"' in response.content.decode()
    assert source_cells(response) == []


def test_outsider_gets_404_on_the_incident_page(client, outsider, incident):
    client.force_login(outsider)

    assert client.get(incident.get_absolute_url()).status_code == 404


def test_viewer_sees_the_page_without_the_upload_form(client, teammate, incident):
    client.force_login(teammate)

    response = client.get(incident.get_absolute_url())

    assert response.status_code == 200
    assert reverse("incidents:upload", args=[incident.pk]) not in response.content.decode()


# --- uploading from the page -------------------------------------------------------------------

def test_posting_a_file_to_the_upload_form_creates_an_upload(owner_client, owner, incident,
                                                             demo_log):
    url = reverse("incidents:upload", args=[incident.pk])
    response = owner_client.post(url, {"file": [
        SimpleUploadedFile("node-1.log", demo_log.read_bytes()),
        SimpleUploadedFile("node-2.log", demo_log.read_bytes()),
    ]})

    assert response.status_code == 302
    assert response.url == incident.get_absolute_url()
    uploads = list(Upload.objects.filter(incident=incident).order_by("name"))
    assert [u.name for u in uploads] == ["node-1.log", "node-2.log"]
    for upload in uploads:
        assert upload.status == Upload.Status.PENDING
        assert upload.uploaded_by == owner
        assert upload.path_is_copy
        assert Path(upload.path).read_bytes() == demo_log.read_bytes()


def test_upload_form_refuses_files_over_the_limit(owner_client, incident, demo_log, settings):
    settings.MAX_UPLOAD_BYTES = 10
    url = reverse("incidents:upload", args=[incident.pk])

    response = owner_client.post(url, {"file": SimpleUploadedFile("big.log",
                                                                  demo_log.read_bytes())},
                                 follow=True)

    assert not Upload.objects.exists()
    assert "big.log" in response.content.decode()


def test_viewer_may_not_upload(client, teammate, incident, demo_log):
    client.force_login(teammate)

    response = client.post(reverse("incidents:upload", args=[incident.pk]),
                           {"file": SimpleUploadedFile("x.log", demo_log.read_bytes())})

    assert response.status_code == 403
    assert not Upload.objects.exists()


def test_outsider_may_not_upload(client, outsider, incident, demo_log):
    client.force_login(outsider)

    response = client.post(reverse("incidents:upload", args=[incident.pk]),
                           {"file": SimpleUploadedFile("x.log", demo_log.read_bytes())})

    assert response.status_code == 404
    assert not Upload.objects.exists()


def test_creating_an_incident_from_the_list_page(owner_client, team, demo_log):
    response = owner_client.post(reverse("incidents:create"), {
        "title": "new from page",
        "file": SimpleUploadedFile("a.log", demo_log.read_bytes())})

    incident = Incident.objects.get(title="new from page")
    assert response.status_code == 302
    assert response.url == incident.get_absolute_url()
    assert incident.team == team
    assert incident.uploads.count() == 1


# --- paging ------------------------------------------------------------------------------------

@pytest.fixture
def clone_events(tmp_path, demo_log):
    """``clone_events(count)``: a file of ``count`` requests, the demo log's events cloned with
    new auditIDs (same timestamps, so that many requests share a moment)."""
    originals = [e for _, e in lines_of(demo_log)]

    def make(count: int) -> Path:
        path = tmp_path / f"cloned-{count}.log"
        with path.open("w", encoding="utf-8") as out:
            for n in range(count):
                event = dict(originals[n % len(originals)])
                event["auditID"] = str(uuid.UUID(int=n + 1))
                out.write(json.dumps(event) + "\n")
        return path

    return make


@pytest.fixture
def many_events(clone_events) -> Path:
    return clone_events(130)


def test_next_page_link_shows_the_rest(owner_client, incident, ingest_file, many_events):
    assert ingest_file(incident, many_events).event_count == 130
    expected = {f"{many_events.name}:{n}" for n in range(1, 131)}

    first = owner_client.get(incident.get_absolute_url())

    first_cells = source_cells(first)
    assert len(first_cells) == 100
    link = NEXT_LINK.search(first.content.decode())
    assert link, "no next-page link with 130 events"
    second = owner_client.get(incident.get_absolute_url() + html.unescape(link.group(1)))
    assert second.status_code == 200
    second_cells = source_cells(second)
    assert len(second_cells) == 30
    assert NEXT_LINK.search(second.content.decode()) is None
    assert set(first_cells) | set(second_cells) == expected
    assert not set(first_cells) & set(second_cells)


def test_next_page_keeps_the_filter(owner_client, incident, ingest_file, clone_events):
    many_events = clone_events(250)
    ingest_file(incident, many_events)
    gets = {f"{many_events.name}:{n}" for n, e in lines_of(many_events) if e["verb"] == "get"}
    assert len(gets) > 100

    first = owner_client.get(incident.get_absolute_url(), {"verb": "get"})
    link = html.unescape(NEXT_LINK.search(first.content.decode()).group(1))
    assert "verb=get" in link
    second = owner_client.get(incident.get_absolute_url() + link)

    cells = source_cells(first) + source_cells(second)
    assert len(cells) == len(gets)
    assert set(cells) == gets
    assert NEXT_LINK.search(second.content.decode()) is None


def test_exactly_a_page_of_events_has_no_next_link(owner_client, incident, ingest_file,
                                                   many_events, tmp_path):
    path = tmp_path / "hundred.log"
    path.write_text("".join(many_events.read_text().splitlines(keepends=True)[:100]))
    ingest_file(incident, path)

    response = owner_client.get(incident.get_absolute_url())

    assert len(source_cells(response)) == 100
    assert NEXT_LINK.search(response.content.decode()) is None


def test_bad_page_cursor_is_404(owner_client, incident):
    response = owner_client.get(incident.get_absolute_url(), {"after": "not-a-time|x"})

    assert response.status_code == 404


def test_the_incident_list_counts_a_bundle_s_events_once(owner_client, incident, tmp_path,
                                                         fixtures_dir):
    import io
    import tarfile

    from hindsight.testing import requests_in
    from incidents.models import Upload
    from timelines.ingest import ingest_upload

    log = fixtures_dir / "audit" / "audit2rbac-demo.log"
    bundle = tmp_path / "b.tar"
    with tarfile.open(bundle, "w") as archive:
        info = tarfile.TarInfo("node/audit.log")
        info.size = log.stat().st_size
        archive.addfile(info, io.BytesIO(log.read_bytes()))
    upload = Upload.objects.create(incident=incident, name="b.tar", path=str(bundle),
                                   path_is_copy=False)
    ingest_upload(upload.pk)

    page = owner_client.get(reverse("incidents:list")).content.decode()

    link = re.escape(f'<td><a href="{incident.get_absolute_url()}">')
    row = re.search(link + r".*?</tr>", page, re.S)
    cells = re.findall(r"<td>(\d+)</td>", row.group(0))
    assert cells == ["1", str(len(requests_in(log)))]  # one upload, its events once


def test_the_page_path_is_the_one_the_urlconf_makes(incident):
    """``Incident.page_path`` (``manage.py ingest`` prints it without importing the views)
    names the page ``incidents:detail`` serves, under a script prefix too."""
    from django.urls import get_script_prefix, set_script_prefix

    before = get_script_prefix()
    try:
        for prefix in ("/", "/hindsight/"):
            set_script_prefix(prefix)
            assert incident.page_path() == incident.get_absolute_url() == reverse(
                "incidents:detail", args=[incident.pk])
            assert incident.page_path().startswith(prefix)
    finally:
        set_script_prefix(before)
