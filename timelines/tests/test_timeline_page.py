"""The incident page's server side of the timeline: one filter form whose URL is the view, the
events table alone for a new time window (``?partial=events``), and the export links."""

from __future__ import annotations

import html
import json
import re
from datetime import datetime

import pytest
from django.contrib.staticfiles import finders
from django.templatetags.static import static

pytestmark = pytest.mark.django_db

ROW = re.compile(r'<tr class="[^"]*" data-event="(\d+)">')


@pytest.fixture
def page(client, owner, incident, ingest_file, demo_log):
    ingest_file(incident, demo_log)
    client.force_login(owner)

    def get(params=None):
        response = client.get(incident.get_absolute_url(), params or {})
        assert response.status_code == 200
        return response.content.decode()

    return get


def _stamps(demo_log) -> list[str]:
    return sorted(json.loads(line)["timestamp"] for line in demo_log.read_text().splitlines()
                  if line.strip())


def _inputs(text: str, name: str) -> list[str]:
    return [html.unescape(v) for v in
            re.findall(rf'<input name="{name}" value="([^"]*)"', text)]


def test_the_events_table_alone_follows_the_window(page, demo_log):
    stamps = _stamps(demo_log)
    since, until = "2017-09-11T20:00:00Z", "2017-09-11T20:27:42Z"
    inside = [s for s in stamps if since <= s <= until]
    assert 0 < len(inside) < len(stamps)

    table = page({"since": since, "until": until, "partial": "events", "lanes": "actor"})

    assert "<h1>" not in table  # the table alone
    assert 'id="events-table"' in table
    assert len(ROW.findall(table)) == len(inside)
    times = re.findall(r'<time datetime="([^"]+)"', table)
    assert all(since <= datetime.fromisoformat(t).strftime("%Y-%m-%dT%H:%M:%SZ") <= until
               for t in times)


def test_export_links_carry_the_filters_and_nothing_else(page, incident):
    text = page({"verb": "list", "since": "2017-09-11T20:00:00Z", "lanes": "actor",
                 "colour": "outcome", "event": "7", "after": "x"})

    for kind in ("csv", "json"):
        link = html.unescape(re.search(rf'id="export-{kind}" href="([^"]+)"', text).group(1))
        path, _, query = link.partition("?")
        assert path == f"/api/v1/incidents/{incident.pk}/events.{kind}"
        assert sorted(query.split("&")) == ["since=2017-09-11T20%3A00%3A00Z", "verb=list"]


def test_the_form_keeps_repeated_and_unshown_filters(page, demo_log):
    text = page({"verb": ["get", "list"], "q": "/api", "component": "kubelet", "lanes": "actor"})

    assert _inputs(text, "verb") == ["get", "list"]  # one input each: a submit keeps both
    assert _inputs(text, "q") == ["/api"]
    assert _inputs(text, "resource") == [""]
    assert '<input type="hidden" name="component" value="kubelet">' in text
    assert '<option value="actor" selected>' in text
    # and the table is narrowed by them all: no event has a component, so nothing matches
    assert ROW.findall(text) == []
    assert len(ROW.findall(page({"verb": ["get", "list"], "q": "/api"}))) == len(_stamps(
        demo_log))


def test_the_text_filter_narrows_the_table(page, demo_log):
    uris = [json.loads(line)["requestURI"] for line in demo_log.read_text().splitlines()
            if line.strip()]
    expected = [u for u in uris if "includeuninitialized" in u.lower()]
    assert 0 < len(expected) < len(uris)

    assert len(ROW.findall(page({"q": "IncludeUninitialized"}))) == len(expected)


def test_the_table_scrolls_inside_its_own_box(page):
    text = page()
    assert re.search(r'<div class="scroll-x events-box">\s*<table class="grid events">', text)


def test_the_page_loads_the_timeline_scripts_from_this_server(page, settings):
    text = page()
    scripts = re.findall(r'<script src="([^"]+)"', text)
    # deferred, so in this order: each uses what the ones before it define
    assert [s.rsplit("/", 1)[-1] for s in scripts[-6:]] == [
        "dom.js", "event-detail.js", "hover.js", "timeline.js", "overview.js", "suggest.js"]
    # plotly.js first, async: it compiles while the first figure loads
    assert scripts[0] == static(settings.PLOTLY_JS)
    assert f'<script src="{scripts[0]}" id="plotly-js" async>' in text
    assert finders.find(settings.PLOTLY_JS)
    assert all(s.startswith("/static/") for s in scripts)


def test_without_the_bundle_the_page_loads_the_full_plotly_js(page, settings):
    settings.PLOTLY_JS = "plotly/plotly.min.js"  # what settings.py chooses when it is not built
    scripts = re.findall(r'<script src="([^"]+)"', page())
    assert scripts[0] == static("plotly/plotly.min.js")
