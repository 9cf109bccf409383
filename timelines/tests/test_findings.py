"""Findings on bundles (``timelines.analysis.findings``, ``states``): on the Kubernetes Events
and logs of the shared must-gather, troubleshoot and sonobuoy bundles, with expectations read
from the files themselves (PyYAML, the stdlib ``tarfile``); and on state rows laid out as the
state-row contract says (``kind="state"``), made here since their parser lands separately."""

from __future__ import annotations

import io
import re
import tarfile
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from io import StringIO
from pathlib import Path

import orjson
import pytest
import yaml
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from incidents.models import Incident
from timelines.analysis import common, findings, insights, problems
from timelines.models import BodyChunk, Event

_BUNDLES = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "bundles"
MUST_GATHER = _BUNDLES / "openshift-must-gather-aws.tar.xz"
TROUBLESHOOT = _BUNDLES / "troubleshoot-supportbundle-baseline.tar.gz"
SONOBUOY = _BUNDLES / "sonobuoy-results-0.10.tar.gz"
ETCD_LOG = re.compile(r"/pods/etcd-ip-[^/]+/etcd/etcd/logs/current\.log$")
INGRESS = "/namespaces/openshift-ingress-operator/"  # its operator restarted (BackOff Events)
# the Event reasons of each kind of finding (a BackOff pulling an image is an image pull)
REASONS = {"unschedulable": {"FailedScheduling"}, "mount-failure": {"FailedMount",
                                                                     "FailedAttachVolume"},
           "probe-failure": {"Unhealthy", "ProbeError"}, "container-restarts": {"BackOff"}}
Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

pytestmark = pytest.mark.django_db


def parse_time(value) -> datetime | None:
    if not value:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def of_kind(found: list[dict], kind: str) -> list[dict]:
    return [i for i in found if i["kind"] == kind]


def ingest(path: Path, title: str) -> Incident:
    try:
        call_command("ingest", str(path), incident=title, stdout=StringIO(), stderr=StringIO())
    except CommandError:
        pass  # a file the ingest could not read; the others are in
    return Incident.objects.get(title=title)


@pytest.fixture(scope="module")
def must_gather_files() -> dict[str, bytes]:
    """The must-gather's Events, pods, ReplicaSets, its timestamp file and one etcd log, by
    member name (one pass over the xz archive)."""
    wanted = {}
    with tarfile.open(MUST_GATHER) as archive:
        for member in archive:
            name = member.name
            if member.isfile() and (name.endswith(("/core/events.yaml", "/core/pods.yaml",
                                                   "/apps/replicasets.yaml", "/timestamp"))
                                    or ETCD_LOG.search(name)
                                    or (INGRESS in name and name.endswith(".log"))):
                wanted[name] = archive.extractfile(member).read()
    return wanted


def make_bundle(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1_627_980_000
            archive.addfile(info, io.BytesIO(data))
    return path


def events_of(files: dict[str, bytes]) -> list[dict]:
    """The Events of the files, each once (by uid, the sighting of highest count)."""
    unique: dict[str, dict] = {}
    for name, data in files.items():
        if name.endswith("/events.yaml"):
            for event in (yaml.load(data, Loader=Loader) or {}).get("items") or []:
                uid = event["metadata"]["uid"]
                if uid not in unique or (event.get("count") or 1) > (
                        unique[uid].get("count") or 1):
                    unique[uid] = event
    return list(unique.values())


def times_of(event: dict) -> tuple[datetime, datetime]:
    first = [parse_time(event.get(k)) for k in ("firstTimestamp", "eventTime")]
    first.append(parse_time(event["metadata"].get("creationTimestamp")))
    lasts = [t for t in (parse_time(event.get("lastTimestamp")),
                         parse_time((event.get("series") or {}).get("lastObservedTime")))
             if t is not None]
    start = next((t for t in first if t is not None), None) or min(lasts)
    return start, max([start, *lasts])


def gather_time(data: bytes) -> datetime:
    """A must-gather ``timestamp`` file's latest time (a line each at start and end:
    ``2021-08-03 12:14:13.632016778 +0200 CEST m=+138.36``)."""
    times = []
    for line in data.decode().splitlines():
        day, clock, offset = line.split()[:3]
        times.append(datetime.strptime(f"{day} {clock[:15]} {offset}",
                                       "%Y-%m-%d %H:%M:%S.%f %z"))
    return max(times)


def deployments_of(files: dict[str, bytes]) -> dict[tuple[str, str], str]:
    """(namespace, pod) → the Deployment owning the pod's ReplicaSet, from the objects."""
    replica_sets: dict[tuple[str, str], str] = {}
    pods: dict[tuple[str, str], str] = {}
    for name, data in files.items():
        if not name.endswith(("/pods.yaml", "/replicasets.yaml")):
            continue
        for obj in (yaml.load(data, Loader=Loader) or {}).get("items") or []:
            meta = obj["metadata"]
            for ref in meta.get("ownerReferences") or []:
                key = (meta["namespace"], meta["name"])
                if obj["kind"] == "ReplicaSet" and ref["kind"] == "Deployment":
                    replica_sets[key] = ref["name"]
                elif obj["kind"] == "Pod" and ref["kind"] == "ReplicaSet":
                    pods[key] = ref["name"]
    return {pod: replica_sets[(pod[0], rs)] for pod, rs in pods.items()
            if (pod[0], rs) in replica_sets}


def test_must_gather_events_make_one_finding_per_problem_and_owner(must_gather_files, tmp_path):
    # the Events (the objects only tell the test who owns which pod: their state has a test
    # of its own, below, on a few namespaces, reading them all would double this one's time)
    files = {n: d for n, d in must_gather_files.items() if not n.endswith(".log")}
    incident = ingest(make_bundle(tmp_path / "mg-events.tar.gz", {
        n: d for n, d in files.items() if n.endswith(("/events.yaml", "/timestamp"))}),
        "must-gather events")
    found = insights.compute(incident.pk)
    events = events_of(files)
    assert len(events) == Event.objects.filter(incident=incident, kind="event").count()
    # the capture time: the must-gather's timestamp files once its objects are snapshots
    # (kind "state", issue 19 part 1), else its latest Event
    capture = max(times_of(e)[1] for e in events)
    if Event.objects.filter(incident=incident, kind="state", reason="Snapshot").exists():
        capture = max(gather_time(d) for n, d in files.items() if n.endswith("/timestamp"))
    owners = deployments_of(files)
    ids = {audit_id.removeprefix("event:"): pk for audit_id, pk in Event.objects.filter(
        incident=incident, kind="event").values_list("audit_id", "id")}

    for kind, reasons in REASONS.items():
        expected = [e for e in events if e.get("reason") in reasons and not (
            e["reason"] == "BackOff" and "pulling image" in e["message"].lower())]
        assert expected, kind  # the must-gather holds every one of these kinds
        made = of_kind(found, kind)
        assert 0 < len(made) < findings.MAX_PROBLEMS
        # every Event of the kind is in exactly one finding, counted with its count (once
        # the objects are snapshots, their container terminations and conditions join in)
        pods = {(e["involvedObject"].get("namespace", ""), e["involvedObject"]["name"])
                for e in expected}
        seen = [(o["namespace"], o["name"]) for item in made for o in item["objects"]]
        assert len(seen) == len(set(seen)) and pods <= set(seen), kind
        assert sum(n for i in made for r, n in i["reasons"].items() if r in reasons) == sum(
            e.get("count") or 1 for e in expected)
        owner_keys = [(i["owner"]["resource"], i["owner"]["namespace"], i["owner"]["name"])
                      for i in made]
        assert len(owner_keys) == len(set(owner_keys)), f"{kind}: one finding per owner"
        for item in made:
            mine = [e for e in expected if (e["involvedObject"].get("namespace", ""),
                                            e["involvedObject"]["name"]) in {
                (o["namespace"], o["name"]) for o in item["objects"]}]
            assert item["capture"] == common.rfc3339(capture)
            assert item["age_s"] == (capture - parse_time(item["end"])).total_seconds()
            if not mine:
                continue  # known from the objects' state alone
            spans = [times_of(e) for e in mine]
            assert {ids[e["metadata"]["uid"]] for e in mine} <= set(item["events"])
            if item["evidence"] == ["event"]:
                assert item["start"] == common.rfc3339(min(s for s, _ in spans))
                assert item["end"] == common.rfc3339(max(e for _, e in spans))
            else:
                assert parse_time(item["start"]) <= min(s for s, _ in spans)
                assert parse_time(item["end"]) >= max(e for _, e in spans)
            # a Deployment's pods (through their ReplicaSets, as the objects say) roll up to it
            # (pods gone by capture are in no file: their names still say)
            deployments = {owners.get((o["namespace"], o["name"])) for o in item["objects"]}
            if deployments - {None}:
                assert deployments - {None} == {item["owner"]["name"]}, item["title"]
                assert item["owner"]["resource"] == "deployments"
        # pods of one Deployment are never spread over two findings of a kind
        by_deployment = defaultdict(set)
        for number, item in enumerate(made):
            for o in item["objects"]:
                if (o["namespace"], o["name"]) in owners:
                    by_deployment[(o["namespace"], owners[(o["namespace"], o["name"])])].add(
                        number)
        assert all(len(v) == 1 for v in by_deployment.values())

    # Events counted more than 20 times per object and reason
    totals = Counter()
    for e in events:
        involved = e["involvedObject"]
        totals[(involved.get("namespace", ""), involved.get("name", ""), e.get("reason", ""))] += (
            e.get("count") or 1)
    over = {k: n for k, n in totals.items() if n > 20}
    repeated = of_kind(found, "repeated-event")
    assert repeated and len(repeated) == min(len(over), common.MAX_GROUPS)
    for item in repeated:
        key = (item["objects"][0]["namespace"], item["objects"][0]["name"], item["reason"])
        assert item["count"] == over[key]
    assert min(i["count"] for i in repeated) >= sorted(over.values())[-len(repeated)]

    # bursts of Warning Events: each counts the Warning Events of its reason in its minutes,
    # an Event's count spread evenly over the minutes from its first time to its last; none
    # ends after the capture
    def spread(event: dict) -> list[datetime]:
        first, last = times_of(event)
        start = first.replace(second=0, microsecond=0)
        k = int((last.replace(second=0, microsecond=0) - start) / timedelta(minutes=1)) + 1
        n = event.get("count") or 1
        units = ([j * k // n for j in range(n)] if n <= k else
                 [i for i in range(k) for _ in range(n * (i + 1) // k - n * i // k)])
        return [start + timedelta(minutes=m) for m in units]

    bursts = of_kind(found, "warning-burst")
    assert bursts
    spreads = [e for e in events if e.get("type") == "Warning" and (e.get("count") or 1) > 1
               and times_of(e)[1] - times_of(e)[0] >= timedelta(minutes=2)]
    assert spreads  # Events seen over minutes, whose counts are spread
    capture = parse_time(bursts[0]["capture"])
    for item in bursts:
        start, end = parse_time(item["start"]), parse_time(item["end"])
        assert end <= capture + timedelta(microseconds=1)
        assert item["count"] == sum(1 for e in events if e.get("type") == "Warning"
                                    and e.get("reason") == item["reason"]
                                    for minute in spread(e) if start <= minute < end)


def test_must_gather_etcd_logs_give_their_slow_requests_as_one_finding(must_gather_files,
                                                                      tmp_path):
    files = {n: d for n, d in must_gather_files.items()
             if ETCD_LOG.search(n) or n.endswith("/timestamp")}
    slow = [line for n, d in files.items() if ETCD_LOG.search(n)
            for line in d.decode().splitlines() if "took too long" in line]
    assert slow
    incident = ingest(make_bundle(tmp_path / "mg-etcd.tar.gz", files), "must-gather etcd")
    found = of_kind(insights.compute(incident.pk), "log-errors")
    (item,) = [i for i in found if i["shape"] == "etcd took too long"]
    assert item["count"] == len(slow) and item["component"] == "etcd"
    # each line's time is the runtime's (CRI) prefix, to the microsecond
    times = sorted(datetime.strptime(line.split(" ", 1)[0][:26], "%Y-%m-%dT%H:%M:%S.%f")
                   .replace(tzinfo=UTC) for line in slow)
    assert parse_time(item["start"]) == times[0] and parse_time(item["end"]) == times[-1]
    assert item["event_count"] == len(slow)
    assert item["filters"] == {"kind": ["log"], "component": ["etcd"]}


def test_a_restart_known_from_backoff_events_links_the_container_error_lines_around_it(
        must_gather_files, tmp_path):
    files = {n: d for n, d in must_gather_files.items() if n.endswith("/timestamp") or (
        INGRESS in n and n.endswith((".log", "/events.yaml")))}  # no objects: Events only
    backoffs = [e for e in events_of(files) if e.get("reason") == "BackOff"
                and e["involvedObject"]["name"].startswith("ingress-operator-")]
    assert backoffs
    pod = backoffs[0]["involvedObject"]["name"]
    container = re.search(r"\{(.+)\}", backoffs[0]["involvedObject"]["fieldPath"]).group(1)
    start = min(times_of(e)[0] for e in backoffs) - problems.LOG_SLACK
    end = max(times_of(e)[1] for e in backoffs) + problems.LOG_SLACK
    # the container's own lines in that span that say an error (klog E, zap ERROR)
    errors = [line for n, d in files.items() if f"/{pod}/{container}/" in n
              for line in d.decode().splitlines()
              if re.match(r"\S+ (E\d{4} |\S+\tERROR\t)", line)
              and start <= datetime.strptime(line[:26], "%Y-%m-%dT%H:%M:%S.%f").replace(
                  tzinfo=UTC) <= end]
    assert errors
    incident = ingest(make_bundle(tmp_path / "ingress.tar.gz", files), "ingress-operator")

    (item,) = [i for i in of_kind(insights.compute(incident.pk), "container-restarts")
               if i["owner"]["name"] == "ingress-operator"]
    assert "log" in item["evidence"]
    lines = Event.objects.filter(pk__in=item["events"], kind="log")
    assert 0 < lines.count() <= 20
    for line in lines:
        assert f"/{pod}/{container}/" in line.source and start <= line.received <= end
        assert line.severity in ("error", "fatal", "")


STATE_NAMESPACES = ("openshift-ingress-operator", "openshift-monitoring",
                    "openshift-cluster-csi-drivers", "openshift-service-ca")


def test_must_gather_pods_give_every_container_restart_at_its_finish(must_gather_files,
                                                                     tmp_path):
    files = {n: d for n, d in must_gather_files.items() if n.endswith("/timestamp") or (
        n.endswith("/core/pods.yaml") and any(f"/namespaces/{ns}/" in n
                                               for ns in STATE_NAMESPACES))}
    # every regular container whose last state is a termination restarted after it
    expected = {}
    for name, data in files.items():
        if name.endswith("/pods.yaml"):
            for pod in (yaml.load(data, Loader=Loader) or {}).get("items") or []:
                for status in (pod.get("status") or {}).get("containerStatuses") or []:
                    ended = (status.get("lastState") or {}).get("terminated")
                    if ended:
                        expected[(pod["metadata"]["name"], status["name"])] = (
                            parse_time(ended["finishedAt"]), ended.get("reason") or "",
                            ended.get("exitCode"), status.get("restartCount"))
    assert expected
    incident = ingest(make_bundle(tmp_path / "mg-pods.tar.gz", files), "must-gather pods")
    assert Event.objects.filter(incident=incident, kind="state", reason="Snapshot").exists()
    found = insights.compute(incident.pk)

    facts = {(f["pod"], f["container"]): f for i in found
             if i["kind"] in ("container-restarts", "oom-kill") for f in i["facts"]
             if f["last"]}
    assert set(facts) == set(expected)
    for key, (finished, reason, code, restarts) in expected.items():
        fact = facts[key]
        assert fact["finished"] == common.rfc3339(finished), key
        assert (fact["reason"], fact["exit_code"], fact["restarts"]) == (reason, code, restarts)
    ingress = [i for i in of_kind(found, "container-restarts")
               if i["owner"] == {"resource": "deployments", "name": "ingress-operator",
                                 "namespace": "openshift-ingress-operator"}]
    assert len(ingress) == 1 and ingress[0]["severity"] == "warning"


@pytest.mark.parametrize(("bundle", "kinds"), [
    (TROUBLESHOOT, {"probe-failure"}), (SONOBUOY, {"probe-failure", "unschedulable"})],
    ids=["troubleshoot", "sonobuoy"])
def test_other_bundles_get_findings_for_their_warning_events(bundle, kinds):
    incident = ingest(bundle, bundle.name)
    found = insights.compute(incident.pk)
    warnings: dict[str, dict] = {}
    with tarfile.open(bundle) as archive:
        for member in archive:
            if not member.isfile() or not member.name.endswith(".json"):
                continue
            try:
                data = orjson.loads(archive.extractfile(member).read())
            except orjson.JSONDecodeError:
                continue
            items = data.get("items") if isinstance(data, dict) else data
            for event in items if isinstance(items, list) else []:
                if isinstance(event, dict) and "involvedObject" in event and event.get(
                        "type") == "Warning":
                    warnings[event["metadata"]["uid"]] = event
    for kind, reasons in REASONS.items():
        expected = [e for e in warnings.values() if e["reason"] in reasons]
        assert bool(expected) == (kind in kinds), kind
        made = of_kind(found, kind)  # (and what the objects' state says, once it is read)
        assert sum(n for i in made for r, n in i["reasons"].items() if r in reasons) == sum(
            e.get("count") or 1 for e in expected)
        assert {e["involvedObject"]["name"] for e in expected} <= {
            o["name"] for i in made for o in i["objects"]}


def test_the_parts_of_kinds_an_incident_lacks_read_nothing(falco, incident, monkeypatch):
    """An incident holding some kinds of evidence only (the falco requests; the sonobuoy
    bundle: Events, object state and logs, no request) gets the same insights as when every
    part reads, and the parts of the kinds it lacks send no query."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    sonobuoy = ingest(SONOBUOY, SONOBUOY.name)
    lacking = {incident.pk: ("'event'", "'log'", "'state'"), sonobuoy.pk: ("'audit'",)}
    held = {incident.pk: {"audit"}, sonobuoy.pk: {"event", "state", "log"}}
    for pk, kinds in lacking.items():
        with CaptureQueriesContext(connection) as queries:
            found = insights.compute(pk)
        assert set(insights.kinds_of(Event.objects.filter(incident_id=pk))()) >= held[pk]
        reads = [q["sql"] for q in queries.captured_queries if "timelines_event" in q["sql"]]
        assert reads and not [sql for sql in reads for kind in kinds
                              if f'"kind" = {kind}' in sql or f"IN ({kind})" in sql], pk
        with monkeypatch.context() as every:
            every.setattr(insights, "kinds_of", lambda events: lambda: {
                "audit", "event", "log", "state", "trace"})
            assert insights.compute(pk) == found
    assert of_kind(insights.compute(sonobuoy.pk), "unschedulable")


@pytest.mark.embedded  # the demo computes its findings on SQLite
def test_bundle_findings_are_the_same_on_sqlite():
    test_other_bundles_get_findings_for_their_warning_events(
        SONOBUOY, {"probe-failure", "unschedulable"})


# --- state rows (the state-row contract) ---------------------------------------------------------

CAPTURE = datetime(2024, 6, 1, 12, 0, tzinfo=UTC)


def state(incident, n: int, reason: str, resource: str, name: str, at: datetime, *,
          namespace: str = "shop", **fields) -> Event:
    annotations = {"capture": common.rfc3339(CAPTURE), **fields.pop("annotations", {})}
    return Event(incident=incident, kind="state", audit_id=f"state:{n}", received=at,
                 completed=fields.pop("completed", at), resource=resource, namespace=namespace,
                 name=name, reason=reason, annotations=annotations,
                 severity=fields.pop("severity", "Normal"), **fields)


def snapshot(incident, n: int, resource: str, name: str, body: dict, *,
             namespace: str = "shop") -> Event:
    chunk = BodyChunk.objects.create(incident=incident, data=BodyChunk.pack(orjson.dumps(body)))
    return state(incident, n, "Snapshot", resource, name, CAPTURE, namespace=namespace,
                 body_chunk=chunk.pk, body_index=0)


@pytest.fixture
def states(incident) -> dict[str, Event]:
    t = CAPTURE - timedelta(hours=2)
    pod_a, pod_b = "web-7d9f8c6b5d-x2x4z", "web-7d9f8c6b5d-q5w7b"
    rows = {
        # a Deployment's two pods, both Ready at capture: one crashed 5 times, one OOM-killed
        "crash": state(incident, 1, "ContainerTerminated", "pods", pod_a, t,
                       completed=t + timedelta(minutes=3), component="app", code=1, count=5,
                       message="app: Error exit code 1", severity="Warning", node="n1",
                       annotations={"container": "app", "last": True}),
        "oom": state(incident, 2, "ContainerTerminated", "pods", pod_b, t,
                     completed=t + timedelta(minutes=10), component="app", code=137, count=1,
                     message="app: OOMKilled exit code 137", severity="Warning", node="n1",
                     annotations={"container": "app", "last": True}),
        "done": state(incident, 3, "ContainerTerminated", "pods", "job-x-abc12", t,
                      component="main", code=0, message="main: Completed exit code 0"),
        # an init container that ended well: no restart; an operator that exited cleanly and
        # was started again twice: a restart all the same, as information
        "init": state(incident, 18, "ContainerTerminated", "pods", "web-7d9f8c6b5d-x2x4z", t,
                      component="setup", code=0, message="setup: Completed exit code 0",
                      annotations={"container": "setup", "init": True}),
        "clean": state(incident, 19, "ContainerTerminated", "pods", "op-6b7c8d9f5b-k2m4n", t,
                       completed=t + timedelta(minutes=1), component="op", code=0, count=2,
                       message="op: Completed exit code 0",
                       annotations={"container": "op", "last": True}),
        "restarted": state(incident, 20, "ContainerStarted", "pods", "op-6b7c8d9f5b-k2m4n",
                           t + timedelta(minutes=2), component="op", count=2,
                           annotations={"container": "op"}),
        "again": state(incident, 21, "ContainerStarted", "pods", "agent-4xq2z",
                       t + timedelta(minutes=2), component="agent", count=3, namespace="infra",
                       annotations={"container": "agent"}),
        "ready_a": state(incident, 4, "Ready=True", "pods", pod_a, t + timedelta(minutes=5)),
        "ready_b": state(incident, 5, "Ready=True", "pods", pod_b, t + timedelta(minutes=11)),
        "loop": state(incident, 6, "ContainerWaiting", "pods", "db-0", CAPTURE, component="pg",
                      count=7, message="pg: CrashLoopBackOff", severity="Warning"),
        "pending": state(incident, 7, "PodScheduled=False", "pods", "big-0",
                         t + timedelta(minutes=30), severity="Warning",
                         message="Unschedulable: 0/3 nodes are available: 3 Insufficient cpu."),
        "stuck": state(incident, 8, "DeletionRequested", "pods", "old-1", t, severity="Warning"),
        "node_down": state(incident, 9, "Ready=False", "nodes", "n2", t + timedelta(minutes=50),
                           namespace="", severity="Warning",
                           message="KubeletNotReady: container runtime is down"),
        "node_ok": state(incident, 10, "Ready=True", "nodes", "n1", t, namespace=""),
        "node_drained": state(incident, 11, "Ready=Unknown", "nodes", "n3", t,
                              namespace="", severity="Warning", message="NodeStatusUnknown: "),
        "degraded": state(incident, 12, "Degraded=True", "clusteroperators", "authentication",
                          t + timedelta(minutes=20), namespace="", severity="Warning",
                          message="OAuthServerDown: route not ready"),
        "available": state(incident, 13, "Available=True", "clusteroperators", "dns", t,
                           namespace=""),
        "deploy_cond": state(incident, 14, "Available=False", "deployments", "api",
                             t + timedelta(minutes=40), severity="Warning",
                             message="MinimumReplicasUnavailable: Deployment does not have "
                                     "minimum availability."),
        "upgrade": state(incident, 15, "VersionUpdate", "clusterversions", "version", t,
                         completed=t + timedelta(minutes=45), namespace="",
                         message="4.8.2"),
        "deploy": snapshot(incident, 16, "deployments", "api",
                           {"kind": "Deployment", "spec": {"replicas": 3},
                            "status": {"readyReplicas": 1}}),
        "deploy_ok": snapshot(incident, 17, "deployments", "web",
                              {"kind": "Deployment", "spec": {"replicas": 2},
                               "status": {"readyReplicas": 2}}),
    }
    backoff = Event(incident=incident, kind="event", audit_id="event:b1",
                    received=t + timedelta(minutes=1), completed=t + timedelta(minutes=4),
                    resource="pods", namespace="shop", name=pod_a, reason="BackOff",
                    severity="Warning", count=4, message="Back-off restarting failed container")
    pull = Event(incident=incident, kind="event", audit_id="event:p1", received=t,
                 completed=t + timedelta(minutes=2), resource="pods", namespace="shop",
                 name="cache-5f6d7c8b9d-z9x8w", reason="Failed", severity="Warning", count=3,
                 message="Failed to pull image \"redis:9\": rpc error: code = NotFound desc = "
                         "manifest unknown")
    drain = Event(incident=incident, kind="event", audit_id="event:d1", received=t,
                  completed=t, resource="nodes", name="n3", reason="NodeNotSchedulable",
                  severity="Normal", count=1, message="Node n3 status is now: NodeNotSchedulable")
    log = Event(incident=incident, kind="log", audit_id="log:1",
                received=t + timedelta(minutes=3, seconds=-2), severity="error",
                component="app", message="fatal: cannot connect", resource="pods",
                namespace="shop", name=pod_a,  # a pod's lines carry it (parsers.base.pod_object)
                source=f"namespaces/shop/pods/{pod_a}/app/app/logs/previous.log")
    Event.objects.bulk_create([*rows.values(), backoff, pull, drain, log])
    rows.update(backoff=backoff, pull=pull, drain=drain, log=log)
    return rows


def test_a_termination_links_the_log_lines_nearest_it(incident, states):
    """Of a container's lines around its termination, the ones linked are those nearest it,
    where the crash is told, not the first of the window (a start-up's INFO lines)."""
    from timelines.analysis.states import LINKED_LINES

    crash = states["crash"]
    source = states["log"].source
    early = [Event(incident=incident, kind="log", audit_id=f"log:early{n}",
                   received=crash.completed - timedelta(seconds=59) + timedelta(seconds=n),
                   severity="info", component="app", message=f"starting {n}", source=source)
             for n in range(30)]
    Event.objects.bulk_create(early)
    lines = [*early, states["log"]]
    nearest = sorted(lines, key=lambda e: abs(e.received - crash.completed))[:LINKED_LINES]

    found = insights.compute(incident.pk)

    (finding,) = [i for i in of_kind(found, "container-restarts")
                  if i["owner"]["name"] == "web"]
    (fact,) = finding["facts"]
    assert fact["logs"] == [e.pk for e in sorted(nearest, key=lambda e: e.received)]
    assert states["log"].pk in fact["logs"]  # the error just before the end
    assert early[0].pk not in fact["logs"]


def test_a_termination_links_its_pods_lines_whatever_the_layout(incident, states):
    """A pod's lines carry it as their object (``parsers.base.pod_object``): they are linked to
    its container's termination in any layout's paths (sonobuoy's ``podlogs/…/logs/app.txt``),
    not only a must-gather's; a line of the same container name in another pod is not."""
    crash = states["crash"]
    near = crash.completed - timedelta(seconds=5)
    mine = Event(incident=incident, kind="log", audit_id="log:sono", received=near,
                 severity="error", component="app", message="panic: boom", resource="pods",
                 namespace="shop", name=crash.name,
                 source=f"podlogs/shop/{crash.name}/logs/app.txt")
    other = Event(incident=incident, kind="log", audit_id="log:other", received=near,
                  severity="error", component="app", message="panic: elsewhere",
                  resource="pods", namespace="shop", name="web-7d9f8c6b5d-zzzzz",
                  source="podlogs/shop/web-7d9f8c6b5d-zzzzz/logs/app.txt")
    Event.objects.bulk_create([mine, other])

    found = insights.compute(incident.pk)

    (finding,) = [i for i in of_kind(found, "container-restarts")
                  if i["owner"]["name"] == "web"]
    (fact,) = finding["facts"]
    assert mine.pk in fact["logs"] and states["log"].pk in fact["logs"]
    assert other.pk not in fact["logs"]


def test_state_rows_make_findings_with_times_owners_and_ages(incident, states):
    found = insights.compute(incident.pk)
    kinds = Counter(i["kind"] for i in found)
    capture = common.rfc3339(CAPTURE)

    (crash,) = [i for i in of_kind(found, "container-restarts")
                if i["owner"]["name"] == "web"]
    assert crash["owner"] == {"resource": "deployments", "namespace": "shop", "name": "web"}
    assert crash["objects"] == [{"resource": "pods", "namespace": "shop",
                                 "name": "web-7d9f8c6b5d-x2x4z"}]
    # the BackOff Event, the termination and the log line before it: one problem, one finding
    assert set(crash["events"]) == {states["crash"].pk, states["backoff"].pk, states["log"].pk}
    assert crash["start"] == common.rfc3339(states["crash"].received)
    assert crash["end"] == common.rfc3339(states["backoff"].completed)
    assert crash["capture"] == capture
    assert crash["age_s"] == (CAPTURE - states["backoff"].completed).total_seconds()
    (fact,) = crash["facts"]
    assert fact["reason"] == "Error" and fact["exit_code"] == 1 and fact["restarts"] == 5
    assert fact["finished"] == common.rfc3339(states["crash"].completed)
    assert fact["logs"] == [states["log"].pk]
    assert "1 of 1 pods Ready at capture" in crash["explanation"]
    assert "app in web-7d9f8c6b5d-x2x4z restarted 5 times" in crash["explanation"]

    (oom,) = of_kind(found, "oom-kill")
    assert oom["severity"] == "critical" and oom["owner"]["name"] == "web"
    assert oom["facts"][0]["exit_code"] == 137 and oom["facts"][0]["reason"] == "OOMKilled"
    assert oom["end"] == common.rfc3339(states["oom"].completed)

    (loop,) = [i for i in of_kind(found, "container-restarts") if i["owner"]["name"] == "db"]
    assert loop["owner"]["resource"] == "statefulsets" and loop["reasons"] == {
        "CrashLoopBackOff": 1}
    (pending,) = of_kind(found, "unschedulable")
    assert "Insufficient cpu" in pending["explanation"] and pending["age_s"] == 0
    assert pending["start"] == common.rfc3339(states["pending"].received)
    assert of_kind(found, "stuck-terminating")[0]["objects"][0]["name"] == "old-1"
    (pull,) = of_kind(found, "image-pull")  # by cause
    assert pull["owner"]["name"] == "cache" and pull["reasons"] == {"image not found": 3}

    nodes = {i["objects"][0]["name"]: i for i in of_kind(found, "node-condition")}
    assert set(nodes) == {"n2", "n3"}  # n1 is Ready
    assert nodes["n2"]["severity"] == "critical"
    assert nodes["n2"]["start"] == common.rfc3339(states["node_down"].received)
    assert "unexpected" in nodes["n2"]["explanation"]
    assert "planned" in nodes["n3"]["explanation"]  # a NodeNotSchedulable Event on it

    operators = of_kind(found, "operator-condition")
    (degraded,) = [i for i in operators if i["objects"][0]["name"] == "authentication"]
    assert degraded["severity"] == "warning" and degraded["facts"][0]["since"] == \
        common.rfc3339(states["degraded"].received)
    (upgrade,) = [i for i in operators if i["objects"][0]["resource"] == "clusterversions"]
    assert upgrade["windows"][0]["end"] == common.rfc3339(states["upgrade"].completed)

    workloads = of_kind(found, "workload-unavailable")
    replicas = [i for i in workloads if "desired" in i]
    assert [(i["objects"][0]["name"], i["ready"], i["desired"]) for i in replicas] == [
        ("api", 1, 3)]
    assert any(i.get("facts") and i["facts"][0]["condition"] == "Available" for i in workloads)
    (clean,) = [i for i in of_kind(found, "container-restarts") if i["owner"]["name"] == "op"]
    assert clean["severity"] == "info" and clean["facts"][0]["reason"] == "Completed"
    assert "op in op-6b7c8d9f5b-k2m4n restarted 2 times" in clean["explanation"]
    (again,) = [i for i in of_kind(found, "container-restarts")
                if i["owner"]["namespace"] == "infra"]
    assert again["reasons"] == {"restarted": 1} and "restarted 3 times" in again["explanation"]
    assert kinds["container-restarts"] == 4  # web, db, op, agent: not the init container

    # the page's API serves them, each naming its events
    client_found = sorted(found, key=lambda i: i["id"])
    assert [i["kind"] for i in client_found] == [i["kind"] for i in found]


def test_a_findings_filters_select_its_objects_not_their_namespace(api, incident, states):
    """A finding on several pods of one owner filters on those pods (a repeated filter ORs its
    values): the events list shows their evidence, not every Event of the namespace."""
    t = CAPTURE - timedelta(hours=2)
    again = state(incident, 30, "ContainerTerminated", "pods", states["oom"].name,
                  t + timedelta(minutes=20), completed=t + timedelta(minutes=21),
                  component="app", code=2, count=1, message="app: Error exit code 2",
                  severity="Warning", node="n1",
                  annotations={"container": "app", "last": True})
    again.save()
    (finding,) = [i for i in of_kind(insights.compute(incident.pk), "container-restarts")
                  if i["owner"]["name"] == "web"]
    pods = {o["name"] for o in finding["objects"]}
    assert len(pods) == 2
    assert finding["filters"]["name"] == sorted(pods)
    listed = api(f"/api/v1/incidents/{incident.pk}/events/",
                 {**finding["filters"], "page_size": 1000}).json()["results"]
    assert listed and {e["name"] for e in listed} == pods
    assert states["pull"].pk not in {e["id"] for e in listed}  # another pod of the namespace
    assert set(finding["events"]) <= {e["id"] for e in listed}


def test_findings_are_listed_by_the_insights_api(client, owner, incident, states):
    client.force_login(owner)
    response = client.get(reverse("incident-insights", args=[incident.pk]))
    assert response.status_code == 200
    kinds = {i["kind"] for i in response.json()}
    assert {"container-restarts", "oom-kill", "node-condition", "operator-condition",
            "workload-unavailable", "unschedulable"} <= kinds
    for item in response.json():
        if item["kind"] in findings.KINDS:
            assert {"start", "end", "objects"} <= set(item), item["kind"]


def test_objects_whose_events_count_the_same_are_listed_in_one_order(incident):
    """Repeated Events of equal counts are listed by object (they came in the order of the
    database's plan: two runs could list, and cut at MAX_GROUPS, different ones)."""
    names = [f"pod-{n:02d}" for n in range(common.MAX_GROUPS + 10)]
    Event.objects.bulk_create([
        Event(incident=incident, audit_id=f"e{n}", received=datetime(2024, 5, 1, tzinfo=UTC),
              kind="event", resource="pods", namespace="shop", name=name, reason="BackOff",
              count=25) for n, name in enumerate(reversed(names))])
    rows = findings.repeated_rows(Event.objects.filter(incident=incident))
    assert [row["name"] for row in rows] == names[:common.MAX_GROUPS]
