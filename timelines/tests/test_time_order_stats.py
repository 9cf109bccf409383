"""After an ingest the partitioned ``timelines_event`` has statistics of ``received`` of its own
(``store.analyze_time_order``, run by ``tasks.finish_incident``): autovacuum never analyzes a
partitioned table, and without them the planner misjudges the first page of a large incident
(``bench/scale``: 122 ms, parallel workers, instead of 0.6 ms at 10M events)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from hindsight.testing import write_audit_log
from timelines.models import Event
from timelines.tasks import finish_incident


def _inherited_received_stats() -> list[tuple[float]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT n_distinct FROM pg_stats WHERE tablename = 'timelines_event'"
                       " AND attname = 'received' AND inherited")
        return cursor.fetchall()


@pytest.mark.django_db
def test_finish_incident_gives_the_partitioned_table_time_order_statistics(
        incident, ingest_file, tmp_path):
    path = tmp_path / "kube-apiserver-audit.log"
    write_audit_log(path, datetime(2025, 1, 1, tzinfo=UTC),
                    [timedelta(milliseconds=7 * n) for n in range(2_000)])
    assert ingest_file(incident, path).status == "done"
    times = Event.objects.filter(incident=incident).values_list("received", flat=True)
    assert len(set(times)) == len(times) == 2_000
    with connection.cursor() as cursor:  # as autovacuum leaves it (rolled back with the test)
        cursor.execute("DELETE FROM pg_statistic WHERE stainherit"
                       " AND starelid = 'timelines_event'::regclass")
    assert _inherited_received_stats() == []

    finish_incident(incident.pk, cache_figures=False)

    # Every received time differs, so the estimate is "all distinct": -1, a fraction of the rows
    # (not a count), which stays right as the table grows.
    assert _inherited_received_stats() == [(-1.0,)]
