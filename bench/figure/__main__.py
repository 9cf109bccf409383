"""Figure benchmark: the timeline figure of a 1,000,000-event incident, on the server and in the
browser.

The incident is SYNTHETIC (see ``build.py``): clones of the 93 fixture requests that
``bench/ingest`` uses, written through the store's own COPY path into a freshly recreated
PostgreSQL database, then ``VACUUM ANALYZE``d (as autovacuum does after a large insert). Then:

0. **The column index** (``timelines/store/columns.py``) is built, as after an ingest, and timed
   (``--no-index``: not built, so PostgreSQL counts every cold heatmap).
1. **Server time** of ``GET /api/v1/incidents/{id}/figure/`` through Django's test ``Client``
   signed in as a superuser, asking for gzip as a browser does, in this process, for each view
   in ``VIEWS``: the unfiltered default, every lanes grouping, a zoomed window of at most
   20,000 events (found in the data), and user filters (a busy user: heatmap; a quiet one:
   Gantt). Each view is run ``--runs`` times *cold* (Django's cache emptied and the column
   index closed first, so the heatmap is counted again; PostgreSQL's own buffers stay warm) and
   ``--runs`` times *warm* (served from the figure cache where the view is cached at all; a
   Gantt never is). Medians, every run, the JSON's bytes and the bytes sent are reported.
2. **First paint** of the incident page in Debian Chromium (Playwright, SwiftShader WebGL)
   against ``manage.py runserver --noreload``: from navigation start to the first frame after the
   figure is drawn (``paint.py``), cold (figure cache emptied) and warm, a fresh browser context
   each time.

The machine's load average is recorded before each view: other work on the machine slows every
figure. Results go to stdout and ``bench/out/figure-<N>.json``.

    .venv/bin/python bench/figure                       # build 1,000,000 events, measure
    .venv/bin/python bench/figure --reuse               # measure the incident built last time
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: benchlib
from benchlib import ROOT, reexec_in_venv, script_module  # noqa: E402

reexec_in_venv(__file__)

OUT_DIR = ROOT / "bench" / "out"
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/hindsight_figure_bench"
DEFAULT_CACHE_URL = "redis://127.0.0.1:6379/13"
TITLE = "figure bench"
USERNAME = "bench"



def fixture_files(ingest) -> list[Path]:
    falco = sorted(p for p in ingest.FALCO_DIR.iterdir()
                   if p.is_file() and p.name not in ingest.FALCO_EXCLUDED)
    return [*ingest.FIXTURE_LOGS, *falco]


def setup_django(database_url: str, cache_url: str, columns_dir: Path) -> None:
    os.environ.update(DATABASE_URL=database_url, CACHE_URL=cache_url,
                      DJANGO_SETTINGS_MODULE="hindsight.settings",
                      HINDSIGHT_COLUMNS_DIR=str(columns_dir),  # the runserver's too
                      HINDSIGHT_API_RATE="off")  # a benchmark is not abuse
    os.environ.pop("CELERY_BROKER_URL", None)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def build_incident(ingest, args) -> dict:
    """Recreate the database, migrate, build the incident, VACUUM ANALYZE."""
    import build
    from django.core.management import call_command
    from django.db import connection

    ingest.reset_database(args.database_url)
    connection.close()
    call_command("migrate", verbosity=0)
    built = build.build(fixture_files(ingest), args.events, rate=args.rate,
                        objects=args.objects, seed=args.seed, title=TITLE)
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM (ANALYZE) timelines_event")
    vacuum = time.perf_counter() - started
    print(f"  built incident {built.incident_id}: {built.events} events, {built.objects} named "
          f"objects, {built.first:%H:%M:%S}–{built.last:%H:%M:%S} UTC, in {built.seconds:.1f} s "
          f"(+ VACUUM ANALYZE {vacuum:.1f} s)", flush=True)
    return {"incident": built.incident_id, "events": built.events, "seconds": built.seconds,
            "vacuum_seconds": vacuum, "objects": built.objects,
            "first": built.first.isoformat(), "last": built.last.isoformat()}


def build_column_index(incident_id: int) -> dict:
    """Build the incident's column index as ``warm_overview`` does after an ingest (timed)."""
    from timelines.store import aggregate, columns

    shutil.rmtree(columns.root() / str(incident_id), ignore_errors=True)
    started = time.perf_counter()
    columns.build(incident_id, aggregate.data_version(incident_id))
    seconds = time.perf_counter() - started
    size = columns.size_on_disk(incident_id)
    print(f"  column index built in {seconds:.1f} s, {size / 1e6:.1f} MB", flush=True)
    return {"seconds": round(seconds, 2), "bytes": size}


def existing_incident(events: int) -> int:
    from incidents.models import Incident
    from timelines.models import Event

    incident = Incident.objects.filter(title=TITLE).order_by("-pk").first()
    if incident is None or Event.objects.filter(incident=incident).count() != events:
        raise SystemExit(f"--reuse: no incident {TITLE!r} with {events} events; run without it")
    return incident.pk


def views(incident_id: int) -> list[tuple[str, dict[str, str]]]:
    """The views measured; the zoom window and the users are found in the data."""
    from django.db.models import Count
    from timelines.figures.build import MAX_SPANS
    from timelines.models import Event

    events = Event.objects.filter(incident_id=incident_id).order_by("received", "id")
    total = events.count()
    # a window of 90% of MAX_SPANS events from the middle of the incident
    start = events.values_list("received", flat=True)[total // 2]
    end = events.values_list("received", flat=True)[total // 2 + int(MAX_SPANS * 0.9) - 1]
    users = list(events.order_by().values("username").annotate(n=Count("pk")).order_by("-n"))
    busy = users[0]["username"]
    quiet = next(u["username"] for u in users if 1000 < u["n"] <= MAX_SPANS)
    window = {"since": start.isoformat().replace("+00:00", "Z"),
              "until": end.isoformat().replace("+00:00", "Z")}
    return [
        ("default (lanes=object)", {}),
        ("lanes=actor", {"lanes": "actor"}),
        ("lanes=user_agent", {"lanes": "user_agent"}),
        ("lanes=source", {"lanes": "source"}),
        ("zoomed window (lanes=object)", window),
        ("zoomed window, lanes=actor", {**window, "lanes": "actor"}),
        (f"user={busy}", {"user": busy}),
        (f"user={quiet}", {"user": quiet}),
    ]


def measure_server(incident_id: int, runs: int) -> list[dict]:
    from django.contrib.auth import get_user_model
    from django.core.cache import cache
    from django.test import Client
    from timelines.store import columns

    user = get_user_model().objects.filter(username=USERNAME).first() or \
        get_user_model().objects.create_superuser(USERNAME, "bench@example.com", None)
    client = Client(HTTP_HOST="localhost")  # one of the default ALLOWED_HOSTS
    client.force_login(user)
    url = f"/api/v1/incidents/{incident_id}/figure/"

    def timed(query):
        # as a browser asks: large answers come gzipped, and compressing them is server time
        started = time.perf_counter()
        answer = client.get(url, query, HTTP_ACCEPT_ENCODING="gzip, deflate, br")
        seconds = time.perf_counter() - started
        if answer.status_code != 200:
            raise SystemExit(f"{url} {query}: HTTP {answer.status_code} {answer.content[:300]!r}")
        return seconds * 1000, answer

    results = []
    for name, query in views(incident_id):
        load = os.getloadavg()[0]
        cold = []
        for _ in range(runs):
            cache.clear()
            columns.forget()  # and the index is mapped again, as in a new web process
            ms, answer = timed(query)
            cold.append(ms)
        warm = [timed(query)[0] for _ in range(runs)]
        body = answer.content
        if answer.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        meta = json.loads(body)["meta"]
        row = {"view": name, "query": query, "mode": meta["mode"], "total": meta["total"],
               "spans": meta["spans"], "lanes": meta["lanes"],
               "lanes_shown": meta.get("lanes_shown"), "json_bytes": len(body),
               "bytes": len(answer.content),  # on the wire
               "cold_ms": round(statistics.median(cold), 1),
               "warm_ms": round(statistics.median(warm), 1),
               "cold_runs_ms": [round(v, 1) for v in cold],
               "warm_runs_ms": [round(v, 1) for v in warm], "load_before": round(load, 2)}
        results.append(row)
        print(f"  {name:38} {row['mode']:7} {row['total']:>9,} events  {row['json_bytes']:>10,} B "
              f"({row['bytes']:>9,} B sent)  "
              f"cold {row['cold_ms']:>7.1f} ms  warm {row['warm_ms']:>7.1f} ms  "
              f"(load {load:.2f})", flush=True)
    return results


def measure_paint(incident_id: int, runs: int, database_url: str, cache_url: str) -> dict:
    import paint
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.cache import cache
    from django.test import Client

    client = Client(HTTP_HOST="localhost")  # one of the default ALLOWED_HOSTS
    client.force_login(get_user_model().objects.get(username=USERNAME))
    session = (settings.SESSION_COOKIE_NAME, client.cookies[settings.SESSION_COOKIE_NAME].value)
    env = {**os.environ, "DATABASE_URL": database_url, "CACHE_URL": cache_url,
           "HINDSIGHT_API_RATE": "off"}
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = f"/incidents/{incident_id}/"
    with paint.running_server(ROOT, env, OUT_DIR / "figure-runserver.log") as url:
        load = os.getloadavg()[0]
        cold = paint.first_paints(url, path, session, runs, cache.clear,
                                  OUT_DIR / "figure-first-paint.png")
        warm = paint.first_paints(url, path, session, runs, lambda: None)
    for label, loads in (("cold", cold), ("warm", warm)):
        middle = statistics.median(r["first_paint_ms"] for r in loads)
        print(f"  first paint {label:4}  median {middle:,.0f} ms  "
              f"runs {[r['first_paint_ms'] for r in loads]}  (load {load:.2f})", flush=True)
    return {"path": path, "load_before": round(load, 2),
            "cold_ms": statistics.median(r["first_paint_ms"] for r in cold),
            "warm_ms": statistics.median(r["first_paint_ms"] for r in warm),
            "cold_runs": cold, "warm_runs": warm}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000,
                        help="requests in the incident (default 1000000)")
    parser.add_argument("--rate", type=float, default=500,
                        help="requests per second of the synthetic incident (default 500: "
                             "1M events span 33 minutes)")
    parser.add_argument("--objects", type=int, default=300,
                        help="names per named fixture object (default 300)")
    parser.add_argument("--runs", type=int, default=5, help="runs per measurement (default 5)")
    parser.add_argument("--reuse", action="store_true",
                        help="measure the incident built by the previous run, do not rebuild")
    parser.add_argument("--skip-browser", action="store_true", help="no first-paint runs")
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL,
                        help="PostgreSQL database to DROP and recreate (its name must contain "
                             f"'bench'; default {DEFAULT_DATABASE_URL})")
    parser.add_argument("--cache-url", default=DEFAULT_CACHE_URL,
                        help="Redis database of the figure cache, FLUSHED before each cold run "
                             f"(default {DEFAULT_CACHE_URL})")
    parser.add_argument("--seed", type=int, default=1, help="seed of the synthetic data")
    parser.add_argument("--no-index", action="store_true",
                        help="no column index: every cold heatmap is counted by PostgreSQL")
    args = parser.parse_args(argv)
    ingest = script_module("bench_ingest", ROOT / "bench" / "ingest")
    ingest._bench_database(args.database_url)  # refuses a database not named *bench*
    columns_dir = OUT_DIR / "figure-columns"
    shutil.rmtree(columns_dir, ignore_errors=True)
    setup_django(args.database_url, args.cache_url, columns_dir)

    results: dict = {"data": "synthetic: fixture requests cloned with new auditIDs, times, "
                             "names; written through timelines.ingest.store",
                     "events": args.events, "rate": args.rate, "seed": args.seed}
    if args.reuse:
        incident_id = existing_incident(args.events)
        print(f"reusing incident {incident_id} of {args.database_url}", flush=True)
    else:
        print(f"building {args.events:,} synthetic events in {args.database_url} …", flush=True)
        results["build"] = build_incident(ingest, args)
        incident_id = results["build"]["incident"]
    results["column_index"] = None if args.no_index else build_column_index(incident_id)
    print(f"server time, median of {args.runs} (cold: figure cache emptied first) …", flush=True)
    results["server"] = measure_server(incident_id, args.runs)
    if not args.skip_browser:
        print(f"first paint in Chromium, median of {args.runs} …", flush=True)
        results["first_paint"] = measure_paint(incident_id, args.runs, args.database_url,
                                               args.cache_url)
    results["machine"] = {**ingest.machine(),
                          "postgresql": ingest.postgres_version(args.database_url),
                          "load_average_end": [round(v, 2) for v in os.getloadavg()]}
    results["code"] = ingest.checkout()
    results["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / f"figure-{args.events}.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results  {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
