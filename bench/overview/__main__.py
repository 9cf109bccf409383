"""Overview benchmark: the incident page's first view (``/api/v1/incidents/{id}/overview/`` and
``/facets/``) on a 1,000,000-event incident, counted from the column index and by PostgreSQL.

The incident is the figure benchmark's (``bench/figure/build.py``: SYNTHETIC clones of the 93
fixture requests, 33 minutes at 500 requests/s), built into a database of this benchmark's own
(dropped and recreated; ``--reuse`` measures the one built last time). Then each query in
``QUERIES`` is asked through Django's test ``Client`` signed in as a superuser (middleware,
authentication, DRF and the view included; no network), ``--runs`` times each:

- **index**: with the incident's column index (built first, as after an ingest, and timed);
- **database**: with no index (an empty index folder), so PostgreSQL counts;

every run *cold*: Django's cache (in-process here) emptied and the index closed first, so the
answer is counted again, from the index mapped anew or by PostgreSQL (its buffers and the page
cache stay warm). Then ``--runs`` *warm* runs (the cached answer). Medians and every run go to
stdout and ``bench/out/overview-<N>.json``.

    .venv/bin/python bench/overview                 # build 1,000,000 events, measure
    .venv/bin/python bench/overview --reuse         # measure the incident built last time
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: benchlib
from benchlib import OUT_DIR, incident_arguments, reexec_in_venv, synthetic_incident, write_results  # noqa: E402

reexec_in_venv(__file__)

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/hindsight_overview_bench"
USERNAME = "bench"



def queries(incident_id: int) -> list[tuple[str, str, dict[str, str]]]:
    """(endpoint, label, query): the page's first requests, unfiltered and filtered; the busy
    user, a window of 18,000 events and a part of object names are found in the data."""
    from django.db.models import Count
    from timelines.models import Event

    events = Event.objects.filter(incident_id=incident_id).order_by("received", "id")
    total = events.count()
    start = events.values_list("received", flat=True)[total // 2]
    # 18,000 events (a quarter of a smaller incident's, so that a try-out with --events runs)
    end = events.values_list("received", flat=True)[total // 2 + min(18_000, total // 4) - 1]
    busy = events.order_by().values("username").annotate(n=Count("pk")).order_by("-n")[0]
    window = {"since": start.isoformat().replace("+00:00", "Z"),
              "until": end.isoformat().replace("+00:00", "Z")}
    return [
        ("overview", "unfiltered", {}),
        ("overview", f"user={busy['username']}", {"user": busy["username"]}),
        ("overview", "18,000-event window, verb=get&verb=list",
         {**window, "verb": ["get", "list"]}),
        ("facets", "field=user_agent", {"field": "user_agent"}),
        ("facets", "field=name&contains=-1 (of 6,300 names)",
         {"field": "name", "contains": "-1", "limit": "50"}),
        ("facets", f"field=verb&user={busy['username']}",
         {"field": "verb", "user": busy["username"]}),
        ("facets", "field=code, 18,000-event window", {**window, "field": "code"}),
    ]


def measure(incident_id: int, runs: int, index: bool) -> list[dict]:
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.cache import cache
    from django.test import Client
    from timelines.store import columns

    user = get_user_model().objects.filter(username=USERNAME).first() or \
        get_user_model().objects.create_superuser(USERNAME, "bench@example.com", None)
    client = Client(HTTP_HOST="localhost")  # one of the default ALLOWED_HOSTS
    client.force_login(user)
    served_by = columns.root()
    if not index:
        settings.COLUMNS_DIR = OUT_DIR / "overview-no-columns"  # empty: PostgreSQL counts
        shutil.rmtree(settings.COLUMNS_DIR, ignore_errors=True)

    def timed(url, query):
        started = time.perf_counter()
        answer = client.get(url, query)
        seconds = time.perf_counter() - started
        if answer.status_code != 200:
            raise SystemExit(f"{url} {query}: HTTP {answer.status_code} {answer.content[:300]!r}")
        return seconds * 1000, answer

    results = []
    try:
        for endpoint, label, query in queries(incident_id):
            url = f"/api/v1/incidents/{incident_id}/{endpoint}/"
            load = os.getloadavg()[0]
            cold = []
            for _ in range(runs):
                cache.clear()
                columns.forget()  # the index is mapped again, as in a new web process
                ms, answer = timed(url, query)
                cold.append(ms)
            warm = [timed(url, query)[0] for _ in range(runs)]
            body = answer.json()
            row = {"endpoint": endpoint, "query": label, "params": query,
                   "counted_by": "index" if index else "database",
                   "total": body["total"], "bytes": len(answer.content),
                   "cold_ms": round(statistics.median(cold), 1),
                   "warm_ms": round(statistics.median(warm), 1),
                   "cold_runs_ms": [round(v, 1) for v in cold],
                   "warm_runs_ms": [round(v, 1) for v in warm], "load_before": round(load, 2)}
            if endpoint == "overview":
                row["window"] = body["window"]
            results.append(row)
            print(f"  {row['counted_by']:8} {endpoint:8} {label:42} {row['total']:>9,} events "
                  f"{row['bytes']:>7,} B  cold {row['cold_ms']:>7.1f} ms  "
                  f"warm {row['warm_ms']:>5.1f} ms  (load {load:.2f})", flush=True)
    finally:
        settings.COLUMNS_DIR = served_by
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    incident_arguments(parser, database_url=DEFAULT_DATABASE_URL, runs=7,
                       runs_help="runs per measurement")
    args = parser.parse_args(argv)
    ingest, figure, incident_id, results = synthetic_incident(args, OUT_DIR / "overview-columns")
    results["column_index"] = figure.build_column_index(incident_id)
    print(f"cold (cache emptied, index closed), median of {args.runs} …", flush=True)
    results["server"] = measure(incident_id, args.runs, index=True)
    results["server"] += measure(incident_id, args.runs, index=False)
    write_results(results, f"overview-{args.events}", ingest, args.database_url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
