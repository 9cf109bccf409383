"""Findings benchmark: the insights of a real bundle of about 150,000 events (the shared
OpenShift must-gather: 165,553 events, of them 5,373 Kubernetes Events and 160,156 log lines),
step by step, the bundle findings (``timelines.analysis.findings``, ``states``) among them.

The bundle is ingested with ``manage.py ingest`` into a database of this benchmark's own
(dropped and recreated; ``--reuse`` measures the incident ingested last time). Then
``--runs`` computations of every insight (``insights.compute(timings=…)``): the total, the
findings' part and each step. Medians and every run go to stdout and
``bench/out/findings.json``.

    .venv/bin/python bench/findings                 # ingest the must-gather, measure
    .venv/bin/python bench/findings --reuse         # measure the incident ingested last time
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: benchlib
from benchlib import OUT_DIR, ROOT, reexec_in_venv, script_module, write_results  # noqa: E402

reexec_in_venv(__file__)

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/hindsight_findings_bench"
BUNDLE = ROOT.parent / "shared" / "fixtures" / "bundles" / "openshift-must-gather-aws.tar.xz"
TITLE = "bench: openshift-must-gather-aws"
# the steps of ``findings.steps``: everything the bundle findings cost
FINDING_STEPS = ("findings: Warning Events", "log-errors", "findings: state", "repeated-event",
                 "warning-burst")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, default=BUNDLE)
    parser.add_argument("--runs", type=int, default=5, help="computations (default 5)")
    parser.add_argument("--reuse", action="store_true",
                        help="measure the incident ingested by the previous run")
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL,
                        help="PostgreSQL database to DROP and recreate (its name must contain "
                             f"'bench'; default {DEFAULT_DATABASE_URL})")
    args = parser.parse_args(argv)
    ingest = script_module("bench_ingest", ROOT / "bench" / "ingest")
    figure = script_module("bench_figure", ROOT / "bench" / "figure" / "__main__.py")
    ingest._bench_database(args.database_url)  # refuses a database not named *bench*
    columns = OUT_DIR / "findings-columns"
    os.environ["HINDSIGHT_DATA_DIR"] = str(OUT_DIR / "findings-data")
    figure.setup_django(args.database_url, "", columns)
    from django.core.management import call_command
    from django.db import connection
    from incidents.models import Incident
    from timelines.analysis import insights
    from timelines.models import Event

    results: dict = {"data": f"real: {args.bundle.name}"}
    if not args.reuse:
        ingest.reset_database(args.database_url)
        connection.close()
        call_command("migrate", verbosity=0)
        started = time.perf_counter()
        call_command("ingest", str(args.bundle), incident=TITLE, stdout=open(os.devnull, "w"))
        results["ingest_s"] = round(time.perf_counter() - started, 1)
        print(f"ingested {args.bundle.name} in {results['ingest_s']} s", flush=True)
    else:
        call_command("migrate", verbosity=0)
    incident_id = Incident.objects.filter(title=TITLE).order_by("-pk").values_list(
        "pk", flat=True).first()
    if incident_id is None:
        raise SystemExit("no incident to reuse: run without --reuse first")
    results["events"] = Event.objects.filter(incident_id=incident_id).count()
    print(f"incident {incident_id}: {results['events']:,} events; {args.runs} runs …", flush=True)
    totals, bundle, steps = [], [], {}
    found: list[dict] = []
    for run in range(args.runs):
        timings: dict[str, float] = {}
        load = os.getloadavg()[0]
        started = time.perf_counter()
        found = insights.compute(incident_id, timings=timings)
        totals.append(time.perf_counter() - started)
        bundle.append(sum(timings.get(name, 0.0) for name in FINDING_STEPS))
        for name, value in timings.items():
            steps.setdefault(name, []).append(value)
        print(f"  run {run + 1}: {totals[-1]:.2f} s in all, findings {bundle[-1]:.2f} s "
              f"(load {load:.2f})", flush=True)
    medians = {name: round(statistics.median(v) * 1000, 1) for name, v in steps.items()}
    for name, ms in medians.items():
        print(f"    {name:38} {ms:>8.1f} ms", flush=True)
    kinds: dict[str, int] = {}
    for item in found:
        kinds[item["kind"]] = kinds.get(item["kind"], 0) + 1
    print(f"  {len(found)} insights: {kinds}", flush=True)
    results.update({"seconds_median": round(statistics.median(totals), 2),
                    "seconds_runs": [round(v, 2) for v in totals],
                    "findings_seconds_median": round(statistics.median(bundle), 2),
                    "steps_median_ms": medians, "insights": len(found), "by_kind": kinds})
    write_results(results, "findings", ingest, args.database_url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
