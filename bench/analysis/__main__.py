"""Analysis benchmark: request time statistics (``/api/v1/incidents/{id}/stats/`` for every
``by``, ``…/stats/inflight/``) and the other analysis endpoints (``insights``, ``pods``) on a
1,000,000-event incident, answered from the column index and by PostgreSQL.

The incident is the figure benchmark's (``bench/figure/build.py``: SYNTHETIC clones of the 93
fixture requests, 33 minutes at 500 requests/s, log-normal latencies of median 3 ms, 0.05%
never completed), built into a database of this benchmark's own (dropped and recreated;
``--reuse`` measures the one built last time). Each query of ``queries`` is asked through
Django's test ``Client`` signed in as a superuser (middleware, authentication, DRF and the
view included; no network), ``--runs`` times:

- **index**: with the incident's column index (built first, as after an ingest, and timed);
- **database**: with no index (an empty index folder), so PostgreSQL answers;

every run *cold*: Django's cache (in-process) emptied and the index closed first (PostgreSQL's
buffers and the page cache stay warm). Then ``--runs`` *warm* runs (the cached answer).
An endpoint that is not built yet (HTTP 501) is reported as such, so the script can be run
again as the analysis grows. Medians and every run go to stdout and
``bench/out/analysis-<N>.json``.

    .venv/bin/python bench/analysis                 # build 1,000,000 events, measure
    .venv/bin/python bench/analysis --reuse         # measure the incident built last time
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

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/hindsight_analysis_bench"
USERNAME = "bench"
BY = ("user", "user_agent", "verb", "resource", "namespace", "code")
# endpoints (under /api/v1/incidents/{id}/) measured as they are, whoever builds them
OTHER_ENDPOINTS = ("insights", "pods")
WINDOW = 18_000  # events in the zoomed window (a quarter of them in a smaller incident)



def queries(incident_id: int) -> list[tuple[str, str, dict]]:
    """(endpoint, label, query): stats by every field, filtered by the busiest user and by a
    window of 18,000 events, in flight by user, and the other analysis endpoints."""
    from django.db.models import Count
    from timelines.models import Event

    events = Event.objects.filter(incident_id=incident_id).order_by("received", "id")
    total = events.count()
    start = events.values_list("received", flat=True)[total // 2]
    end = events.values_list("received", flat=True)[total // 2 + min(WINDOW, total // 4) - 1]
    busy = events.order_by().values("username").annotate(n=Count("pk")).order_by("-n")[0]
    window = {"since": start.isoformat().replace("+00:00", "Z"),
              "until": end.isoformat().replace("+00:00", "Z")}
    return [
        *[("stats", f"by={by}", {"by": by}) for by in BY],
        ("stats", f"by=verb&user={busy['username']}", {"by": "verb", "user": busy["username"]}),
        ("stats", "by=user, 18,000-event window", {**window, "by": "user"}),
        ("stats/inflight", "by=user", {"by": "user"}),
        ("stats/inflight", "by=verb, 18,000-event window", {**window, "by": "verb"}),
        *[(endpoint, "unfiltered", {}) for endpoint in OTHER_ENDPOINTS],
    ]


def _size(body) -> str:
    if isinstance(body, dict):
        if "results" in body:
            return f"{body.get('requests', '?'):,} requests, {len(body['results'])} rows" \
                if isinstance(body.get("requests"), int) else f"{len(body['results'])} rows"
        if "series" in body:
            return f"{len(body['series'])} series × {body.get('bins')} bins"
    if isinstance(body, list):
        return f"{len(body)} rows"
    return ""


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
        settings.COLUMNS_DIR = OUT_DIR / "analysis-no-columns"  # empty: PostgreSQL answers
        shutil.rmtree(settings.COLUMNS_DIR, ignore_errors=True)

    cpu: list[float] = []  # this process's CPU time of each timed call (not PostgreSQL's)

    def timed(url, query):
        started, used = time.perf_counter(), time.process_time()
        answer = client.get(url, query)
        cpu.append((time.process_time() - used) * 1000)
        return (time.perf_counter() - started) * 1000, answer

    results = []
    try:
        for endpoint, label, query in queries(incident_id):
            url = f"/api/v1/incidents/{incident_id}/{endpoint}/"
            load = os.getloadavg()[0]
            counted_by = "index" if index else "database"
            ms, answer = timed(url, query)
            if answer.status_code != 200:
                row = {"endpoint": endpoint, "query": label, "counted_by": counted_by,
                       "status": answer.status_code,
                       "note": "501 / not built" if answer.status_code == 501
                       else answer.content[:300].decode(errors="replace")}
                results.append(row)
                print(f"  {counted_by:8} {endpoint:15} {label:38} HTTP {answer.status_code}: "
                      f"{row['note']}", flush=True)
                continue
            # runs that recount from scratch: fewer when one takes seconds (the database's
            # in-flight read, row by row)
            cold, cold_cpu = [], []
            for _ in range(runs if ms < 3000 else min(runs, 3)):
                cache.clear()
                columns.forget()  # the index is mapped again, as in a new web process
                cold.append(timed(url, query)[0])
                cold_cpu.append(cpu[-1])
            warm = [timed(url, query)[0] for _ in range(runs)]
            _, answer = timed(url, query)
            body = answer.json()
            row = {"endpoint": endpoint, "query": label, "params": query,
                   "counted_by": counted_by, "status": 200, "answer": _size(body),
                   # the first ask: insights are computed then, and stored
                   "first_ms": round(ms, 1),
                   "bytes": len(answer.content),
                   "cold_ms": round(statistics.median(cold), 1),
                   "warm_ms": round(statistics.median(warm), 1),
                   # on 2 cores shared with other work, the wall time is the load's as much
                   # as ours: the CPU time this process spent says what the answer costs
                   "cold_cpu_ms": round(statistics.median(cold_cpu), 1),
                   "cold_runs_ms": [round(v, 1) for v in cold],
                   "warm_runs_ms": [round(v, 1) for v in warm], "load_before": round(load, 2)}
            results.append(row)
            print(f"  {counted_by:8} {endpoint:15} {label:38} {row['answer']:>30}  "
                  f"cold {row['cold_ms']:>8.1f} ms (cpu {row['cold_cpu_ms']:>6.1f})  "
                  f"warm {row['warm_ms']:>5.1f} ms  "
                  f"(load {load:.2f})", flush=True)
    finally:
        settings.COLUMNS_DIR = served_by
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    incident_arguments(parser, database_url=DEFAULT_DATABASE_URL, runs=7,
                       runs_help="runs per measurement")
    parser.add_argument("--only", choices=("index", "database"),
                        help="measure one way of answering only")
    args = parser.parse_args(argv)
    ingest, figure, incident_id, results = synthetic_incident(args, OUT_DIR / "analysis-columns")
    results["column_index"] = figure.build_column_index(incident_id)
    print(f"cold (cache emptied, index closed), median of {args.runs} …", flush=True)
    results["server"] = []
    if args.only != "database":
        results["server"] += measure(incident_id, args.runs, index=True)
    if args.only != "index":
        results["server"] += measure(incident_id, args.runs, index=False)
    write_results(results, f"analysis-{args.events}", ingest, args.database_url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
