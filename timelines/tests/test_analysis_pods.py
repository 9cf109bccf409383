"""Pod phases (``timelines.analysis.pods``, ``GET /api/v1/incidents/{id}/pods/``, the pod phases
page): each pod's created, scheduled, started, ready, finished and deleted times from Events
(read here from the fixture files with ``yaml``/``json``), from audit requests and status writes
(a log written here), from both at once, under filters and access rules.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
from datetime import UTC, datetime, timedelta

import pytest
import yaml
from django.db import connection
from django.test.utils import CaptureQueriesContext

from incidents.models import Incident
from timelines.analysis import pods

pytestmark = pytest.mark.django_db

MUST_GATHER = "bundles/openshift-must-gather-aws.tar.xz"


def _url(incident_id: int) -> str:
    return f"/api/v1/incidents/{incident_id}/pods/"


def _time(value) -> datetime | None:
    if value in (None, ""):
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _answer_time(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value.replace("Z", "+00:00"))


def _by_pod(answer: list[dict]) -> dict[tuple[str, str], dict]:
    return {(p["namespace"], p["name"]): p for p in answer}


def _by_life(answer: list[dict]) -> dict[tuple[str, str, str | None], dict]:
    return {(p["namespace"], p["name"], p["uid"]): p for p in answer}


# --- expectations read from Event objects -----------------------------------------------------

def _events_only(path, tmp_path):
    """A copy of a multi-document YAML stream with its Events only: the other objects are
    snapshots whose state would fill in what the Events leave out."""
    events = [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == "Event"]
    copy = tmp_path / f"events-of-{path.name}"
    copy.write_text(yaml.safe_dump_all(events))
    return copy


def _event_objects(documents) -> list[dict]:
    """Core/v1 and events.k8s.io Events among documents (lists, watch events, other objects),
    the latest sighting of each (a watch stream repeats them)."""
    found: dict[str, dict] = {}
    for document in documents:
        if not isinstance(document, dict):
            continue
        if isinstance(document.get("items"), list):
            items = document["items"]
        elif isinstance(document.get("object"), dict):
            items = [document["object"]]
        else:
            items = [document]
        for item in items:
            if item.get("kind", "Event") == "Event" and (
                    "involvedObject" in item or "regarding" in item):
                meta = item.get("metadata") or {}
                found[meta.get("uid") or meta.get("name") or str(len(found))] = item
    return list(found.values())


def _first_time(event: dict) -> datetime | None:
    """When an Event was first seen: firstTimestamp, deprecatedFirstTimestamp, eventTime or
    its creation, the first set (as the README says Events are read)."""
    meta = event.get("metadata") or {}
    for value in (event.get("firstTimestamp"), event.get("deprecatedFirstTimestamp"),
                  event.get("eventTime"), meta.get("creationTimestamp")):
        if _time(value) is not None:
            return _time(value)
    return None


def _expected_from_events(events: list[dict]) -> dict[tuple[str, str, str | None], dict]:
    """Per pod (namespace, name, UID: a static pod made anew has a new one): the first
    Scheduled and Started, the last Killing/Evicted, the created/deleted its controller's
    Events name, the Warning Events' counts. An Event without the pod's UID (its controller's,
    a few others) belongs to the pod of that name current at its time: the last to appear at
    or before it, else the first."""
    expected: dict[tuple[str, str, str | None], dict] = {}
    appeared: dict[tuple[str, str, str | None], datetime] = {}
    facts = []  # (namespace, name, uid, at, field or None, warnings)
    for event in events:
        subject = event.get("involvedObject") or event.get("regarding") or {}
        reason = event.get("reason")
        at = _first_time(event)
        message = event.get("message") or event.get("note") or ""
        if subject.get("kind") == "Pod":
            field = {"Scheduled": "scheduled", "Started": "started", "Killing": "finished",
                     "Evicted": "finished"}.get(reason)
            warnings = (event.get("count") or event.get("deprecatedCount") or 1) if event.get(
                "type") == "Warning" else 0
            facts.append((subject.get("namespace", ""), subject["name"],
                          subject.get("uid") or None, at, field, warnings))
        elif reason in ("SuccessfulCreate", "SuccessfulDelete"):
            # a ReplicaSet's, Job's or DaemonSet's words, or a StatefulSet's
            match = re.match(r"(?:Created|Deleted) pod: (\S+)|(?:create|delete) Pod (\S+) in "
                             r"StatefulSet \S+ successful", message)
            if match:
                facts.append((subject.get("namespace", ""), match.group(1) or match.group(2),
                              None, at,
                              "created" if reason == "SuccessfulCreate" else "deleted", 0))
    for namespace, name, uid, at, _, _ in facts:
        if uid:
            key = (namespace, name, uid)
            appeared[key] = min(at, appeared.get(key, at))
    for namespace, name, uid, at, field, warnings in facts:
        if uid is None:
            lives = sorted((when, key) for key, when in appeared.items()
                           if key[:2] == (namespace, name))
            current = [key for when, key in lives if when <= at]
            uid = (current[-1] if current else lives[0][1])[2] if lives else None
        entry = expected.setdefault((namespace, name, uid), {"warnings": 0})
        entry["warnings"] += warnings
        if field is not None and at is not None and (field not in entry or (
                at > entry[field] if field == "finished" else at < entry[field])):
            entry[field] = at
    return expected


def _assert_matches(answer: list[dict], expected: dict[tuple[str, str, str | None], dict],
                    ) -> None:
    got = _by_life(answer)
    assert len(got) == len(answer) and set(got) == set(expected)
    for key, want in expected.items():
        pod = got[key]
        for field in pods.FIELDS:
            assert _answer_time(pod[field]) == want.get(field), (key, field)
        assert pod["warnings"] == want["warnings"], key
        for field in ("scheduled", "started"):
            if want.get(field):
                assert pod["sources"][field] == f"event {field.capitalize()}"


def test_the_kspan_rollout_s_pods_have_their_event_phases(api, incident, ingest_file,
                                                          fixtures_dir, tmp_path, owner):
    path = fixtures_dir / "events" / "kspan-deployment-2-pods.yaml"
    expected = _expected_from_events(_event_objects(yaml.safe_load_all(path.read_text())))
    assert ingest_file(incident, _events_only(path, tmp_path)).status == "done"

    answer = api(_url(incident.pk)).json()

    _assert_matches(answer, expected)
    # With the stream's Pod objects too, their state only fills what the Events leave out.
    whole = Incident.objects.create(title="whole stream", team=incident.team, created_by=owner)
    assert ingest_file(whole, path).status == "done"
    filled = {(p["namespace"], p["name"]): p for p in api(_url(whole.pk)).json()}
    for pod in answer:
        for field in pods.FIELDS:
            if pod[field] is not None:
                assert filled[pod["namespace"], pod["name"]][field] == pod[field], field
    # the rollout's new pods: created by their ReplicaSet, scheduled, started; old ones killed
    assert sum(1 for p in expected.values() if "scheduled" in p and "created" in p) == 2
    assert sum(1 for p in expected.values() if "finished" in p) == 2
    started = [p for p in answer if p["started"]]
    assert started and all(p["created_to_scheduled_ms"] is not None for p in started)
    assert all(p["sources"]["created"] == "event SuccessfulCreate" for p in started)
    # "Successfully assigned default/px-… to <node>"
    for pod in started:
        assert pod["node"] and pod["node"] in {
            m.group(1) for m in re.finditer(r"Successfully assigned \S+ to (\S+)",
                                            path.read_text())}


def test_a_watch_stream_s_pods_have_their_event_phases(api, incident, ingest_file,
                                                       fixtures_dir):
    path = fixtures_dir / "events" / "cribl-event-watch-stream.json"
    expected = _expected_from_events(_event_objects(json.loads(path.read_text())))
    assert ingest_file(incident, path).status == "done"

    answer = api(_url(incident.pk)).json()

    _assert_matches(answer, expected)
    assert any(p["warnings"] for p in answer)  # Unhealthy, BackOff
    assert all(p["started"] for p in answer if p["name"] in {
        n for (_, n, _), e in expected.items() if "started" in e})


def test_an_event_list_without_pods_gives_none(api, incident, ingest_file, fixtures_dir):
    path = fixtures_dir / "events" / "insights-openshift-machine-api.json"
    expected = _expected_from_events(_event_objects([json.loads(path.read_text())]))
    assert ingest_file(incident, path).status == "done"
    assert api(_url(incident.pk)).json() == [] and expected == {}


def test_the_must_gather_s_event_lists_give_each_pod_s_phases(api, incident, ingest_file,
                                                              fixtures_dir, tmp_path):
    """Every namespace's core/events.yaml of the real must-gather, ingested one by one."""
    documents = []
    with tarfile.open(fixtures_dir / MUST_GATHER) as archive:
        members = [m for m in archive.getmembers()
                   if m.isfile() and m.name.endswith("/core/events.yaml")]
        for n, member in enumerate(members):
            data = archive.extractfile(member).read()
            documents.extend(yaml.safe_load_all(io.BytesIO(data)))
            path = tmp_path / f"{n}-events.yaml"
            path.write_bytes(data)
            assert ingest_file(incident, path).status == "done"
    expected = _expected_from_events(_event_objects(documents))
    assert len(expected) > 10  # the fixture holds the rollouts of many operators

    answer = api(_url(incident.pk)).json()

    _assert_matches(answer, expected)


# --- audit requests and status writes ---------------------------------------------------------

T0 = datetime(2024, 3, 1, 10, 0, 0, 250000, tzinfo=UTC)


def _stamp(at: datetime, whole: bool = False) -> str:
    if whole:
        return at.strftime("%Y-%m-%dT%H:%M:%SZ")
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _request(n, at, verb, name, *, sub="", code=None, req=None, resp=None, user="kubelet",
             namespace="shop", level="RequestResponse"):
    code = code or {"create": 201}.get(verb, 200)
    ref = {"resource": "pods", "namespace": namespace, "apiVersion": "v1"}
    if name:
        ref["name"] = name
    if sub:
        ref["subresource"] = sub
    event = {"kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": level,
             "auditID": f"req-{n:04d}", "stage": "ResponseComplete", "verb": verb,
             "requestURI": f"/api/v1/namespaces/{namespace}/pods/{name}" + (
                 f"/{sub}" if sub else ""),
             "user": {"username": user}, "responseStatus": {"code": code}, "objectRef": ref,
             "requestReceivedTimestamp": _stamp(at),
             "stageTimestamp": _stamp(at + timedelta(milliseconds=3))}
    if req is not None:
        event["requestObject"] = req
    if resp is not None:
        event["responseObject"] = resp
    return event


def _pod_object(name, uid, created, *, node="", status=None, namespace="shop"):
    return {"kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": name, "namespace": namespace, "uid": uid,
                         "generateName": name.rsplit("-", 1)[0] + "-",
                         "creationTimestamp": _stamp(created, whole=True)},
            "spec": {"nodeName": node, "containers": [{"name": "app", "image": "shop:1"}]},
            "status": status or {"phase": "Pending"}}


def _lifecycle(log: list, name: str, uid: str, start: datetime, *, namespace="shop",
               node="node-a", delete=True) -> dict:
    """Requests of one pod's life appended to ``log``: a create by a generated name (the
    request names no pod), a binding, three kubelet status patches, a graceful delete and the
    kubelet's final one. Returns the times a reader of this log expects."""
    n = len(log)
    created, scheduled = start, start + timedelta(milliseconds=40)
    started = (start + timedelta(seconds=3)).replace(microsecond=0)
    ready = started + timedelta(seconds=2)
    deleted = start + timedelta(seconds=30)
    finished = (deleted + timedelta(seconds=1)).replace(microsecond=0)
    condition = {"type": "PodScheduled", "status": "True",
                 "lastTransitionTime": _stamp(scheduled, whole=True)}
    log.append(_request(n, created, "create", "", user="system:serviceaccount:kube-system:"
                        "replicaset-controller", namespace=namespace,
                        req={"kind": "Pod", "metadata": {"generateName": name[:-5]}},
                        resp=_pod_object(name, uid, created, namespace=namespace)))
    log.append(_request(n + 1, scheduled, "create", name, sub="binding", namespace=namespace,
                        user="system:kube-scheduler",
                        req={"kind": "Binding", "apiVersion": "v1",
                             "metadata": {"name": name, "namespace": namespace, "uid": uid},
                             "target": {"kind": "Node", "name": node}},
                        resp={"kind": "Status", "status": "Success", "code": 201}))
    running = {"phase": "Running", "conditions": [condition, {
        "type": "Ready", "status": "False", "lastTransitionTime": _stamp(started, whole=True)}],
        "containerStatuses": [{"name": "app", "ready": False, "restartCount": 0, "state": {
            "running": {"startedAt": _stamp(started, whole=True)}}}]}
    log.append(_request(n + 2, started + timedelta(milliseconds=300), "patch", name, sub="status",
                        namespace=namespace, level="Request",
                        req={"metadata": {"uid": uid}, "status": running}))
    ready_status = {"phase": "Running", "conditions": [condition, {
        "type": "Ready", "status": "True", "lastTransitionTime": _stamp(ready, whole=True)}],
        "containerStatuses": [{"name": "app", "ready": True, "restartCount": 1, "state": {
            "running": {"startedAt": _stamp(started, whole=True)}}}]}
    log.append(_request(n + 3, ready + timedelta(milliseconds=200), "patch", name, sub="status",
                        namespace=namespace,
                        req={"status": {"conditions": ready_status["conditions"]}},
                        resp=_pod_object(name, uid, created, node=node, status=ready_status,
                                         namespace=namespace)))
    if delete:
        log.append(_request(n + 4, deleted, "delete", name, namespace=namespace,
                            user="system:serviceaccount:kube-system:replicaset-controller",
                            resp=_pod_object(name, uid, created, node=node,
                                             status=ready_status, namespace=namespace)))
        gone = {"phase": "Succeeded", "conditions": [condition], "containerStatuses": [{
            "name": "app", "restartCount": 1, "state": {"terminated": {
                "exitCode": 0, "startedAt": _stamp(started, whole=True),
                "finishedAt": _stamp(finished, whole=True)}}}]}
        log.append(_request(n + 5, finished + timedelta(milliseconds=100), "patch", name,
                            sub="status", namespace=namespace, level="Request",
                            req={"status": gone}))
        log.append(_request(n + 6, finished + timedelta(milliseconds=500), "delete", name,
                            namespace=namespace))
    return {"created": created, "scheduled": scheduled, "started": started, "ready": ready,
            "finished": finished if delete else None, "deleted": deleted if delete else None,
            "uid": uid, "node": node}


def _write_log(path, log: list) -> None:
    path.write_text("".join(json.dumps(e) + "\n" for e in sorted(
        log, key=lambda e: e["requestReceivedTimestamp"])))


def test_requests_and_status_writes_give_every_phase(api, incident, ingest_file, tmp_path):
    log: list = []
    first = _lifecycle(log, "web-7d9f8-abcde", "uid-1", T0)
    # the same name again after the first was deleted: a second pod (a new UID)
    second = _lifecycle(log, "web-7d9f8-abcde", "uid-2", T0 + timedelta(minutes=2),
                        node="node-b", delete=False)
    other = _lifecycle(log, "db-0-xyzab", "uid-3", T0 + timedelta(seconds=5), namespace="data")
    # a failed create and a Metadata-level status write say nothing
    log.append(_request(900, T0 + timedelta(seconds=1), "create", "", code=409))
    log.append(_request(901, T0 + timedelta(seconds=9), "patch", "db-0-xyzab", sub="status",
                        namespace="data", level="Metadata"))
    _write_log(tmp_path / "audit.log", log)
    assert ingest_file(incident, tmp_path / "audit.log").status == "done"

    answer = api(_url(incident.pk)).json()

    assert [(p["namespace"], p["name"], p["uid"]) for p in answer] == [
        ("shop", "web-7d9f8-abcde", "uid-1"), ("data", "db-0-xyzab", "uid-3"),
        ("shop", "web-7d9f8-abcde", "uid-2")]
    for pod, want in zip(answer, (first, other, second), strict=True):
        for field in pods.FIELDS:
            assert _answer_time(pod[field]) == want[field], (pod["name"], field)
        assert pod["node"] == want["node"]
        assert pod["restarts"] == 1
        assert pod["created_to_scheduled_ms"] == 40.0
        assert pod["scheduled_to_started_ms"] == (
            want["started"] - want["scheduled"]) / timedelta(milliseconds=1)
        assert pod["started_to_ready_ms"] == 2000.0
        assert pod["created_to_ready_ms"] == (
            want["ready"] - want["created"]) / timedelta(milliseconds=1)
        assert pod["sources"]["created"] == "audit create"
        assert pod["sources"]["scheduled"] == "audit binding"
        assert pod["sources"]["started"] == "status containerStatuses"
        assert pod["sources"]["ready"] == "status Ready"
    assert answer[0]["sources"]["deleted"] == "audit delete"
    assert answer[0]["sources"]["finished"] == "status containerStatuses"


@pytest.mark.embedded
def test_the_embedded_default_gives_the_same_phases(api, incident, ingest_file, tmp_path,
                                                     fixtures_dir):
    """SQLite and in-process caching: requests, status writes and Events together."""
    log: list = []
    want = _lifecycle(log, "web-7d9f8-abcde", "uid-1", T0)
    _write_log(tmp_path / "audit.log", log)
    assert ingest_file(incident, tmp_path / "audit.log").status == "done"
    kspan = fixtures_dir / "events" / "kspan-deployment-2-pods.yaml"
    assert ingest_file(incident, _events_only(kspan, tmp_path)).status == "done"
    expected = _expected_from_events(_event_objects(yaml.safe_load_all(kspan.read_text())))

    answer = _by_life(api(_url(incident.pk)).json())

    assert answer == _by_life(api(_url(incident.pk)).json())  # the cached answer
    assert len(answer) == 1 + len(expected)
    pod = answer[("shop", "web-7d9f8-abcde", "uid-1")]
    for field in pods.FIELDS:
        assert _answer_time(pod[field]) == want[field], field
    _assert_matches([p for p in answer.values() if p["namespace"] != "shop"], expected)


def test_the_falco_pod_creates_are_named_from_their_stored_objects(api, incident, ingest_file,
                                                                   fixtures_dir):
    expected = {}
    for path in sorted((fixtures_dir / "audit" / "falco").glob("create_*pod*.json")):
        event = json.loads(path.read_text())
        if event["verb"] != "create" or event["objectRef"]["resource"] != "pods":
            continue
        meta = event["responseObject"]["metadata"]
        key = (meta["namespace"], meta["name"], meta["uid"])
        at = _time(event["requestReceivedTimestamp"])
        expected[key] = min(at, expected.get(key, at))
        assert ingest_file(incident, path).status == "done"
    assert len(expected) >= 5

    answer = api(_url(incident.pk)).json()

    assert {(p["namespace"], p["name"], p["uid"]): _answer_time(p["created"])
            for p in answer} == expected


def test_requests_win_over_events_and_events_fill_in(api, incident, ingest_file, tmp_path):
    """The same pod in an audit log (create, binding, Metadata-level status writes) and in its
    Events: the binding request gives scheduled, the Events started and finished."""
    log: list = []
    name, uid = "api-5c6d7-qwert", "uid-9"
    log.append(_request(1, T0, "create", name, resp=_pod_object(name, uid, T0)))
    log.append(_request(2, T0 + timedelta(milliseconds=800), "create", name, sub="binding",
                        req={"kind": "Binding", "metadata": {"name": name, "uid": uid},
                             "target": {"kind": "Node", "name": "node-c"}}))
    log.append(_request(3, T0 + timedelta(seconds=4), "patch", name, sub="status",
                        level="Metadata"))
    _write_log(tmp_path / "audit.log", log)
    scheduled_event = T0 + timedelta(seconds=1)
    started_event = (T0 + timedelta(seconds=6)).replace(microsecond=0)
    killing_event = (T0 + timedelta(seconds=60)).replace(microsecond=0)
    events = [
        {"apiVersion": "v1", "kind": "Event", "reason": reason, "type": kind,
         "metadata": {"name": f"{name}.{n}", "namespace": "shop", "uid": f"ev-{n}"},
         "involvedObject": {"kind": "Pod", "namespace": "shop", "name": name, "uid": uid},
         "message": message, "count": count, **times}
        for n, (reason, kind, message, count, times) in enumerate([
            ("Scheduled", "Normal", f"Successfully assigned shop/{name} to node-c", None,
             {"eventTime": _stamp(scheduled_event)}),
            ("Started", "Normal", "Started container app", 1,
             {"firstTimestamp": _stamp(started_event, whole=True)}),
            ("Unhealthy", "Warning", "Readiness probe failed", 4,
             {"firstTimestamp": _stamp(started_event + timedelta(seconds=2), whole=True)}),
            ("Killing", "Normal", "Stopping container app", 1,
             {"firstTimestamp": _stamp(killing_event, whole=True)})])]
    (tmp_path / "events.yaml").write_text(yaml.safe_dump_all(events))
    assert ingest_file(incident, tmp_path / "audit.log").status == "done"
    assert ingest_file(incident, tmp_path / "events.yaml").status == "done"

    [pod] = api(_url(incident.pk)).json()

    assert (pod["namespace"], pod["name"], pod["uid"], pod["node"]) == ("shop", name, uid,
                                                                       "node-c")
    assert _answer_time(pod["created"]) == T0
    assert _answer_time(pod["scheduled"]) == T0 + timedelta(milliseconds=800)  # not the Event's
    assert _answer_time(pod["started"]) == started_event
    assert _answer_time(pod["finished"]) == killing_event
    assert pod["ready"] is None and pod["deleted"] is None
    assert pod["warnings"] == 4
    assert pod["sources"] == {"created": "audit create", "scheduled": "audit binding",
                              "started": "event Started", "finished": "event Killing"}

    # kind=event: the Events alone, whose Scheduled then counts
    [pod] = api(_url(incident.pk), {"kind": "event"}).json()
    assert _answer_time(pod["scheduled"]) == scheduled_event and pod["created"] is None


# --- filters, cache, access -------------------------------------------------------------------

@pytest.fixture
def two_namespaces(incident, ingest_file, tmp_path):
    log: list = []
    web = _lifecycle(log, "web-7d9f8-abcde", "uid-1", T0)
    db = _lifecycle(log, "db-0-xyzab", "uid-3", T0 + timedelta(seconds=5), namespace="data")
    _write_log(tmp_path / "audit.log", log)
    assert ingest_file(incident, tmp_path / "audit.log").status == "done"
    return web, db


def test_filters_narrow_the_pods(api, incident, two_namespaces):
    web, db = two_namespaces
    url = _url(incident.pk)
    assert [p["name"] for p in api(url, {"namespace": "data"}).json()] == ["db-0-xyzab"]
    # a generated name: its create request names no pod, its body does
    [pod] = api(url, {"name": "web-7d9f8-abcde"}).json()
    assert _answer_time(pod["created"]) == web["created"]
    # the same with a filter of rows: counted, not taken from the unfiltered answer
    [pod] = api(url, {"name": "web-7d9f8-abcde", "kind": "audit"}).json()
    assert _answer_time(pod["created"]) == web["created"]
    assert api(url, {"resource": "deployments"}).json() == []
    assert api(url, {"resource": "deployments", "kind": "audit"}).json() == []
    assert len(api(url, {"resource": "pods"}).json()) == 2
    # a window: what happened in it (web's create, binding and deletes are outside; its
    # creation is then the one its stored object says, to the second)
    window = {"since": _stamp(web["started"]), "until": _stamp(web["deleted"] - timedelta(
        seconds=1))}
    got = _by_pod(api(url, window).json())
    assert got[("shop", "web-7d9f8-abcde")]["deleted"] is None
    assert got[("shop", "web-7d9f8-abcde")]["sources"]["created"] == "object creationTimestamp"
    assert _answer_time(got[("shop", "web-7d9f8-abcde")]["created"]) == web["created"].replace(
        microsecond=0)
    assert got[("data", "db-0-xyzab")]["sources"]["created"] == "audit create"
    # the kubelet's writes only
    assert {p["sources"].get("scheduled") for p in api(url, {"user": "kubelet"}).json()} == {
        "status PodScheduled"}
    bad = api(url, {"since": "yesterday"})
    assert bad.status_code == 400 and "since" in bad.json()


def test_a_second_query_reads_no_body(api, incident, two_namespaces):
    url = _url(incident.pk)
    first = api(url, {"namespace": "shop"}).json()
    with CaptureQueriesContext(connection) as queries:
        again = api(url, {"namespace": "shop"}).json()
        other = api(url, {"namespace": "data"}).json()  # not asked before: rows, no body
    assert again == first and len(other) == 1
    assert not [q for q in queries if "timelines_bodychunk" in q["sql"]]


def test_the_end_of_an_ingest_prepares_the_pods_for_every_process(api, incident,
                                                                    two_namespaces):
    from timelines.analysis import pods_views
    from timelines.tasks import finish_incident

    finish_incident(incident.pk)
    pods_views.forget()  # another web process
    url = _url(incident.pk)
    with CaptureQueriesContext(connection) as unfiltered:
        assert len(api(url).json()) == 2
        # whole pods: a part of the unfiltered answer
        assert [p["name"] for p in api(url, {"namespace": "data"}).json()] == ["db-0-xyzab"]
    with CaptureQueriesContext(connection) as counted:
        assert len(api(url, {"user": "kubelet"}).json()) == 2
    assert not [q for q in unfiltered if "timelines_event" in q["sql"]]  # the answer is kept
    assert [q for q in counted if "timelines_event" in q["sql"]]
    assert not [q for q in [*unfiltered, *counted] if "timelines_bodychunk" in q["sql"]]


@pytest.fixture
def mixed(incident, two_namespaces, ingest_file, fixtures_dir):
    """Requests, status writes and a rollout's Events (its ReplicaSet's too) in one incident."""
    kspan = fixtures_dir / "events" / "kspan-deployment-2-pods.yaml"
    assert ingest_file(incident, kspan).status == "done"
    return two_namespaces


def test_the_stored_facts_give_the_answers_read_from_the_rows(incident, mixed):
    """Each query's facts selected from those prepared for the incident give the answer that
    the facts read from its own rows and bodies give (as while an upload runs)."""
    _assert_stored_facts_answer_as_rows(incident, mixed)


@pytest.mark.embedded
def test_the_stored_facts_give_the_answers_read_from_the_rows_embedded(incident, mixed):
    _assert_stored_facts_answer_as_rows(incident, mixed)


def _assert_stored_facts_answer_as_rows(incident, mixed):
    from django.http import QueryDict

    from timelines.analysis import pods_views
    from timelines.store.aggregate import data_version

    web, db = mixed
    version = data_version(incident.pk)
    events = [(e.namespace, e.name, e.received) for e in
              incident.events.filter(resource="pods", kind="event").order_by("received")]
    _, _, first_event = events[0]
    queries = [{}, {"kind": "event"}, {"kind": "audit"}, {"user": "kubelet"},
               {"verb": "patch"}, {"namespace": "data", "kind": "audit"},
               {"name": "web-7d9f8-abcde", "kind": "audit"},
               {"since": _stamp(web["started"]), "until": _stamp(db["deleted"])},
               {"since": _stamp(first_event), "until": _stamp(first_event + timedelta(
                   minutes=1))},
               {"kind": "audit", "until": _stamp(web["ready"])},
               {"kind": "event", "since": _stamp(first_event + timedelta(seconds=1))},
               {"name": events[-1][1], "since": _stamp(first_event)}]
    answers = []
    for query in queries:
        params = QueryDict(mutable=True)
        for name, value in query.items():
            params[name] = value
        pods_views.forget()
        from_rows = pods_views._compute(incident, params, None)
        pods_views.forget()
        stored = pods_views._compute(incident, params, version)  # the stored row's facts
        assert stored == from_rows, query
        answers.append(stored)
    assert all(answers[1:4]) and answers[0] != answers[1] != answers[2]
    assert {p["name"] for p in answers[-1]} == {events[-1][1]}


def test_an_evicted_cache_is_served_from_the_stored_facts(api, incident, mixed, ingest_file,
                                                           tmp_path):
    from django.core.cache import cache

    from timelines.analysis import pods_views
    from timelines.models import IncidentPodFacts
    from timelines.store.aggregate import data_version
    from timelines.tasks import finish_incident

    finish_incident(incident.pk)
    stored = IncidentPodFacts.objects.get(incident=incident)
    assert stored.version == data_version(incident.pk)
    url = _url(incident.pk)
    queries = [{}, {"kind": "event"}, {"user": "kubelet"}, {"namespace": "data"}]
    first = [api(url, q).json() for q in queries]
    cache.clear()
    pods_views.forget()  # a cache evicted, a new process
    with CaptureQueriesContext(connection) as read:
        again = [api(url, q).json() for q in queries]
    assert again == first and all(first)
    assert not [q for q in read if "timelines_bodychunk" in q["sql"]]
    assert [q for q in read if "timelines_incidentpodfacts" in q["sql"]]
    cache.clear()
    with CaptureQueriesContext(connection) as unfiltered:  # the answer stored with the facts
        assert api(url).json() == first[0]
    assert not [q for q in unfiltered if "timelines_event" in q["sql"]]

    # a new data version replaces the row; the incident's deletion removes it
    log: list = []
    _lifecycle(log, "late-0", "uid-9", T0 + timedelta(minutes=5), namespace="late")
    _write_log(tmp_path / "late.log", log)
    assert ingest_file(incident, tmp_path / "late.log").status == "done"
    assert "late-0" in {p["name"] for p in api(url, {"user": "kubelet"}).json()}
    replaced = IncidentPodFacts.objects.get(incident=incident)
    assert replaced.version == data_version(incident.pk) != stored.version
    from timelines.ingest.purge import delete_incident

    assert delete_incident(incident)
    assert not IncidentPodFacts.objects.filter(pk=stored.pk).exists()


def test_outsiders_get_404(api_as, client, outsider, incident, two_namespaces):
    assert api_as(outsider).get(_url(incident.pk)).status_code == 404
    client.force_login(outsider)
    assert client.get(f"/incidents/{incident.pk}/pods/").status_code == 404
    assert api_as(None).get(_url(incident.pk)).status_code == 401


def test_the_page_draws_other_incidents_only_when_visible(client, owner, team, other_team,
                                                          incident, two_namespaces):
    mine = Incident.objects.create(title="last week's run", team=team, created_by=owner)
    theirs = Incident.objects.create(title="their run", team=other_team)
    client.force_login(owner)
    page = client.get(f"/incidents/{incident.pk}/pods/", {"with": [mine.pk]})
    assert page.status_code == 200
    runs = page.context["runs"]
    assert [r["id"] for r in runs] == [incident.pk, mine.pk]
    assert theirs.pk not in [pk for pk, _, _ in page.context["choices"]]
    assert client.get(f"/incidents/{incident.pk}/pods/",
                      {"with": [mine.pk, theirs.pk]}).status_code == 404
    assert client.get(f"/incidents/{incident.pk}/pods/", {"with": "x"}).status_code == 404
    assert client.get(f"/incidents/{incident.pk}/pods/").status_code == 200


# --- pure functions ---------------------------------------------------------------------------

def test_a_controller_s_event_names_its_pod():
    assert pods.controller_pod("Created pod: px-5d567cc74c-ss4lb") == "px-5d567cc74c-ss4lb"
    assert pods.controller_pod("create Pod web-0 in StatefulSet web successful") == "web-0"
    assert pods.controller_pod("Scaled up replica set px to 1") == ""


def test_a_whole_second_a_little_before_its_start_is_no_negative_duration():
    created = pods.Fact("ns", "p", "", "created", 10_400_000, pods.REQUEST, "audit create")
    started = pods.Fact("ns", "p", "", "started", 10_000_000, pods.STATUS, "status")
    late = pods.Fact("ns", "q", "", "created", 10_400_000, pods.REQUEST, "audit create")
    early = pods.Fact("ns", "q", "", "scheduled", 8_000_000, pods.STATUS, "status")
    p, q = sorted(pods.assemble([created, started, late, early]), key=lambda x: x.name)
    assert p.as_json()["scheduled_to_started_ms"] is None
    assert pods.duration_ms(p.times["created"], p.times["started"]) == 0
    assert pods.duration_ms(q.times["created"], q.times["scheduled"]) == -2400.0


# --- the page in a browser --------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_the_page_lists_the_pods_and_draws_their_phases_for_two_runs(
        open_page, owner, team, incident, ingest_file, fixtures_dir, tmp_path):
    import numpy as np
    from PIL import Image

    log: list = []
    for n in range(6):
        _lifecycle(log, f"web-7d9f8-pod{n:02d}", f"uid-{n}", T0 + timedelta(seconds=7 * n))
    _write_log(tmp_path / "audit.log", log)
    assert ingest_file(incident, tmp_path / "audit.log").status == "done"
    other = Incident.objects.create(title="the rollout run", team=team, created_by=owner)
    kspan = fixtures_dir / "events" / "kspan-deployment-2-pods.yaml"
    assert ingest_file(other, _events_only(kspan, tmp_path)).status == "done"
    rollout = _expected_from_events(_event_objects(yaml.safe_load_all(kspan.read_text())))
    expected_rows = 6 + len(rollout)
    # each pod's durations whose two ends the evidence gives: every one for the audit pods
    expected_points = 6 * len(pods.PHASES) + sum(
        1 for pod in rollout.values() for _, start, end in pods.PHASES
        if pod.get(start) and pod.get(end))

    page = open_page(owner, f"/incidents/{incident.pk}/pods/?with={other.pk}")
    page.wait_for_function("document.getElementById('pods').dataset.ready === '1'")

    rows = page.locator("#pods-table tbody tr")
    assert rows.count() == expected_rows
    link = page.locator("#pods-table tbody tr a", has_text="web-7d9f8-pod03")
    assert link.get_attribute("href") == (
        f"/incidents/{incident.pk}/?resource=pods&namespace=shop&name=web-7d9f8-pod03#timeline")
    row = page.locator("#pods-table tbody tr", has=page.locator("a", has_text="web-7d9f8-pod03"))
    assert row.locator("td").nth(3).inner_text() == "40 ms"  # created → scheduled: the binding
    assert row.locator("td").nth(5).inner_text() == "2 s"  # started → ready
    # sorting by a column orders the rows by it
    page.click("#pods-table th[data-sort='name']")
    names = page.locator("#pods-table tbody tr td:nth-child(2) a").all_inner_texts()
    assert names == sorted(names)
    # two incidents: one box trace each, every pod's durations as points
    assert page.locator("#pods-plot .boxlayer .trace.boxes").count() == 2
    points = page.locator("#pods-plot .boxlayer .points path.point").count()
    assert points == expected_points
    # drawn: the first run's colour is on the plot's pixels
    picture = tmp_path / "plot.png"
    page.locator("#pods-plot").screenshot(path=str(picture))
    pixels = np.asarray(Image.open(picture).convert("RGB"), dtype=np.int16)
    near = (np.abs(pixels - np.array([0x2f, 0x5b, 0xd3])) < 30).all(axis=2)
    assert near.sum() > 200
