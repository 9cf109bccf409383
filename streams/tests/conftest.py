from __future__ import annotations

import orjson
import pytest


@pytest.fixture
def stream_of(team):
    """``stream_of(**options)`` → (stream, token) of ``team``."""
    from streams.store import create_stream

    def make(name="ci", **options):
        options.setdefault("retention_hours", 2)  # 3 slots: quick to make
        return create_stream(name, team, **options)

    return make


@pytest.fixture
def post_batch(client):
    """``post_batch(stream, body, token)`` → the receiver's answer."""

    def post(stream_id, body, token, **headers):
        if isinstance(body, dict | list):
            body = orjson.dumps(body)
        return client.post(f"/api/v1/streams/{stream_id}/audit/", body,
                           content_type="application/json",
                           headers={"Authorization": f"Bearer {token}", **headers})

    return post


@pytest.fixture(autouse=True)
def _detector_stopped():
    """A test's detection child (``streams.detector``) stops with it: it holds a connection to
    the test database, which must be dropped at the end."""
    yield
    from streams import detector

    if detector._detector is not None:
        detector._detector.stop()
