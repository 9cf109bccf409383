"""Streams on the embedded default (SQLite): the same receiver, ring and cut, row by row."""

from __future__ import annotations

import pytest

from streams import store

from .helpers import event_list, expected_rows, fixture_events

pytestmark = [pytest.mark.embedded, pytest.mark.django_db]


def test_a_stream_takes_batches_once_and_cuts_on_sqlite(stream_of, post_batch, api_as, owner,
                                                        demo_log):
    stream, token = stream_of()
    rows = expected_rows(demo_log)
    body = event_list(fixture_events(demo_log))
    assert post_batch(stream.pk, body, token).json()["new"] == len(rows)
    assert post_batch(stream.pk, body, token).json()["new"] == 0
    assert store.events(stream).count() == len(rows)
    answer = api_as(owner).post(f"/api/v1/streams/{stream.pk}/incidents/", {
        "since": min(r.received for r in rows).isoformat(),
        "until": max(r.received for r in rows).isoformat(), "title": "cut"}, format="json")
    assert answer.status_code == 201
    for segment in stream.segments.all():
        store.empty_segment(segment)
    assert store.events(stream).count() == 0
    listed = api_as(owner).get(f"/api/v1/incidents/{answer.json()['id']}/events/",
                               {"page_size": 1000}).json()
    assert len(listed["results"]) == len(rows)
