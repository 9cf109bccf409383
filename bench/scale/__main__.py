"""Scale benchmark: an incident of 10,000,000 requests, from ``manage.py ingest`` to its deletion.

The input is SYNTHETIC: ``bench/ingest``'s clones of the 93 fixture requests (new auditIDs and
timestamps, three apiservers' files, 3,000 requests/s; see bench/README.md), generated in chunks
of ``--chunk`` requests that continue one timeline, each chunk's three files gzipped (``gzip -1``)
and the plain files removed, so that 10M requests take ~1.5 GB of disk instead of ~19 GB. Then,
in a database of its own (dropped and recreated; dropped again at the end unless ``--keep``):

1. **ingest**: ``manage.py ingest <all the .gz files> --incident bench --json`` (bulk load into
   the incident's own partition, indexes, ANALYZE, the column index), timed until the process
   exits, with its peak memory (PSS of the process tree, ``bench/ingest``'s sampler); checked
   event for event (``bench/ingest``'s ``verify``). The .gz files are deleted afterwards.
   ``VACUUM (ANALYZE)`` of the partition follows (timed apart), as autovacuum would after such an
   insert; index-only scans need its visibility map.
2. **the API**, through Django's test ``Client`` signed in as a superuser (middleware,
   authentication, DRF and the view; no network), ``--runs`` times each (fewer when one run takes
   over a second), p50 and p95:

   - the events list (``/events/``, first page of 100) with each filter kind, for a common and a
     rare value found in the data: user, verb, resource, namespace, name, code, a since/until
     window, q text, group, and a combination;
   - facets and overview, each run cold (the cache emptied, the column index closed);
   - the figure, the incident page's first view: cold (cache emptied, index closed) and cached.
3. **deleting the incident**: ``bench/delete``'s ``DELETE`` request and the purge it queues.

Figures, with the load average at each step, go to stdout and ``bench/out/scale-<N>.json``.

    .venv/bin/python bench/scale --requests 200000      # try it
    nohup .venv/bin/python bench/scale > bench/out/scale.log 2>&1 &     # 10,000,000
"""

from __future__ import annotations

import argparse
import calendar
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: benchlib
from benchlib import ROOT, reexec_in_venv, script_module  # noqa: E402

reexec_in_venv(__file__)

OUT_DIR = ROOT / "bench" / "out"
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/hindsight_scale_bench"
TITLE = "scale bench"
P95_TARGET_MS = 50.0



overview = script_module("bench_overview", ROOT / "bench" / "overview" / "__main__.py")
ingest = script_module("bench_ingest", ROOT / "bench" / "ingest")
figure = script_module("bench_figure", ROOT / "bench" / "figure" / "__main__.py")
delete = script_module("bench_delete", ROOT / "bench" / "delete")


def load() -> float:
    return round(os.getloadavg()[0], 2)


# --- 1. the input and the ingest ---------------------------------------------------------------

def generate(requests: int, chunk: int, directory: Path, seed: int):
    """``bench/ingest``'s generator, chunk by chunk on one timeline, each file gzipped while the
    next chunk is generated. Returns (.gz files, an ``ingest.Generated`` of the whole)."""
    started = time.perf_counter()
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    start = calendar.timegm(time.strptime(ingest.START, "%Y-%m-%dT%H:%M:%SZ"))
    files: list[Path] = []
    usernames: Counter[str] = Counter()
    written = sources = 0
    zipping: list[subprocess.Popen] = []
    for number, first in enumerate(range(0, requests, chunk)):
        size = min(chunk, requests - first)
        # Each chunk starts where the previous one ended (its Poisson arrivals span size/rate
        # seconds; a few seconds more keep the chunks from overlapping).
        ingest.START = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start))
        start += math.ceil(size / ingest.ARRIVALS_PER_SECOND) + 5
        part = directory / f"chunk-{number:03}"
        made = ingest.generate(size, part, seed + number)
        usernames.update(made.usernames)
        written += made.bytes
        sources = made.sources
        for process in zipping:  # at most one chunk's files wait on disk
            if process.wait() != 0:
                raise SystemExit(f"gzip failed: {process.args}")
        zipping = []
        for plain in made.files:
            gz = directory / f"{plain.stem}-{number:03}.log.gz"
            with gz.open("wb") as out:
                # gzip deletes nothing itself; the chunk's directory goes once it is compressed
                zipping.append(subprocess.Popen(["gzip", "-1", "-c", str(plain)], stdout=out))
            files.append(gz)
        print(f"  chunk {number}: {size:,} requests, {made.bytes / 1e6:,.0f} MB "
              f"(load {load()})", flush=True)
        for process in zipping:
            if process.wait() != 0:
                raise SystemExit(f"gzip failed: {process.args}")
        zipping = []
        shutil.rmtree(part)
    generated = ingest.Generated(directory, files, requests, 2 * requests, written,
                                 time.perf_counter() - started, sources, usernames)
    return files, generated


def vacuum(incident_id: int) -> float:
    from django.db import connection

    partition = f"timelines_event_{int(incident_id)}"
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [partition])
        table = partition if cursor.fetchone()[0] else "timelines_event"
        started = time.perf_counter()
        cursor.execute(f"VACUUM (ANALYZE) {table}")
    return time.perf_counter() - started


def database_size(database_url: str) -> dict[str, float]:
    import psycopg

    with psycopg.connect(**ingest._connect_kwargs(database_url)) as conn:
        database = conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]
        events = conn.execute("SELECT coalesce(sum(pg_total_relation_size(inhrelid)), 0) FROM "
                              "pg_inherits WHERE inhparent = 'timelines_event'::regclass"
                              ).fetchone()[0]
        events = int(events)
        chunks = conn.execute("SELECT pg_total_relation_size('timelines_bodychunk')").fetchone()[0]
    return {"database_gb": round(database / 1e9, 2), "events_gb": round(events / 1e9, 2),
            "body_chunks_gb": round(chunks / 1e9, 2)}


def column_index(incident_id: int) -> dict[str, Any]:
    """The column index as the ingest built it (its size, the text's part of it), and the cost
    of building it again: the text (``timelines.store.textblocks``) apart from the rest."""
    from timelines.store import aggregate, columns

    version = aggregate.data_version(incident_id)
    folder = columns.version_dir(incident_id, version)
    text = sum((folder / name).stat().st_size for name in
               ("text.bin", "text-offsets.npy", "text-bloom.npy"))
    total = columns.size_on_disk(incident_id)
    columns.discard(incident_id)
    before = load()
    started = time.perf_counter()
    columns.build(incident_id, version)
    seconds = time.perf_counter() - started
    parts = json.loads((folder / "meta.json").read_text())["seconds"]
    result = {"mb": round(total / 1e6, 1), "text_mb": round(text / 1e6, 1),
              "build_seconds": round(seconds, 1), "text_seconds": parts["text"],
              "rest_seconds": parts["rest"], "load": [before, load()]}
    print(f"  column index: {result['mb']:,} MB, of which text {result['text_mb']:,} MB; built "
          f"again in {seconds:.1f} s (text {parts['text']} s, load {before} → {load()})",
          flush=True)
    return result


# --- 2. the API --------------------------------------------------------------------------------

def _counts(incident_id: int, column: str) -> list[tuple[Any, int]]:
    """(value, events) of one column of the incident, most common first."""
    from django.db import connection

    expression = "unnest(groups)" if column == "groups" else column
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {expression} AS v, count(*) FROM timelines_event "  # noqa: S608
                       "WHERE incident_id = %s GROUP BY 1 ORDER BY 2 DESC, 1", [incident_id])
        return [(value, n) for value, n in cursor.fetchall() if value not in (None, "")]


def _iso(moment) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def event_queries(incident_id: int) -> list[tuple[str, str, dict[str, Any]]]:
    """(kind, label, query) of the events list: each filter kind with a common and a rare value
    of the data (the rare one is where a filter that no index leads with costs most)."""
    from django.db.models import Max, Min
    from timelines.models import Event

    queries: list[tuple[str, str, dict[str, Any]]] = [("none", "no filter", {})]
    for kind, column in (("user", "username"), ("verb", "verb"), ("resource", "resource"),
                         ("namespace", "namespace"), ("name", "name"), ("code", "code"),
                         ("group", "groups")):
        counts = _counts(incident_id, column)
        for which, (value, n) in (("common", counts[0]), ("rare", counts[-1])):
            queries.append((kind, f"{which}: {kind}={value} ({n:,} events)",
                            {kind: str(value)}))
    # A value no event has (a typo): the whole incident is read unless an index leads with the
    # filtered column (user: event_actor; namespace, code: none).
    queries += [(kind, f"no match: {kind}={value}", {kind: value}) for kind, value in
                (("user", "no-such-user"), ("namespace", "no-such-namespace"), ("code", "599"))]
    span = Event.objects.filter(incident_id=incident_id).aggregate(
        first=Min("received"), last=Max("received"))
    middle = span["first"] + (span["last"] - span["first"]) / 2
    windows = {label: {"since": _iso(middle - timedelta(seconds=width / 2)),
                       "until": _iso(middle + timedelta(seconds=width / 2))}
               for label, width in (("1 s", 1), ("1 min", 60))}
    queries += [("since/until", f"window of {label} in the middle", window)
                for label, window in windows.items()]
    names = _counts(incident_id, "name")
    user = _counts(incident_id, "username")[0][0]
    # the most common URI's path segments in reverse order: trigrams that every part of the
    # incident holds, in an order that (almost) no event does
    near_miss = "/".join(reversed(_counts(incident_id, "request_uri")[0][0].strip("/").split("/")))
    queries += [
        ("q", "common: q=kube", {"q": "kube"}),
        ("q", f"rare: q={names[-1][0]} (a name of {names[-1][1]:,} events)",
         {"q": names[-1][0]}),
        ("q", "no match: q=no-such-text", {"q": "no-such-text"}),
        ("q", f"rare with a common user: q={names[-1][0]}&user={user}",
         {"q": names[-1][0], "user": user}),
        ("q", f"two terms: q={names[0][0]}&q={names[-1][0]}", {"q": [names[0][0], names[-1][0]]}),
        ("q", f"near miss: q={near_miss} ({_text_count(incident_id, near_miss):,} events;"
              " its trigrams are common)", {"q": near_miss}),
    ]
    users, verbs = _counts(incident_id, "username"), _counts(incident_id, "verb")
    queries.append(("combined", f"user={users[0][0]}&verb={verbs[0][0]}&window of 1 min",
                    {"user": users[0][0], "verb": verbs[0][0], **windows["1 min"]}))
    return queries


def _text_count(incident_id: int, term: str) -> int:
    from django.db.models import Q
    from timelines.models import Event

    return Event.objects.filter(Q(request_uri__icontains=term) | Q(message__icontains=term)
                                | Q(name__icontains=term), incident_id=incident_id).count()


def first_view_queries(incident_id: int) -> list[tuple[str, str, dict[str, Any]]]:
    users = _counts(incident_id, "username")
    rare = _counts(incident_id, "name")[-1][0]
    return [
        # the free text: a term no event holds, a rare one, a common one
        ("figure", "q=no-such-text", {"q": "no-such-text"}),
        ("figure", f"q={rare}", {"q": rare}),
        ("figure", "q=kube", {"q": "kube"}),
        ("facets", f"field=verb&q={rare}", {"field": "verb", "q": rare}),
        ("overview", f"q={rare}", {"q": rare}),
        ("overview", "unfiltered", {}),
        ("overview", f"user={users[0][0]}", {"user": users[0][0]}),
        ("facets", "field=user_agent", {"field": "user_agent"}),
        ("facets", "field=name&contains=-1", {"field": "name", "contains": "-1", "limit": "50"}),
        ("facets", f"field=verb&user={users[-1][0]}", {"field": "verb", "user": users[-1][0]}),
        ("figure", "default (lanes=object)", {}),
        ("figure", "lanes=actor", {"lanes": "actor"}),
        ("figure", f"user={users[0][0]}", {"user": users[0][0]}),
    ]


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(fraction * len(ordered)) - 1)]


def _stats(runs: list[float]) -> dict[str, Any]:
    return {"p50_ms": round(statistics.median(runs), 1),
            "p95_ms": round(_percentile(runs, 0.95), 1),
            "runs": len(runs), "runs_ms": [round(v, 1) for v in runs]}


def measure_api(incident_id: int, runs: int) -> dict[str, list[dict]]:
    from django.contrib.auth import get_user_model
    from django.core.cache import cache
    from django.test import Client
    from timelines.store import columns

    user = get_user_model().objects.filter(username="bench").first() or \
        get_user_model().objects.create_superuser("bench", "bench@example.com", None)
    client = Client(HTTP_HOST="localhost")  # one of the default ALLOWED_HOSTS
    client.force_login(user)

    def timed(url: str, query: dict, cold: bool) -> tuple[float, Any]:
        if cold:
            cache.clear()
            columns.forget()  # mapped again, as in a new web process
        started = time.perf_counter()
        answer = client.get(url, query, HTTP_ACCEPT_ENCODING="gzip")
        ms = (time.perf_counter() - started) * 1000
        if answer.status_code != 200:
            raise SystemExit(f"{url} {query}: HTTP {answer.status_code} {answer.content[:300]!r}")
        return ms, answer

    def repeat(url: str, query: dict, cold: bool) -> tuple[list[float], Any]:
        ms, answer = timed(url, query, cold)
        times = [ms]
        # a query of over a second is run 5 times, not --runs: its p95 is then its slowest run
        for _ in range((runs if ms < 1000 else 5) - 1):
            ms, answer = timed(url, query, cold)
            times.append(ms)
        return times, answer

    results: dict[str, list[dict]] = {"events": [], "first_view": []}
    base = f"/api/v1/incidents/{incident_id}"
    for kind, label, query in event_queries(incident_id):
        before = load()
        times, answer = repeat(f"{base}/events/", query, cold=False)
        row = {"kind": kind, "query": label, "params": query,
               "rows": len(answer.json()["results"]), **_stats(times), "load_before": before}
        results["events"].append(row)
        print(f"  events   {label:58} {row['rows']:>4} rows  p50 {row['p50_ms']:>8.1f} ms  "
              f"p95 {row['p95_ms']:>8.1f} ms  ({row['runs']} runs, load {before})", flush=True)
    for endpoint, label, query in first_view_queries(incident_id):
        for cold in (True, False):
            before = load()
            times, answer = repeat(f"{base}/{endpoint}/", query, cold=cold)
            row = {"endpoint": endpoint, "query": label, "params": query,
                   "mode": "cold" if cold else "cached", "bytes": len(answer.content),
                   **_stats(times), "load_before": before}
            results["first_view"].append(row)
            print(f"  {endpoint:8} {label:44} {row['mode']:6} {row['bytes']:>8,} B  "
                  f"p50 {row['p50_ms']:>8.1f} ms  p95 {row['p95_ms']:>8.1f} ms  "
                  f"({row['runs']} runs, load {before})", flush=True)
    return results


def explain(incident_id: int, query: dict) -> str:
    """The plan of the events list's first page for a query (to say why a filter is slow)."""
    from django.db import connection
    from django.http import QueryDict
    from timelines.models import Event
    from timelines.reads.filters import EventFilterSet

    params = QueryDict(mutable=True)
    for key, value in query.items():
        params.setlist(key, value if isinstance(value, list) else [value])
    filterset = EventFilterSet(params, queryset=Event.objects.filter(incident_id=incident_id))
    sql, args = filterset.qs.order_by("received", "id")[:101].query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", args)
        return "\n".join(row[0] for row in cursor.fetchall())


# --- the run -----------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000_000)
    parser.add_argument("--chunk", type=int, default=1_000_000,
                        help="requests generated (and gzipped) at a time (default 1000000)")
    parser.add_argument("--runs", type=int, default=20,
                        help="runs per API query (default 20; 5 when one takes over a second)")
    parser.add_argument("--jobs", type=int, default=None, help="passed to manage.py ingest")
    parser.add_argument("--reuse", action="store_true",
                        help="measure the incident of the last --keep run: no ingest")
    parser.add_argument("--keep", action="store_true",
                        help="keep the database and the incident (default: delete the incident "
                             "through the API, then drop the database)")
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL,
                        help="PostgreSQL database to DROP and recreate (its name must contain "
                             f"'bench'; default {DEFAULT_DATABASE_URL})")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    n = args.requests
    database = ingest._bench_database(args.database_url)
    directory = OUT_DIR / f"scale-input-{n}"
    columns_dir = OUT_DIR / "scale-columns"
    data_dir = OUT_DIR / "scale-data"
    os.environ.update(HINDSIGHT_COLUMNS_DIR=str(columns_dir), HINDSIGHT_DATA_DIR=str(data_dir))
    os.environ.pop("CELERY_BROKER_URL", None)
    data_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "data": "synthetic: bench/ingest's clones of the fixture requests, gzipped",
        "requests": n, "seed": args.seed, "load_start": load()}

    if not args.reuse:
        shutil.rmtree(columns_dir, ignore_errors=True)
        print(f"generating {n:,} requests in chunks of {args.chunk:,} into {directory} …",
              flush=True)
        files, generated = generate(n, args.chunk, directory, args.seed)
        gz_bytes = sum(f.stat().st_size for f in files)
        print(f"  {generated.bytes / 1e6:,.0f} MB of audit log, {gz_bytes / 1e6:,.0f} MB "
              f"gzipped, in {generated.seconds:.0f} s", flush=True)
        try:
            print(f"recreating database {database} and migrating …", flush=True)
            ingest.reset_database(args.database_url)
            ingest.migrate(args.database_url)
            print(f"timing manage.py ingest of {len(files)} files (load {load()}) …", flush=True)
            results["load_before_ingest"] = load()
            run = ingest.run_hindsight(args.database_url, files, directory, args.jobs)
            results["load_after_ingest"] = load()
            print(f"  {run.seconds:.1f} s, {n / run.seconds:,.0f} requests/s, peak "
                  f"{run.peak_rss_bytes / 1e6:.1f} MB; verifying …", flush=True)
            check = ingest.verify(args.database_url, run, generated)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        results["ingest"] = {
            "input_mb": round(generated.bytes / 1e6, 1), "gzipped_mb": round(gz_bytes / 1e6, 1),
            "files": len(files), "generate_seconds": round(generated.seconds, 1),
            "seconds": round(run.seconds, 1), "requests_per_second": round(n / run.seconds),
            "peak_rss_mb": round(run.peak_rss_bytes / 1e6, 1),
            "rss_mb_every_second": ingest._rss_profile(run.rss_samples),
            "verified_events": check.events,
            "first_page_of_a_user_ms": round(check.page_ms, 2), "jobs": args.jobs}
        incident_id = check.incident_id
    figure.setup_django(args.database_url, "", columns_dir)
    if args.reuse:
        from incidents.models import Incident

        incident = Incident.objects.filter(title=ingest.INCIDENT_TITLE).order_by("-pk").first()
        if incident is None:
            raise SystemExit("--reuse: no bench incident; run with --keep first")
        incident_id = incident.pk
    else:
        seconds = vacuum(incident_id)
        results["ingest"]["vacuum_analyze_seconds"] = round(seconds, 1)
        print(f"  VACUUM (ANALYZE) of the partition: {seconds:.1f} s", flush=True)
        results["column_index"] = column_index(incident_id)
    # What tasks.finish_incident does after every ingest (manage.py ingest ran it already): here
    # again for a database of --reuse measured before it existed.
    from timelines.ingest.store import analyze_time_order

    analyze_time_order()
    results["storage"] = database_size(args.database_url)
    print(f"  storage: {results['storage']}", flush=True)

    print(f"the API, {args.runs} runs each (load {load()}) …", flush=True)
    results["api"] = measure_api(incident_id, args.runs)
    results["plans"] = {row["query"]: explain(incident_id, row["params"])
                        for row in results["api"]["events"] if row["p95_ms"] > P95_TARGET_MS}

    if not args.keep:
        from django.contrib.auth import get_user_model

        print(f"deleting the incident (load {load()}) …", flush=True)
        results["load_before_delete"] = load()
        results["delete"] = delete.delete_and_purge(
            incident_id, get_user_model().objects.get(username="bench"), delete.PurgeClock())
    results["machine"] = {**ingest.machine(),
                          "postgresql": ingest.postgres_version(args.database_url),
                          "load_average_end": [round(v, 2) for v in os.getloadavg()]}
    results["code"] = ingest.checkout()
    results["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / f"scale-{n}.json"
    path.write_text(json.dumps(results, indent=2, default=str) + "\n")
    if not args.keep:
        from django.db import connections

        connections.close_all()
        import psycopg
        from psycopg import sql

        with psycopg.connect(**{**ingest._connect_kwargs(args.database_url),
                                "dbname": "postgres"}, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(database)))
        shutil.rmtree(columns_dir, ignore_errors=True)
        shutil.rmtree(data_dir, ignore_errors=True)

    print()
    if "ingest" in results:
        i = results["ingest"]
        print(f"ingest     {n:,} requests ({i['input_mb']:,.0f} MB, {i['gzipped_mb']:,.0f} MB "
              f"gzipped) in {i['seconds']} s: {i['requests_per_second']:,} requests/s, "
              f"peak {i['peak_rss_mb']} MB (load {results['load_before_ingest']} → "
              f"{results['load_after_ingest']})")
    over = [r["query"] for r in results["api"]["events"] if r["p95_ms"] > P95_TARGET_MS]
    print(f"events     {len(results['api']['events']) - len(over)} of "
          f"{len(results['api']['events'])} queries with p95 ≤ {P95_TARGET_MS:.0f} ms; over: "
          f"{over}")
    if "delete" in results:
        d = results["delete"]
        print(f"delete     request {d['request_seconds'] * 1000:.1f} ms, purge "
              f"{d['purge_seconds']} s")
    print(f"results    {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
