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
from benchlib import ROOT, reexec_in_venv, script_module  # noqa: E402

reexec_in_venv(__file__)

OUT_DIR = ROOT / "bench" / "out"
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
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--rate", type=float, default=500)
    parser.add_argument("--objects", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3, help="computations (default 3)")
    parser.add_argument("--reuse", action="store_true",
                        help="measure the incident built by the previous run, do not rebuild")
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL,
                        help="PostgreSQL database to DROP and recreate (its name must contain "
                             f"'bench'; default {DEFAULT_DATABASE_URL})")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "bench" / "figure"))  # its build.py
    ingest = script_module("bench_ingest", ROOT / "bench" / "ingest")
    figure = script_module("bench_figure", ROOT / "bench" / "figure" / "__main__.py")
    ingest._bench_database(args.database_url)  # refuses a database not named *bench*
    figure.setup_django(args.database_url, "", OUT_DIR / "insights-columns")

    results: dict = {"data": "synthetic: the figure benchmark's incident (fixture requests "
                             "cloned with new auditIDs, times, names)",
                     "events": args.events, "seed": args.seed}
    if args.reuse:
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        incident_id = figure.existing_incident(args.events)
        print(f"reusing incident {incident_id} of {args.database_url}", flush=True)
    else:
        print(f"building {args.events:,} synthetic events in {args.database_url} …", flush=True)
        results["build"] = figure.build_incident(ingest, args)
        incident_id = results["build"]["incident"]
    print(f"computing the insights, {args.runs} runs …", flush=True)
    results["compute"] = compute(incident_id, args.runs)
    results["answer"] = answer(incident_id, 7)
    results["machine"] = {**ingest.machine(),
                          "postgresql": ingest.postgres_version(args.database_url),
                          "load_average_end": [round(v, 2) for v in os.getloadavg()]}
    results["code"] = ingest.checkout()
    results["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / f"insights-{args.events}.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results  {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
