"""The ring of hourly slots: a later hour takes a slot whole, retention empties whole slots, and
what is too old for the ring is counted, not stored."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import orjson
import pytest
from django.db import connection

from streams import store
from streams.tasks import apply_stream_retention
from timelines.models import BodyChunk

from .helpers import event_list, fixture_events

pytestmark = pytest.mark.django_db

BASE = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)


def _at(lines: list[bytes], hour: int, tag: str) -> list[bytes]:
    """The events moved into hour ``BASE + hour`` (each a second apart), with auditIDs of their
    own."""
    moved = []
    for index, line in enumerate(lines):
        event = orjson.loads(line)
        when = BASE + timedelta(hours=hour, seconds=index)
        text = when.isoformat().replace("+00:00", "Z")
        event.update(auditID=f"{event['auditID']}-{tag}", requestReceivedTimestamp=text,
                     stageTimestamp=text)
        event.pop("timestamp", None)
        moved.append(orjson.dumps(event))
    return moved


@pytest.fixture
def lines(fixtures_dir):
    return fixture_events(fixtures_dir / "audit" / "openshift-requestresponse.log")


def _hours(stream) -> dict[int, int]:
    counts: dict[int, int] = {}
    for received in store.events(stream).values_list("received", flat=True):
        hour = int((received - BASE).total_seconds() // 3600)
        counts[hour] = counts.get(hour, 0) + 1
    return counts


def _table_rows(stream, slot) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {store.slot_table(stream.pk, slot)}")
        return cursor.fetchone()[0]


def test_a_later_hour_takes_its_slot_whole_and_older_events_are_counted_not_stored(
        stream_of, post_batch, lines):
    stream, token = stream_of(retention_hours=2)  # 3 slots
    per_hour = len(lines)
    for hour in (0, 1, 2):
        assert post_batch(stream.pk, event_list(_at(lines, hour, f"h{hour}")), token).json()[
            "new"] == per_hour
    assert _hours(stream) == {0: per_hour, 1: per_hour, 2: per_hour}
    slot = store.slot_of(BASE, stream.slots)
    assert _table_rows(stream, slot) == per_hour  # hour 0 is in its slot's own table
    answer = post_batch(stream.pk, event_list(_at(lines, 3, "h3")), token).json()
    assert answer["new"] == per_hour
    assert _hours(stream) == {1: per_hour, 2: per_hour, 3: per_hour}
    assert _table_rows(stream, slot) == per_hour  # hour 3 replaced hour 0 there
    late = post_batch(stream.pk, event_list(_at(lines, 0, "late")), token).json()
    assert late == {"events": per_hour, "new": 0, "too_old": per_hour}
    assert _hours(stream) == {1: per_hour, 2: per_hour, 3: per_hour}
    segment = stream.segments.get(slot=slot)
    assert BodyChunk.objects.filter(incident_id=segment.incident_id).exists()


def test_retention_by_age_and_size_empties_whole_slots(stream_of, post_batch, lines):
    stream, token = stream_of(retention_hours=3)  # 4 slots
    per_hour = len(lines)
    for hour in (0, 1, 2, 3):
        assert post_batch(stream.pk, event_list(_at(lines, hour, f"h{hour}")), token).status_code \
            == 200
    assert apply_stream_retention() == 0  # hour 0 ends 3 hours before hour 3 ends: kept
    stream.retention_hours = 2
    stream.save()
    assert store.apply_retention(stream) == [store.slot_of(BASE, stream.slots)]
    assert _hours(stream) == {1: per_hour, 2: per_hour, 3: per_hour}
    emptied = stream.segments.get(slot=store.slot_of(BASE, stream.slots))
    assert emptied.start is None
    assert not BodyChunk.objects.filter(incident_id=emptied.incident_id).exists()
    assert _table_rows(stream, emptied.slot) == 0
    stream.retention_gb = 1e-9  # less than any hour: only the newest is kept
    stream.save()
    assert len(store.apply_retention(stream)) == 2
    assert _hours(stream) == {3: per_hour}
