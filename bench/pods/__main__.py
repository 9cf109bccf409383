"""Pod phases benchmark: ``GET /api/v1/incidents/{id}/pods/`` on a 1,000,000-event incident.

The incident is SYNTHETIC: the figure benchmark's clones of the fixture requests
(``bench/figure/build.py``, without the 9 falco traces that create pods: see ``build_clones``)
plus the lifecycles
of ``--pods`` pods written here: per pod a create by generated name, a binding, three kubelet
status patches (two at Request level, one at RequestResponse), a graceful delete, the last status
patch and the final delete (8 requests), and the kubelet's Events Scheduled, Pulling, Pulled,
Created, Started (5 Events), all read by Hindsight's own parsers and written through the store's
COPY path. Lifecycles start on a Poisson process over the clones' span; the clones fill up to
``--events``. Then each query is asked through Django's test ``Client`` as a superuser (no
network), ``--runs`` times each:

- **cold**: the cache, the process's facts and their stored row emptied: the rows read, and
  every body of a request on pods decompressed (the first query of a data version, if nothing
  prepared it);
- **prepared**: as ``pods_views.warm`` leaves the store and the shared cache at the end of an
  ingest (the facts' row, the unfiltered answer; its own time is reported), asked by another
  process;
- **stored**: the cache evicted and the process new, the facts' row kept (one row read);
- **in process**: the answers emptied, the facts kept by this process (a web process's second
  query of the data version);
- **warm**: the cached answer.

    .venv/bin/python bench/pods                 # build 1,000,000 events, measure
    .venv/bin/python bench/pods --reuse         # measure the incident built last time
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from datetime import timedelta
from io import BytesIO
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: benchlib
from benchlib import OUT_DIR, ROOT, reexec_in_venv, script_module, write_results  # noqa: E402

reexec_in_venv(__file__)

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/hindsight_pods_bench"
USERNAME = "bench"
REQUESTS_PER_POD, EVENTS_PER_POD = 8, 5
NAMESPACES = 40
NODES = 12



def _stamp(at, whole: bool = False) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ" if whole else "%Y-%m-%dT%H:%M:%S.%fZ")


def lifecycle(n: int, start, rng: random.Random) -> tuple[list[dict], list[dict]]:
    """The audit events and Kubernetes Events of one pod's life (SYNTHETIC)."""
    namespace = f"team-{n % NAMESPACES:02d}"
    name = f"app-{n // 7:05d}-{n:06d}"
    uid = f"00000000-0000-4000-8000-{n:012d}"
    node = f"node-{rng.randrange(NODES):02d}"
    scheduled = start + timedelta(milliseconds=rng.lognormvariate(3.5, 1.0))
    started = scheduled + timedelta(seconds=rng.lognormvariate(1.2, 0.8))
    ready = started + timedelta(seconds=rng.lognormvariate(1.5, 0.6))
    deleted = ready + timedelta(seconds=rng.uniform(30, 600))
    finished = deleted + timedelta(seconds=rng.uniform(0.5, 30))
    meta = {"name": name, "namespace": namespace, "uid": uid,
            "generateName": name.rsplit("-", 1)[0] + "-",
            "creationTimestamp": _stamp(start, whole=True)}
    scheduled_condition = {"type": "PodScheduled", "status": "True",
                           "lastTransitionTime": _stamp(scheduled, whole=True)}

    def status(ready_now: bool, terminated: bool = False) -> dict:
        state = ({"terminated": {"exitCode": 0, "startedAt": _stamp(started, whole=True),
                                 "finishedAt": _stamp(finished, whole=True)}} if terminated
                 else {"running": {"startedAt": _stamp(started, whole=True)}})
        return {"phase": "Succeeded" if terminated else "Running", "conditions": [
            scheduled_condition, {"type": "Ready", "status": "True" if ready_now else "False",
                                  "lastTransitionTime": _stamp(ready if ready_now else started,
                                                               whole=True)}],
            "containerStatuses": [{"name": "app", "restartCount": 0, "ready": ready_now,
                                   "state": state}]}

    def request(k, at, verb, sub="", level="RequestResponse", code=200, user="kubelet",
                req=None, resp=None, named=True):
        ref = {"resource": "pods", "namespace": namespace, "apiVersion": "v1"}
        if named:
            ref["name"] = name
        if sub:
            ref["subresource"] = sub
        event = {"kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": level,
                 "auditID": f"{uid}-{k}", "stage": "ResponseComplete", "verb": verb,
                 "requestURI": f"/api/v1/namespaces/{namespace}/pods/{name if named else ''}",
                 "user": {"username": user}, "responseStatus": {"code": code},
                 "objectRef": ref, "requestReceivedTimestamp": _stamp(at),
                 "stageTimestamp": _stamp(at + timedelta(milliseconds=4))}
        if req is not None:
            event["requestObject"] = req
        if resp is not None:
            event["responseObject"] = resp
        return event

    pod = {"kind": "Pod", "apiVersion": "v1", "metadata": meta,
           "spec": {"containers": [{"name": "app", "image": "registry.example/app:1"}]}}
    audit = [
        request(0, start, "create", code=201, named=False,
                user="system:serviceaccount:kube-system:replicaset-controller",
                req={"kind": "Pod", "metadata": {"generateName": meta["generateName"]}},
                resp={**pod, "status": {"phase": "Pending"}}),
        request(1, scheduled, "create", "binding", code=201, user="system:kube-scheduler",
                req={"kind": "Binding", "metadata": {"name": name, "uid": uid},
                     "target": {"kind": "Node", "name": node}}),
        request(2, started + timedelta(milliseconds=200), "patch", "status", level="Request",
                req={"metadata": {"uid": uid}, "status": status(False)}),
        request(3, ready + timedelta(milliseconds=200), "patch", "status",
                req={"status": {"conditions": status(True)["conditions"]}},
                resp={**pod, "status": status(True)}),
        request(4, deleted, "delete", user="system:serviceaccount:kube-system:"
                "replicaset-controller", resp={**pod, "status": status(True)}),
        request(5, finished + timedelta(milliseconds=100), "patch", "status", level="Request",
                req={"status": status(False, terminated=True)}),
        request(6, finished + timedelta(milliseconds=300), "delete", level="Metadata"),
        request(7, deleted + timedelta(seconds=1), "patch", "status", level="Metadata"),
    ]
    subject = {"kind": "Pod", "namespace": namespace, "name": name, "uid": uid,
               "apiVersion": "v1"}
    events = []
    for k, (reason, at) in enumerate((("Scheduled", scheduled), ("Pulling", scheduled),
                                      ("Pulled", started), ("Created", started),
                                      ("Started", started))):
        times = ({"eventTime": _stamp(at)} if reason == "Scheduled" else
                 {"firstTimestamp": _stamp(at, whole=True),
                  "lastTimestamp": _stamp(at, whole=True), "count": 1})
        events.append({"kind": "Event", "apiVersion": "v1", "reason": reason, "type": "Normal",
                       "metadata": {"name": f"{name}.{k}", "namespace": namespace,
                                    "uid": f"{n:08d}-0000-4000-9000-{k:012d}"},
                       "involvedObject": subject, "message": f"{reason} (synthetic)", **times})
    return audit, events


def add_pods(incident_id: int, pods: int, first, last, seed: int) -> dict:
    """The lifecycles of ``pods`` pods, parsed by Hindsight's parsers and written through the
    store's COPY path, as a second finished upload (a new data version)."""
    from django.utils import timezone
    from incidents.models import Upload
    from timelines.ingest.store import write_rows
    from timelines.parsers import Redactor, Report, parse_audit
    from timelines.parsers.events import parse as parse_events

    started = time.perf_counter()
    rng = random.Random(seed)
    upload = Upload.objects.create(incident_id=incident_id, name="synthetic pod lifecycles",
                                   format="audit", status=Upload.Status.RUNNING,
                                   path_is_copy=False, started_at=timezone.now())
    span = (last - first).total_seconds()
    starts = sorted(first + timedelta(seconds=rng.uniform(0, span * 0.95)) for _ in range(pods))
    rows = 0
    for begin in range(0, pods, 1000):
        audit, events = [], []
        for n in range(begin, min(pods, begin + 1000)):
            a, e = lifecycle(n, starts[n], rng)
            audit.extend(a)
            events.extend(e)
        audit.sort(key=lambda e: e["requestReceivedTimestamp"])
        lines = b"".join(json.dumps(e).encode() + b"\n" for e in audit)
        batch = list(parse_audit(BytesIO(lines), Report(source="pods-audit.log"), Redactor()))
        batch += list(parse_events(BytesIO(json.dumps({"kind": "EventList", "apiVersion": "v1",
                                                       "items": events}).encode()),
                                   Report(source="pods-events.json"), Redactor()))
        for at in range(0, len(batch), 5000):
            write_rows(incident_id, upload.pk, batch[at:at + 5000])
        rows += len(batch)
    Upload.objects.filter(pk=upload.pk).update(status=Upload.Status.DONE, event_count=rows,
                                               new_events=rows, finished_at=timezone.now())
    return {"pods": pods, "rows": rows, "seconds": round(time.perf_counter() - started, 1)}


def build_clones(ingest, figure, args, clones: int) -> dict:
    """The figure benchmark's incident (database recreated and migrated), but without the falco
    traces that create pods: cloned, each would be one more create of the same nine pod names
    (by generated name, so each read with its body), which no cluster does."""
    import build
    from django.core.management import call_command
    from django.db import connection

    ingest.reset_database(args.database_url)
    connection.close()
    call_command("migrate", verbosity=0)
    fixtures = [p for p in figure.fixture_files(ingest)
                if not p.name.startswith(("create_nginx_pod", "create_pod_"))]
    built = build.build(fixtures, clones, rate=args.rate, objects=args.objects, seed=args.seed,
                        title=figure.TITLE)
    print(f"  built incident {built.incident_id}: {built.events} events in {built.seconds:.1f} s",
          flush=True)
    return {"incident": built.incident_id, "events": built.events, "seconds": built.seconds,
            "sources": built.sources, "first": built.first.isoformat(),
            "last": built.last.isoformat()}


def queries(incident_id: int) -> list[tuple[str, dict]]:
    from timelines.models import Event

    events = Event.objects.filter(incident_id=incident_id, resource="pods", kind="event")
    count = events.count()
    if not count:  # a try-out too small to hold a pod's Event: the unfiltered query alone
        return [("unfiltered", {})]
    # the 501st pod Event (its pod, its namespace, its time), or the middle one of fewer
    pod = events.order_by("received").values("namespace", "name", "received")[min(500, count // 2)]
    since = pod["received"]
    return [("unfiltered", {}),
            (f"namespace={pod['namespace']}", {"namespace": pod["namespace"]}),
            (f"name={pod['name']}", {"name": pod["name"]}),
            ("a 10-minute window", {"since": since.isoformat().replace("+00:00", "Z"),
                                    "until": (since + timedelta(minutes=10)).isoformat()
                                    .replace("+00:00", "Z")}),
            ("kind=event", {"kind": "event"})]


def measure(incident_id: int, runs: int) -> list[dict]:
    from django.contrib.auth import get_user_model
    from django.core.cache import cache
    from django.test import Client
    from timelines.analysis import pods_views
    from timelines.models import IncidentPodFacts

    user = get_user_model().objects.filter(username=USERNAME).first() or \
        get_user_model().objects.create_superuser(USERNAME, "bench@example.com", None)
    client = Client(HTTP_HOST="localhost")  # one of the default ALLOWED_HOSTS
    client.force_login(user)
    url = f"/api/v1/incidents/{incident_id}/pods/"

    def timed(query):
        started = time.perf_counter()
        answer = client.get(url, query)
        seconds = time.perf_counter() - started
        if answer.status_code != 200:
            raise SystemExit(f"{url} {query}: HTTP {answer.status_code} {answer.content[:300]!r}")
        return seconds * 1000, answer

    results = []
    for label, query in queries(incident_id):
        load = os.getloadavg()[0]
        cold, prepared, warm_up, stored = [], [], [], []
        for _ in range(runs):
            cache.clear()
            pods_views.forget()  # as in a new web process
            IncidentPodFacts.objects.filter(incident_id=incident_id).delete()
            ms, answer = timed(query)
            cold.append(ms)
        for _ in range(runs):
            cache.clear()
            pods_views.forget()
            IncidentPodFacts.objects.filter(incident_id=incident_id).delete()
            started = time.perf_counter()
            pods_views.warm(incident_id)  # what the end of the ingest did …
            warm_up.append((time.perf_counter() - started) * 1000)
            pods_views.forget()  # … in another process
            prepared.append(timed(query)[0])
        for _ in range(runs):  # the cache evicted, a new process: the stored facts read
            cache.clear()
            pods_views.forget()
            stored.append(timed(query)[0])
        in_process = []
        for _ in range(runs):  # the answers emptied, this process's facts kept
            cache.clear()
            in_process.append(timed(query)[0])
        warm = [timed(query)[0] for _ in range(runs)]
        body = answer.json()
        row = {"query": label, "params": query, "pods": len(body), "bytes": len(answer.content),
               "cold_ms": round(statistics.median(cold), 1),
               "prepared_ms": round(statistics.median(prepared), 1),
               "stored_ms": round(statistics.median(stored), 1),
               "in_process_ms": round(statistics.median(in_process), 1),
               "warm_ms": round(statistics.median(warm), 1),
               "prepare_ms": round(statistics.median(warm_up), 1),
               "cold_runs_ms": [round(v, 1) for v in cold],
               "prepared_runs_ms": [round(v, 1) for v in prepared],
               "stored_runs_ms": [round(v, 1) for v in stored],
               "in_process_runs_ms": [round(v, 1) for v in in_process],
               "warm_runs_ms": [round(v, 1) for v in warm], "load_before": round(load, 2)}
        results.append(row)
        print(f"  {label:30} {row['pods']:>6,} pods {row['bytes']:>10,} B  cold "
              f"{row['cold_ms']:>7.1f} ms  prepared {row['prepared_ms']:>6.1f} ms  stored "
              f"{row['stored_ms']:>6.1f} ms  in process "
              f"{row['in_process_ms']:>6.1f} ms  warm {row['warm_ms']:>5.1f} ms  (prepare "
              f"{row['prepare_ms']:.0f} ms, load {load:.2f})", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--pods", type=int, default=5_000)
    parser.add_argument("--rate", type=float, default=500)
    parser.add_argument("--objects", type=int, default=300)
    parser.add_argument("--runs", type=int, default=5, help="runs per measurement (default 5)")
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
    # the in-process cache, emptied before every cold run without flushing a shared Redis
    figure.setup_django(args.database_url, "", OUT_DIR / "pods-columns")
    from django.db import connection
    from incidents.models import Incident
    from timelines.models import Event

    results: dict = {"data": "SYNTHETIC: the figure benchmark's clones of the fixture requests "
                             "plus pod lifecycles written here", "events": args.events,
                     "seed": args.seed}
    if args.reuse:
        incident = Incident.objects.filter(title=figure.TITLE).order_by("-pk").first()
        if incident is None or Event.objects.filter(incident=incident).count() != args.events:
            raise SystemExit("--reuse: no incident of that size; run without it")
        incident_id = incident.pk
        print(f"reusing incident {incident_id} of {args.database_url}", flush=True)
    else:
        clones = args.events - args.pods * (REQUESTS_PER_POD + EVENTS_PER_POD)
        print(f"building {clones:,} cloned requests and {args.pods:,} pod lifecycles in "
              f"{args.database_url} …", flush=True)
        results["build"] = build_clones(ingest, figure, args, clones)
        incident_id = results["build"]["incident"]
        bounds = Event.objects.filter(incident_id=incident_id).order_by("received")
        first = bounds.values_list("received", flat=True).first()
        last = bounds.reverse().values_list("received", flat=True).first()
        results["pods"] = add_pods(incident_id, args.pods, first, last, args.seed)
        with connection.cursor() as cursor:
            cursor.execute("VACUUM (ANALYZE) timelines_event")
        total = Event.objects.filter(incident_id=incident_id).count()
        print(f"  {total:,} events, of them {results['pods']['rows']:,} of the pod "
              f"lifecycles ({results['pods']['seconds']} s)", flush=True)
    about_pods = Event.objects.filter(incident_id=incident_id, resource="pods")
    results["rows_about_pods"] = about_pods.count()
    print(f"{results['rows_about_pods']:,} events about pods; medians of {args.runs} …",
          flush=True)
    results["server"] = measure(incident_id, args.runs)
    write_results(results, f"pods-{args.events}", ingest, args.database_url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
