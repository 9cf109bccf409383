"""Insights benchmark: computing an incident's insights (``timelines.analysis.insights``) on a
1,000,000-event incident, step by step, and answering ``GET /api/v1/incidents/{id}/insights/``
once they are stored.

The incident is the figure benchmark's (``bench/figure/build.py``: SYNTHETIC clones of the 93
fixture requests with new auditIDs, times and names; 33 minutes at 500 requests/s), built into
a database of this benchmark's own (dropped and recreated; ``--reuse`` measures the one built
last time). Its clones hold about 100,000 deletes, as many re-creations of the same names,
conflicts and LISTs without resourceVersion: every step has rows to work on, and every cap
(``MAX_EVENTS``, ``MAX_GROUPS``, ``MAX_BODIES``) is reached. ``--runs`` computations, each
timed per step (``compute(timings=…)``), then the stored answer asked ``--runs`` times through
Django's test ``Client`` (middleware, authentication, DRF and the view; no network). Medians
and every run go to stdout and ``bench/out/insights-<N>.json``.

    .venv/bin/python bench/insights                 # build 1,000,000 events, measure
    .venv/bin/python bench/insights --reuse         # measure the incident built last time
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: benchlib
from benchlib import OUT_DIR, incident_arguments, reexec_in_venv, synthetic_incident, write_results  # noqa: E402

reexec_in_venv(__file__)

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/hindsight_insights_bench"
USERNAME = "bench"



def compute(incident_id: int, runs: int) -> dict:
    """``runs`` computations (the last one stored, as after an ingest), timed per step."""
    from timelines.analysis import insights

    totals, steps = [], {}
    found = []
    for run in range(runs):
        timings: dict[str, float] = {}
        load = os.getloadavg()[0]
        started = time.perf_counter()
        if run == runs - 1:
            row = insights.refresh(incident_id)
            found = row.insights
            seconds = time.perf_counter() - started
        else:
            found = insights.compute(incident_id, timings=timings)
            seconds = time.perf_counter() - started
        totals.append(seconds)
        for name, value in timings.items():
            steps.setdefault(name, []).append(value)
        print(f"  run {run + 1}: {seconds:.2f} s (load {load:.2f})"
              + ("  [stored]" if run == runs - 1 else ""), flush=True)
    medians = {name: round(statistics.median(values) * 1000, 1)
               for name, values in steps.items()}
    for name, ms in medians.items():
        print(f"    {name:38} {ms:>8.1f} ms", flush=True)
    kinds: dict[str, int] = {}
    for item in found:
        kinds[item["kind"]] = kinds.get(item["kind"], 0) + 1
    print(f"  {len(found)} insights: {kinds}", flush=True)
    return {"seconds_median": round(statistics.median(totals), 2),
            "seconds_runs": [round(v, 2) for v in totals], "steps_median_ms": medians,
            "insights": len(found), "by_kind": kinds,
            "json_bytes": len(json.dumps(found))}


def answer(incident_id: int, runs: int) -> dict:
    """The stored insights asked through the API, ``runs`` times."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    user = get_user_model().objects.filter(username=USERNAME).first() or \
        get_user_model().objects.create_superuser(USERNAME, "bench@example.com", None)
    client = Client(HTTP_HOST="localhost")  # one of the default ALLOWED_HOSTS
    client.force_login(user)
    url = f"/api/v1/incidents/{incident_id}/insights/"
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - started) * 1000)
        if response.status_code != 200:
            raise SystemExit(f"{url}: HTTP {response.status_code} {response.content[:300]!r}")
    median = statistics.median(times)
    print(f"  GET {url}: median {median:.1f} ms ({len(response.content):,} B)", flush=True)
    return {"ms_median": round(median, 1), "ms_runs": [round(v, 1) for v in times],
            "bytes": len(response.content)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    incident_arguments(parser, database_url=DEFAULT_DATABASE_URL, runs=3, runs_help="computations")
    args = parser.parse_args(argv)
    ingest, _, incident_id, results = synthetic_incident(args, OUT_DIR / "insights-columns")
    print(f"computing the insights, {args.runs} runs …", flush=True)
    results["compute"] = compute(incident_id, args.runs)
    results["answer"] = answer(incident_id, 7)
    write_results(results, f"insights-{args.events}", ingest, args.database_url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
