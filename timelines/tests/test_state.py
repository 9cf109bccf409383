"""Objects in bundles as evidence of state (issue 19): snapshots and time points of kind
``state``, on the real must-gather, troubleshoot and sonobuoy bundles. Expectations are computed
from the files themselves."""

from __future__ import annotations

import io
import json
import tarfile
from datetime import UTC, datetime
from io import StringIO
from pathlib import Path

import pytest
import yaml
from django.core.management import call_command

from incidents.models import Upload
from timelines.models import Event
from timelines.parsers import Redactor, Report, detect, read_head
from timelines.parsers.base import ParseHints
from timelines.parsers.events import capture_time
from timelines.parsers.events.state import BAD_WAITING, severity_of_condition

BUNDLES = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "bundles"
MUST_GATHER = BUNDLES / "openshift-must-gather-aws.tar.xz"
WANTED = ("/core/pods.yaml", "/clusteroperators.yaml", "/clusterversions.yaml",
          "/core/secrets.yaml", "/timestamp")
OWN_FILES = ("/namespaces/openshift-ingress-operator/pods/",
             "/cluster-scoped-resources/core/nodes/")


def to_utc(value: str) -> datetime:
    return datetime.fromisoformat(value).astimezone(UTC)


@pytest.fixture(scope="module")
def gather(tmp_path_factory) -> dict[str, Path]:
    """The must-gather's object files this module reads, extracted: {path in bundle: file}."""
    out = tmp_path_factory.mktemp("must-gather")
    found = {}
    with tarfile.open(MUST_GATHER) as tar:
        for member in tar:
            if member.isfile() and (member.name.endswith(WANTED) or member.name.endswith(
                    ".yaml") and any(part in member.name for part in OWN_FILES)):
                target = out / f"{len(found)}-{member.name.rsplit('/', 1)[-1]}"
                target.write_bytes(tar.extractfile(member).read())
                found[member.name] = target
    return found


@pytest.fixture(scope="module")
def collected(gather) -> datetime:
    """The capture time as the must-gather records it: its latest ``timestamp`` line."""
    times = []
    for name, path in gather.items():
        if name.endswith("/timestamp"):
            for line in path.read_text().splitlines():
                day, clock, zone = line.split()[:3]
                clock = clock[:15]  # microseconds
                times.append(datetime.fromisoformat(f"{day}T{clock}{zone[:3]}:{zone[3:]}"))
    return max(times).astimezone(UTC)


def read(path: Path, capture: datetime | None = None, name: str = "") -> tuple[list, Report]:
    report = Report(name or path.name)
    parser = detect(read_head(path), path.name)
    assert parser is not None and parser.name in ("k8s-objects", "k8s-events"), path
    with path.open("rb") as handle:
        rows = list(parser.parse(handle, report, Redactor(),
                                 hints=ParseHints(collected=capture, year_reason="collection "
                                                  "time from the must-gather timestamp file")))
    return rows, report


def items(path: Path) -> list[dict]:
    return [item for doc in yaml.load_all(path.read_bytes(), Loader=yaml.CSafeLoader) if doc
            for item in (doc.get("items") or [doc] if doc.get("kind", "").endswith("List")
                         or "items" in doc else [doc])]


def test_every_terminated_container_of_every_pod_is_a_span_with_its_exit(gather, collected):
    pods_files = [p for n, p in gather.items() if n.endswith("/core/pods.yaml")]
    assert len(pods_files) > 40
    expected, seen = set(), set()
    for path in pods_files:
        rows, report = read(path, collected)
        assert report.skipped == 0, report.errors
        for row in rows:
            if row.reason == "ContainerTerminated":
                assert row.code is None  # the HTTP status column: the exit code is apart
                seen.add((row.name, row.component, row.annotations["last"], row.received,
                          row.completed, row.annotations["exit_code"], row.count, row.message,
                          row.severity))
        for pod in items(path):
            for key in ("initContainerStatuses", "containerStatuses"):
                for status in pod.get("status", {}).get(key) or []:
                    for holder, last in (("state", False), ("lastState", True)):
                        done = (status.get(holder) or {}).get("terminated")
                        if not done:
                            continue
                        bad = done.get("reason") != "Completed" or done.get("exitCode") != 0
                        expected.add((
                            pod["metadata"]["name"], status["name"], last,
                            to_utc(done["startedAt"]), to_utc(done["finishedAt"]),
                            done.get("exitCode"), status.get("restartCount"),
                            f"{status['name']}: {done.get('reason')} exit code "
                            f"{done.get('exitCode')}", "Warning" if bad else "Normal"))
    assert expected and seen == expected
    # The example: ingress-operator restarted 5 times, last exit Error.
    assert any(e[1] == "ingress-operator" and e[2] and e[6] == 5 and "Error" in e[7]
               for e in expected)


def test_every_condition_is_a_time_point_judged_by_polarity(gather, collected):
    path = next(p for n, p in gather.items() if n.endswith("/clusteroperators.yaml"))
    rows, _ = read(path, collected)
    got = {(r.name, r.reason, r.received, r.severity, r.message) for r in rows
           if "condition" in r.annotations}
    expected = set()
    for operator in items(path):
        for c in operator["status"].get("conditions") or []:
            text = ": ".join(x for x in (c.get("reason"), c.get("message")) if x)
            expected.add((operator["metadata"]["name"], f"{c['type']}={c['status']}",
                          to_utc(c["lastTransitionTime"]),
                          severity_of_condition("clusteroperators", c["type"], c["status"]),
                          text))
    assert got == expected and len(expected) > 100
    assert severity_of_condition("clusteroperators", "Degraded", "True") == "Warning"
    assert severity_of_condition("clusteroperators", "Available", "False") == "Warning"
    assert severity_of_condition("clusteroperators", "Progressing", "False") == "Normal"
    assert severity_of_condition("deployments", "Progressing", "False") == "Warning"
    assert {r.resource for r in rows} == {"clusteroperators"}
    assert {r.api_group for r in rows} == {"config.openshift.io"}


def test_each_object_has_one_snapshot_at_the_capture_time_with_its_identity(gather, collected):
    paths = [p for n, p in gather.items() if "/core/nodes/" in n]
    rows = [row for path in paths for row in read(path, collected)[0]]
    snapshots = {r.name: r for r in rows if r.reason == "Snapshot"}
    nodes = [node for path in paths for node in items(path)]
    assert len(nodes) == len(paths) > 2
    assert set(snapshots) == {n["metadata"]["name"] for n in nodes}
    for node in nodes:
        row = snapshots[node["metadata"]["name"]]
        assert row.received == row.completed == collected
        assert (row.kind, row.resource, row.object_uid, row.resource_version) == (
            "state", "nodes", node["metadata"]["uid"], node["metadata"]["resourceVersion"])
        assert json.loads(row.raw)["status"]["nodeInfo"] == node["status"]["nodeInfo"]
        assert row.annotations == {"capture": collected.isoformat()}
    created = {r.name: r.received for r in rows if r.reason == "Created"}
    assert created == {n["metadata"]["name"]: to_utc(n["metadata"]["creationTimestamp"])
                       for n in nodes}


def test_a_pod_in_its_list_and_in_its_own_file_gives_the_same_facts(gather, collected):
    listed, _ = read(next(p for n, p in gather.items()
                          if n.endswith("openshift-ingress-operator/core/pods.yaml")), collected)
    own = [p for n, p in gather.items() if "/openshift-ingress-operator/pods/" in n]
    assert own
    for path in own:
        rows, _ = read(path, collected)
        keys = {(r.audit_id, r.received) for r in rows}
        assert keys and keys <= {(r.audit_id, r.received) for r in listed}
    node = {r.node for r in listed if r.resource == "pods"}
    assert node and "" not in node


def test_secret_values_are_redacted_in_snapshots(gather, collected):
    path = next(p for n, p in gather.items() if n.endswith("/core/secrets.yaml"))
    rows, report = read(path, collected)
    secrets = [s for s in items(path) if s.get("data")]
    assert secrets and report.redacted >= sum(len(s["data"]) for s in secrets)
    for row in rows:
        body = json.loads(row.raw)
        for key, value in (body.get("data") or {}).items():
            assert value == "[REDACTED]", key


def test_cluster_version_history_and_capture_time_from_the_objects(gather):
    path = next(p for n, p in gather.items() if n.endswith("/clusterversions.yaml"))
    rows, report = read(path, None)  # no capture record: the latest time of the objects
    (version,) = items(path)
    history = {(r.received, r.completed, r.message) for r in rows if r.reason == "VersionUpdate"}
    assert history == {(to_utc(h["startedTime"]),
                        to_utc(h["completionTime"]) if h.get("completionTime") else None,
                        f"{h['version']} {h['state']}") for h in version["status"]["history"]}
    latest = max(t for r in rows if r.reason != "Snapshot" for t in (r.received, r.completed)
                 if t is not None)
    (snapshot,) = [r for r in rows if r.reason == "Snapshot"]
    assert snapshot.received == latest
    assert any("latest time found in the objects" in note for note in report.notes)


def test_capture_time_is_never_the_archive_file_times():
    when = datetime(2021, 8, 3, tzinfo=UTC)
    assert capture_time(ParseHints(collected=when, year_reason="collection time 2021-08-03 "
                                   "from the must-gather timestamp file")) == when
    assert capture_time(ParseHints(collected=when, year_reason="collection time 2021-08-03 "
                                   "from the bundle's file times")) is None
    assert capture_time(None) is None


def test_a_waiting_container_and_a_stuck_deletion_are_warnings_at_capture():
    capture = "2024-01-02T03:04:05Z"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "web", "namespace": "ns", "uid": "u1", "creationTimestamp": "2024-01-01T00:00:00Z",
        "deletionTimestamp": "2024-01-02T00:00:00Z"},
        "spec": {"nodeName": "n1"},
        "status": {"containerStatuses": [{"name": "app", "restartCount": 7, "state": {
            "waiting": {"reason": "CrashLoopBackOff"}}}]}}
    report = Report("pod.json")
    parser = detect(json.dumps(pod).encode(), "pod.json")
    assert parser.name == "k8s-objects"
    rows = list(parser.parse(io.BytesIO(json.dumps(pod).encode()), report, Redactor(),
                             hints=ParseHints(collected=to_utc(capture))))
    by = {r.reason: r for r in rows}
    assert "CrashLoopBackOff" in BAD_WAITING
    waiting = by["ContainerWaiting"]
    assert (waiting.received, waiting.severity, waiting.message, waiting.count, waiting.node,
            waiting.component) == (to_utc(capture), "Warning", "app: CrashLoopBackOff", 7, "n1",
                                   "app")
    assert waiting.annotations == {"container": "app", "init": False, "last": False,
                                   "capture": to_utc(capture).isoformat()}
    assert by["DeletionRequested"].severity == "Warning"
    assert {r.verb for r in rows} == {""} and {r.kind for r in rows} == {"state"}


# --- file outcomes of whole bundles -------------------------------------------------------------

def _ingest(path: Path) -> tuple[dict, int]:
    out = StringIO()
    try:
        call_command("ingest", str(path), incident=path.name, json=True, wait_complete=True,
                     stdout=out, stderr=StringIO())
        code = 0
    except SystemExit as exc:
        code = exc.code
    except Exception:  # CommandError: a file failed
        code = 1
    return json.loads(out.getvalue().strip().splitlines()[-1]), code


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", ["troubleshoot-supportbundle-baseline.tar.gz",
                                  "sonobuoy-results-0.10.tar.gz"])
def test_a_real_bundle_has_no_failed_file_and_its_objects_become_state(name):
    path = BUNDLES / name
    summary, code = _ingest(path)

    entries = summary["uploads"]
    assert [e for e in entries if e["status"] == "failed"] == [] and code == 0
    with tarfile.open(path) as tar:
        links = {m.name for m in tar.getmembers() if m.issym() or m.islnk()}
        empty = set()
        for member in tar.getmembers():
            if member.isfile() and member.name.endswith(".json"):
                try:
                    doc = json.loads(tar.extractfile(member).read())
                except ValueError:
                    continue
                if isinstance(doc, dict) and "items" in doc and not doc["items"]:
                    empty.add(member.name)
    by_name = {e["name"]: e for e in entries}
    for link in links:
        found = [e for n, e in by_name.items() if n.endswith(link.split("/", 1)[-1])]
        assert found and all(e["status"] == "skipped" for e in found), link
    for member in empty:
        found = [e for n, e in by_name.items() if n.endswith(member.split("/", 1)[-1])]
        assert found and all((e["status"], e["events"]) == ("done", 0) for e in found), member
    state = Event.objects.filter(kind="state")
    assert state.filter(reason="Snapshot").exists()
    assert not Upload.objects.filter(status=Upload.Status.FAILED).exists()


def test_kindless_objects_of_the_raw_api_are_named_by_their_self_link(tmp_path):
    with tarfile.open(BUNDLES / "sonobuoy-results-0.10.tar.gz") as tar:
        names = [m.name for m in tar.getmembers() if m.isfile() and "/resources/" in
                 f"/{m.name}" and m.name.endswith(("Nodes.json", "CertificateSigningRequests.json",
                                                   "ReplicaSets.json"))]
        files = {name: tar.extractfile(name).read() for name in names}
    assert len(files) >= 3
    for name, data in files.items():
        path = tmp_path / name.rsplit("/", 1)[-1]
        path.write_bytes(data)
        objects = json.loads(data)
        rows, _ = read(path, datetime(2018, 1, 1, tzinfo=UTC))
        snapshots = [r for r in rows if r.reason == "Snapshot"]
        assert {(r.name, r.object_uid) for r in snapshots} == {
            (o["metadata"]["name"], o["metadata"]["uid"]) for o in objects}
        # /api/v1/nodes/x → nodes of v1; /apis/apps/v1beta2/…/replicasets/x → replicasets
        links = {o["metadata"]["selfLink"].split("/")[-2] for o in objects}
        assert {r.resource for r in rows} == links


def test_a_snapshot_is_a_version_of_its_object_and_a_time_point_is_not(gather, collected):
    from timelines.reads.diff import NoVersion, diff, object_version

    path = next(p for n, p in gather.items() if n.endswith("/clusteroperators.yaml"))
    rows, _ = read(path, collected)
    snapshots = [r for r in rows if r.reason == "Snapshot"]
    first, second = (object_version(json.loads(r.raw)) for r in snapshots[:2])
    assert first["metadata"]["name"] == snapshots[0].name
    changes, _ = diff(first, second)
    assert any(change["path"] == "metadata.name" for change in changes)
    with pytest.raises(NoVersion):
        object_version(json.loads(next(r for r in rows if r.reason == "Created").raw))


@pytest.mark.django_db
def test_pod_phases_come_from_snapshots_where_events_and_audit_are_silent(gather, incident,
                                                                           ingest_file, api):
    path = next(p for n, p in gather.items()
                if n.endswith("openshift-ingress-operator/core/pods.yaml"))
    assert ingest_file(incident, path).status == "done"

    answer = api(f"/api/v1/incidents/{incident.pk}/pods/")

    assert answer.status_code == 200, answer.content
    found = {pod["name"]: pod for pod in answer.json()}
    pods = items(path)
    assert pods and set(found) == {pod["metadata"]["name"] for pod in pods}
    for pod in pods:
        got = found[pod["metadata"]["name"]]
        status = pod["status"]
        when = {c["type"]: to_utc(c["lastTransitionTime"]) for c in status["conditions"]
                if c["status"] == "True"}
        starts = [to_utc(state[phase]["startedAt"]) for c in status["containerStatuses"]
                  for state in (c.get("state") or {}, c.get("lastState") or {})
                  for phase in ("running", "terminated") if phase in state]
        assert (got["uid"], got["node"]) == (pod["metadata"]["uid"], pod["spec"]["nodeName"])
        assert to_utc(got["created"]) == to_utc(pod["metadata"]["creationTimestamp"])
        assert to_utc(got["scheduled"]) == when["PodScheduled"]
        assert to_utc(got["ready"]) == when["Ready"]
        assert to_utc(got["started"]) == min(starts)
        assert got["restarts"] == max(c["restartCount"] for c in status["containerStatuses"])


@pytest.mark.django_db
def test_a_pod_done_at_capture_finished_at_its_last_container_end(gather, incident, ingest_file,
                                                                  api):
    path = next(p for n, p in gather.items() if n.endswith("/openshift-etcd/core/pods.yaml"))
    assert ingest_file(incident, path).status == "done"

    found = {pod["name"]: pod for pod in api(f"/api/v1/incidents/{incident.pk}/pods/").json()}

    pods = items(path)
    done = [pod for pod in pods if pod["status"]["phase"] in ("Succeeded", "Failed")]
    assert done and len(done) < len(pods)  # some finished, some still running
    for pod in pods:
        got = found[pod["metadata"]["name"]]
        status = pod["status"]
        ends = [to_utc(state["terminated"]["finishedAt"])
                for key in ("initContainerStatuses", "containerStatuses")
                for c in status.get(key) or []
                for state in (c.get("state") or {}, c.get("lastState") or {})
                if (state.get("terminated") or {}).get("finishedAt")]
        if pod in done:
            assert to_utc(got["finished"]) == max(ends)
            assert got["sources"]["finished"] == "state ContainerTerminated"
        else:
            assert got["finished"] is None
