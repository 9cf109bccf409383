"""Load benchmark: Hindsight as deployed (gunicorn, several Celery workers, PostgreSQL, Redis) on
this machine, under readers and uploaders at once, for a bounded time.

1. A database of its own (dropped and recreated, migrated), a Redis database of its own
   (flushed: broker and cache), a data directory under ``bench/out/load-data``; gunicorn
   (``--web-workers``) and ``--workers`` Celery workers (prefork, one process each), started
   with the production settings (``DEBUG`` off) except the API rate limits, turned off so that
   the load measures the server rather than the throttle.
2. The incident read under load, uploaded through the REST API and ingested by the workers:
   SYNTHETIC clones of the fixture audit events (``bench/ingest``'s generator, ``--requests``
   requests over three apiservers' logs) plus the fixture evidence itself (audit logs, Kubernetes
   Events, klog). The filters the readers use are found in it (its busiest user and resource, a
   tenth of the window its overview suggests); the events each selects go to the results.
3. locust (``bench/load/locustfile.py``), headless, ``--users`` users for ``--seconds``: readers
   (events with filters, the next pages by cursor, the figure, facets, the overview) and
   ``--uploaders`` uploaders (an audit log to a new incident, then polling until it is done).
4. Afterwards every upload made is checked: ``done``, with as many events (and stored rows) as
   the file holds requests. No error and no lost upload, or the exit status is 1.

Requests/s, p50 and p95 per endpoint, the uploads' time until done and the load average go to
stdout and ``bench/out/load-<users>u-<seconds>s.json``; locust's CSV files and the servers' logs
stay in ``bench/out/load-run/``.

    .venv/bin/python bench/load                            # 24 users, 60 s
    .venv/bin/python bench/load --users 40 --seconds 120 --workers 4
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: benchlib
from benchlib import ROOT, VENV, VENV_PYTHON, reexec_in_venv, script_module  # noqa: E402

reexec_in_venv(__file__)

import redis  # noqa: E402  (after the re-exec into the virtualenv)
import requests  # noqa: E402

sys.path.insert(0, str(ROOT))  # the project's packages: settings, models, hindsight.testing

OUT_DIR = ROOT / "bench" / "out"
RUN_DIR = OUT_DIR / "load-run"
DATA_DIR = OUT_DIR / "load-data"
FIXTURES = ROOT.parent / "shared" / "fixtures"
# The incident's own evidence, besides the synthetic requests: one file of each kind.
EVIDENCE = [FIXTURES / "audit" / "audit2rbac-demo.log",
            FIXTURES / "audit" / "openshift-requestresponse.log",
            FIXTURES / "events" / "cribl-event-watch-stream.json",
            FIXTURES / "klog" / "kind-kube-controller-manager.txt"]
USERNAME = "load-bench"
FINISHED = {"done", "failed", "skipped"}



bench_ingest = script_module("bench_ingest", ROOT / "bench" / "ingest")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Servers:
    """gunicorn and the Celery workers, in processes of their own; stopped at the end."""

    def __init__(self, env: dict[str, str], web_workers: int, workers: int) -> None:
        self.env = env
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.processes: list[subprocess.Popen] = []
        self.start("web", [str(VENV / "bin" / "gunicorn"), "hindsight.wsgi:application",
                           "--bind", f"127.0.0.1:{self.port}", "--workers", str(web_workers),
                           "--timeout", "300", "--worker-tmp-dir", "/dev/shm"])
        for n in range(workers):
            self.start(f"worker-{n}", [str(VENV_PYTHON), "-m", "celery", "-A", "hindsight",
                                       "worker", "-P", "prefork", "-c", "1",
                                       "-Q", env["HINDSIGHT_QUEUE"], "-n", f"load-{n}@%h",
                                       "--without-gossip", "--without-mingle", "-l", "info"])
        deadline = time.monotonic() + 120
        while True:
            try:
                if requests.get(f"{self.url}/healthz", timeout=30).status_code == 200:
                    break
            except requests.RequestException:  # not listening yet, or its workers still load
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"gunicorn did not answer; see {RUN_DIR / 'web.log'}")
            time.sleep(0.5)

    def start(self, name: str, command: list[str]) -> None:
        with (RUN_DIR / f"{name}.log").open("wb") as log:
            self.processes.append(subprocess.Popen(command, cwd=ROOT, env=self.env, stdout=log,
                                                   stderr=subprocess.STDOUT))

    def stop(self) -> None:
        for process in self.processes:
            process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def prepare(args: argparse.Namespace) -> dict[str, str]:
    """A database, a Redis database and a data directory of the bench's own; the environment
    of its servers."""
    bench_ingest.reset_database(args.database_url)
    redis.Redis.from_url(args.redis_url).flushdb()
    shutil.rmtree(DATA_DIR, ignore_errors=True)
    shutil.rmtree(RUN_DIR, ignore_errors=True)
    DATA_DIR.mkdir(parents=True)
    RUN_DIR.mkdir(parents=True)
    env = {**os.environ, "DATABASE_URL": args.database_url, "CELERY_BROKER_URL": args.redis_url,
           "CACHE_URL": args.redis_url, "HINDSIGHT_DATA_DIR": str(DATA_DIR),
           "HINDSIGHT_QUEUE": f"load-bench-{os.getpid()}", "SECRET_KEY": secrets.token_hex(32),
           "DEBUG": "false", "ALLOWED_HOSTS": "127.0.0.1",
           "HINDSIGHT_API_RATE": "off", "HINDSIGHT_UPLOAD_RATE": "off", "LOG_LEVEL": "WARNING"}
    os.environ.update({k: env[k] for k in ("DATABASE_URL", "CELERY_BROKER_URL", "CACHE_URL",
                                           "HINDSIGHT_DATA_DIR", "SECRET_KEY", "ALLOWED_HOSTS")})
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hindsight.settings")
    bench_ingest.migrate(args.database_url)
    return env


def api_token() -> str:
    """A superuser's API token, in the bench database."""
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from incidents.models import ApiToken

    user = get_user_model().objects.create_superuser(USERNAME, "load@example.com", None)
    return ApiToken.issue(user, scope="full")[1]


def upload(session: requests.Session, url: str, path: Path, **fields) -> dict:
    with path.open("rb") as handle:
        answer = session.post(f"{url}/api/v1/uploads/", files={"file": (path.name, handle)},
                              data=fields, timeout=600)
    if answer.status_code != 202:
        raise SystemExit(f"upload of {path}: HTTP {answer.status_code} {answer.text[:300]}")
    return answer.json()


def wait_until_finished(session: requests.Session, url: str, ids: list[int],
                        timeout: float) -> dict[int, dict]:
    """Each upload's last state, once all have finished (or when ``timeout`` runs out)."""
    states: dict[int, dict] = {}
    deadline = time.monotonic() + timeout
    while True:
        for upload_id in ids:
            if states.get(upload_id, {}).get("status") not in FINISHED:
                states[upload_id] = session.get(f"{url}/api/v1/uploads/{upload_id}/",
                                                timeout=60).json()
        if all(s["status"] in FINISHED for s in states.values()) \
                or time.monotonic() > deadline:
            return states
        time.sleep(0.5)


def build_incident(session: requests.Session, url: str, args: argparse.Namespace) -> dict:
    """The incident the readers read: synthetic requests and fixture evidence, uploaded and
    ingested like any other; returns its id, event count and the readers' filters."""
    generated = bench_ingest.generate(args.requests, OUT_DIR / "load-input" / "incident",
                                      args.seed)
    files = [*generated.files, *EVIDENCE]
    started = time.perf_counter()
    first = upload(session, url, files[0], incident="load bench")
    incident = first["incident"]["id"]
    ids = [first["id"]] + [upload(session, url, path, incident_id=incident)["id"]
                           for path in files[1:]]
    states = wait_until_finished(session, url, ids, timeout=1800)
    failed = {i: s.get("message") for i, s in states.items() if s["status"] != "done"}
    if failed:
        raise SystemExit(f"the incident's uploads did not all end done: {failed}")
    seconds = time.perf_counter() - started
    overview = session.get(f"{url}/api/v1/incidents/{incident}/overview/", timeout=600).json()
    top = overview["facets"]

    def busiest(field: str) -> str:
        return next(v["value"] for v in top[field]["values"] if v["value"] not in ("", None))

    # The fixture evidence is years away from the synthetic requests: the window is taken
    # from the one the overview suggests, which leaves such stragglers out.
    suggested = overview["window"] or dict(zip(("since", "until"), overview["range"], strict=True))
    window = _window(suggested["since"], suggested["until"])
    filters = [{}, {"verb": "get"}, {"user": busiest("user")},
               {"resource": busiest("resource")}, window,
               {**window, "verb": ["get", "list"]}, {"code": "403"}]
    selected = [session.get(f"{url}/api/v1/incidents/{incident}/overview/", params=f,
                            timeout=600).json()["total"] for f in filters]
    return {"incident": incident, "events": overview["total"], "files": len(files),
            "requests": args.requests, "ingest_seconds": round(seconds, 1),
            "filters": [{"filter": f, "events": n} for f, n in zip(filters, selected,
                                                                     strict=True)]}


def _window(start: str, end: str) -> dict[str, str]:
    """A tenth of the span, from its middle."""
    from datetime import datetime

    low, high = (datetime.fromisoformat(s.replace("Z", "+00:00")) for s in (start, end))
    middle, tenth = low + (high - low) / 2, (high - low) / 10
    return {"since": middle.isoformat().replace("+00:00", "Z"),
            "until": (middle + tenth).isoformat().replace("+00:00", "Z")}


def upload_files(args: argparse.Namespace) -> list[dict]:
    """What the uploaders send, each with the requests it holds (the events expected)."""
    from hindsight.testing import requests_in

    generated = bench_ingest.generate(args.upload_requests, OUT_DIR / "load-input" / "uploads",
                                      args.seed + 1)
    files = [generated.files[0], FIXTURES / "audit" / "audit2rbac-demo.log"]
    return [{"path": str(path), "bytes": path.stat().st_size, "events": len(requests_in(path))}
            for path in files]


class LoadSampler(threading.Thread):
    """The 1-minute load average every 5 s while the load runs."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[float] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(5):
            self.samples.append(os.getloadavg()[0])


def run_locust(servers: Servers, plan: dict, args: argparse.Namespace) -> Path:
    plan_path = RUN_DIR / "plan.json"
    plan_path.write_text(json.dumps(plan, indent=1))
    command = [str(VENV / "bin" / "locust"), "-f", str(Path(__file__).parent / "locustfile.py"),
               "--headless", "--host", servers.url, "-u", str(args.users),
               "-r", str(args.users), "-t", f"{args.seconds}s", "--csv", str(RUN_DIR / "locust"),
               "--only-summary", "--loglevel", "WARNING"]
    with (RUN_DIR / "locust.log").open("wb") as log:
        subprocess.run(command, cwd=ROOT, env={**os.environ, "HINDSIGHT_LOAD_PLAN": str(plan_path)},
                       stdout=log, stderr=subprocess.STDOUT, check=False)
    return RUN_DIR / "locust_stats.csv"


def read_stats(path: Path) -> list[dict]:
    rows = []
    with path.open() as handle:
        for row in csv.DictReader(handle):
            count = int(row["Request Count"])
            rows.append({"endpoint": row["Name"], "type": row["Type"], "requests": count,
                         "failures": int(row["Failure Count"]),
                         "per_second": round(float(row["Requests/s"]), 1),
                         "p50_ms": _ms(row["50%"]), "p95_ms": _ms(row["95%"]),
                         "max_ms": _ms(row["Max Response Time"])})
    return rows


def _ms(value: str) -> float | None:
    return None if value in ("", "N/A") else round(float(value), 1)


def check_uploads(session: requests.Session, url: str, log: Path) -> dict:
    """Every upload the load made ended ``done`` with the events its file holds, in the
    database too."""
    from timelines.models import Event

    made = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    states = wait_until_finished(session, url, [m["id"] for m in made], timeout=600)
    problems = []
    for sent in made:
        state = states[sent["id"]]
        stored = Event.objects.filter(incident_id=state["incident_id"]).count()
        if state["status"] != "done" or state["events"] != sent["events"] \
                or stored != sent["events"]:
            problems.append(f"upload {sent['id']} ({Path(sent['path']).name}): "
                            f"{state['status']}, {state['events']} events, {stored} stored, "
                            f"{sent['events']} expected: {state.get('message')}")
    return {"uploads": len(made), "done": sum(s["status"] == "done" for s in states.values()),
            "events": sum(m["events"] for m in made), "problems": problems}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=24, help="locust users in all (24)")
    parser.add_argument("--uploaders", type=int, default=4, help="of which upload (4)")
    parser.add_argument("--seconds", type=int, default=60, help="length of the load (60)")
    parser.add_argument("--workers", type=int, default=3, help="Celery workers (3)")
    parser.add_argument("--web-workers", type=int, default=2 * (os.cpu_count() or 1) + 1,
                        help="gunicorn workers (2 × CPUs + 1)")
    parser.add_argument("--requests", type=int, default=50_000,
                        help="synthetic requests in the incident read (50,000)")
    parser.add_argument("--upload-requests", type=int, default=6_000,
                        help="synthetic requests spread over three logs; the uploaders send "
                             "the first (about a third) and the audit2rbac fixture (6,000)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--database-url",
                        default="postgres://postgres@127.0.0.1:5432/hindsight_load_bench",
                        help="dropped and recreated: its name must contain 'bench'")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/12",
                        help="a Redis database of the bench's own, flushed (broker and cache)")
    args = parser.parse_args(argv)
    if not 0 < args.uploaders < args.users:
        parser.error("--uploaders must be at least 1 and fewer than --users")
    OUT_DIR.mkdir(exist_ok=True)

    env = prepare(args)
    token = api_token()
    servers = Servers(env, args.web_workers, args.workers)
    session = requests.Session()
    session.headers["Authorization"] = f"Token {token}"
    try:
        print(f"building the incident: {args.requests:,} synthetic requests and "
              f"{len(EVIDENCE)} fixture files, through the API", flush=True)
        incident = build_incident(session, servers.url, args)
        print(f"  {incident['events']:,} events, ingested in {incident['ingest_seconds']} s",
              flush=True)
        for selection in incident["filters"]:
            print(f"  filter {json.dumps(selection['filter'])}: {selection['events']:,} events")
        plan = {"token": token, "incident": incident["incident"],
                "filters": [f["filter"] for f in incident["filters"]],
                "uploaders": args.uploaders,
                "upload_files": upload_files(args),
                "uploads_log": str(RUN_DIR / "uploads.jsonl")}
        load_before = os.getloadavg()
        sampler = LoadSampler()
        sampler.start()
        print(f"load: {args.users} users ({args.uploaders} uploading) for {args.seconds} s "
              f"on {args.web_workers} gunicorn and {args.workers} Celery workers", flush=True)
        stats_path = run_locust(servers, plan, args)
        sampler.stopped.set()
        if not stats_path.exists():
            raise SystemExit(f"locust wrote no statistics; see {RUN_DIR / 'locust.log'}")
        stats = read_stats(stats_path)
        uploads = check_uploads(session, servers.url, Path(plan["uploads_log"]))
    finally:
        servers.stop()

    result = {"users": args.users, "uploaders": args.uploaders, "seconds": args.seconds,
              "celery_workers": args.workers, "web_workers": args.web_workers,
              "incident": {k: v for k, v in incident.items() if k != "filters"},
              "filters": incident["filters"], "upload_files": plan["upload_files"],
              "endpoints": stats, "uploads": uploads,
              "load_average": {"before": [round(x, 2) for x in load_before],
                               "during_max": max(sampler.samples, default=None),
                               "during": sampler.samples,
                               "after": [round(x, 2) for x in os.getloadavg()]},
              "machine": bench_ingest.machine(), "checkout": bench_ingest.checkout(),
              "postgres": bench_ingest.postgres_version(args.database_url)}
    out = OUT_DIR / f"load-{args.users}u-{args.seconds}s.json"
    out.write_text(json.dumps(result, indent=1))

    print(f"\n{'endpoint':34} {'requests':>8} {'failed':>6} {'req/s':>7} {'p50 ms':>8} "
          f"{'p95 ms':>8} {'max ms':>8}")
    for row in stats:
        print(f"{row['endpoint'][:34]:34} {row['requests']:>8} {row['failures']:>6} "
              f"{row['per_second']:>7} {row['p50_ms'] or '':>8} {row['p95_ms'] or '':>8} "
              f"{row['max_ms'] or '':>8}")
    print(f"\nuploads: {uploads['uploads']} made, {uploads['done']} done, "
          f"{len(uploads['problems'])} problems")
    for problem in uploads["problems"]:
        print(f"  {problem}")
    print(f"load average: before {result['load_average']['before']}, highest 1-min during "
          f"{result['load_average']['during_max']}, after {result['load_average']['after']} "
          f"({result['machine']['cpus']} CPUs)")
    print(f"results: {out}")
    failures = sum(row["failures"] for row in stats if row["endpoint"] != "Aggregated")
    return 1 if failures or uploads["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
