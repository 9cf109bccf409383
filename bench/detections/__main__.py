"""Detections benchmark: the 48 default Falco rules (k8saudit 0.18.0) evaluated over a
1,000,000-event incident (``timelines.detections.incident.evaluate``), then the whole
detection step (matches stored for the ``detection=`` filter, insights made).

The incident is the figure benchmark's (``bench/figure/build.py``): SYNTHETIC clones of the 93
fixture requests (audit2rbac's demo, OpenShift's RequestResponse sample and Falco's own
traces: pod, configmap, secret, RBAC creations, exec…) with new auditIDs, times and names, so
that the Falco traces' requests recur all through it. Built into a database of this
benchmark's own (dropped and recreated; ``--reuse`` measures the one built last time).
``--runs`` evaluations, each timed; medians and every run go to stdout and
``bench/out/detections-<N>.json``.

    .venv/bin/python bench/detections                 # build 1,000,000 events, measure
    .venv/bin/python bench/detections --reuse         # measure the incident built last time
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: benchlib
from benchlib import OUT_DIR, incident_arguments, reexec_in_venv, synthetic_incident, write_results  # noqa: E402

reexec_in_venv(__file__)

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/hindsight_detections_bench"


def column_index(incident_id: int) -> float | None:
    """Build the incident's column index if it has none, as the worker does once uploads
    finish (before the insights); the seconds it took (not the detections'), or None."""
    from timelines.detections import incident
    from timelines.store import columns
    from timelines.store.aggregate import data_version

    if incident._index_of(incident_id) is not None:
        return None
    started = time.perf_counter()
    columns.build(incident_id, data_version(incident_id))
    return round(time.perf_counter() - started, 2)


def measure(incident_id: int, runs: int) -> dict:
    from timelines.detections import incident, rules

    started = time.perf_counter()
    ruleset = rules.load(rules.default_files())
    load_ms = (time.perf_counter() - started) * 1000
    print(f"  {len(ruleset.active)} rules loaded and compiled in {load_ms:.0f} ms", flush=True)
    times, found = [], None
    for run in range(runs):
        load = os.getloadavg()[0]
        started = time.perf_counter()
        found = incident.evaluate(incident_id, ruleset)
        seconds = time.perf_counter() - started
        times.append(seconds)
        print(f"  run {run + 1}: {seconds:.2f} s (load {load:.2f}), {found.groups:,} groups "
              f"({'column index' if found.from_index else 'GROUP BY'}), columns "
              f"{found.column_seconds:.2f} s, {found.bodies_read:,} bodies read in "
              f"{seconds - found.column_seconds:.2f} s", flush=True)
    matched = {name: len(ids) for name, ids in sorted(found.ids.items()) if ids}
    for name, count in matched.items():
        print(f"    {name:50} {count:>9,}", flush=True)
    stores = store_twice(incident_id, found)
    started = time.perf_counter()
    made = incident.detections(incident_id)
    step = time.perf_counter() - started
    print(f"  the whole step (evaluate, store matches, insights): {step:.2f} s, "
          f"{len(made)} insights", flush=True)
    return {"rules": len(ruleset.active), "compile_ms": round(load_ms, 1),
            "seconds_median": round(statistics.median(times), 2),
            "seconds_runs": [round(t, 2) for t in times], "groups": found.groups,
            "from_index": found.from_index, "column_seconds": round(found.column_seconds, 2),
            "bodies_read": found.bodies_read,
            "matched": matched,
            "store_seconds": stores, "step_seconds": round(step, 2), "insights": len(made)}


def store_twice(incident_id: int, found) -> dict:
    """Storing the matches where none are (the first insights of an incident), then the same
    matches again (the insights of its next upload find nearly all of them again)."""
    from django.db import connection
    from timelines.detections.incident import Matches, store_matches
    from timelines.detections.models import DetectionMatch

    store_matches(incident_id, Matches())
    with connection.cursor() as cursor:  # the rows just deleted, gone for good
        cursor.execute(f"VACUUM {DetectionMatch._meta.db_table}")
    seconds = {}
    for name in ("first", "again"):
        started = time.perf_counter()
        store_matches(incident_id, found)
        seconds[name] = round(time.perf_counter() - started, 2)
    count = sum(len(ids) for ids in found.ids.values())
    print(f"  storing {count:,} matches: {seconds['first']:.2f} s where none were, "
          f"{seconds['again']:.2f} s again", flush=True)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    incident_arguments(parser, database_url=DEFAULT_DATABASE_URL, runs=3,
                       runs_help="evaluations")
    args = parser.parse_args(argv)
    ingest, _, incident_id, results = synthetic_incident(args, OUT_DIR / "detections-columns")
    results["column_index_seconds"] = column_index(incident_id)
    print(f"evaluating the default rules, {args.runs} runs …", flush=True)
    results["detections"] = measure(incident_id, args.runs)
    write_results(results, f"detections-{args.events}", ingest, args.database_url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
