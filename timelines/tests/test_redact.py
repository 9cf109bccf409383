"""``timelines.parsers.redact`` and redaction through ``parse_audit`` (``report.redacted`` and the
row's ``raw``), pure code, no database.

Expected counts are derived in the test from the events (the falco fixtures read with ``json``,
or events built here from them), never copied from what the redactor produced.
"""

from __future__ import annotations

import base64
import copy
import io
import json
from pathlib import Path

import pytest

from timelines.parsers import MARKER, Redactor, Report, parse_audit
from timelines.parsers.redact import LAST_APPLIED, redact_object

FALCO = ("audit", "falco")
SENSITIVE_VALUES = ("MY-KEY", "MY-ID")  # the values of the credential lines in the falco traces


# --- helpers -----------------------------------------------------------------------------------

def falco(fixtures_dir: Path, name: str) -> Path:
    return fixtures_dir.joinpath(*FALCO, name)


def falco_lines(path: Path) -> list[tuple[bytes, dict]]:
    """(line bytes without the newline, event) of every non-empty line."""
    return [(chunk.strip(), json.loads(chunk)) for chunk in path.read_bytes().split(b"\n")
            if chunk.strip()]


def parse(data: bytes, name: str = "test.log", **kwargs) -> tuple[list, Report]:
    report = Report(name)
    rows = list(parse_audit(io.BytesIO(data), report, **kwargs))
    return rows, report


def as_line(event: dict) -> bytes:
    return json.dumps(event).encode() + b"\n"


def as_batch(*events: dict) -> bytes:
    return as_line({"kind": "EventList", "apiVersion": "audit.k8s.io/v1", "metadata": {},
                    "items": list(events)})


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def b64url(value: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()


JWT = ".".join([
    b64url({"alg": "RS256", "kid": "test-key"}),
    b64url({"iss": "kubernetes/serviceaccount", "sub": "system:serviceaccount:ci:builder"}),
    base64.urlsafe_b64encode(bytes(range(64))).rstrip(b"=").decode(),
])


def secret_create(fixtures_dir: Path) -> dict:
    """The falco create_secret.json request as a RequestResponse event with bodies."""
    (_raw, base), = falco_lines(falco(fixtures_dir, "create_secret.json"))
    ref = base["objectRef"]
    data = {"username": b64("db-user-7f3a"), "password": b64("s3cr3t-pa55w0rd-9")}
    string_data = {"api-key": "plain-api-key-0042", "note": "rotate-me-quarterly-77"}
    applied = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
               "metadata": {"name": ref["name"], "namespace": ref["namespace"]},
               "data": data, "stringData": string_data}
    annotations = {LAST_APPLIED: json.dumps(applied)}
    request = copy.deepcopy(applied)
    request["metadata"]["annotations"] = dict(annotations)
    response = {
        "kind": "Secret", "apiVersion": "v1", "type": "Opaque",
        "metadata": {"name": ref["name"], "namespace": ref["namespace"], "resourceVersion": "4242",
                     "uid": "0b5d7c5e-6f0e-4e0c-9d3e-1c2b3a4d5e6f",
                     "annotations": dict(annotations)},
        "data": {**data, **{k: b64(v) for k, v in string_data.items()}},
    }
    event = copy.deepcopy(base)
    event.update(level="RequestResponse", requestObject=request, responseObject=response)
    return event


def secret_values(obj: dict) -> list[str]:
    """The data/stringData values of a Secret and of the copy in its last-applied annotation."""
    values = [v for field in ("data", "stringData") for v in (obj.get(field) or {}).values() if v]
    applied = ((obj.get("metadata") or {}).get("annotations") or {}).get(LAST_APPLIED)
    if applied:
        values += secret_values(json.loads(applied))
    return values


def secret_list(fixtures_dir: Path) -> dict:
    (_raw, base), = falco_lines(falco(fixtures_dir, "create_secret.json"))
    event = copy.deepcopy(base)
    namespace = base["objectRef"]["namespace"]
    items = [  # list items carry no kind
        {"metadata": {"name": f"app-{i}", "namespace": namespace}, "type": "Opaque",
         "data": {f"key-{j}": b64(f"item-{i}-value-{j}") for j in range(i + 1)}}
        for i in range(3)
    ]
    event.update(
        level="RequestResponse", verb="list",
        requestURI=f"/api/v1/namespaces/{namespace}/secrets?limit=500",
        objectRef={"resource": "secrets", "namespace": namespace, "apiVersion": "v1"},
        responseObject={"kind": "SecretList", "apiVersion": "v1",
                        "metadata": {"resourceVersion": "777"}, "items": items},
    )
    return event


def other_event(fixtures_dir: Path, name: str = "create_deployment.json") -> dict:
    """A falco event about something that is not secret (a Deployment)."""
    (_raw, base), = falco_lines(falco(fixtures_dir, name))
    return copy.deepcopy(base)


# --- ConfigMaps (falco traces) -----------------------------------------------------------------

def test_credential_lines_in_configmap_values_are_redacted_and_other_values_kept(fixtures_dir):
    lines = falco_lines(falco(fixtures_dir, "create_configmap_sensitive_values.json"))
    originals = {e["auditID"]: e for _raw, e in lines}
    expected = 0
    for e in originals.values():
        for side in ("requestObject", "responseObject"):
            for value in e[side]["data"].values():
                expected += sum(1 for text in value.splitlines()
                                if text.split("=", 1)[-1].strip() in SENSITIVE_VALUES)
    assert expected > 0

    rows, report = parse(b"".join(raw + b"\n" for raw, _e in lines))

    assert len(rows) == len(originals)
    assert report.redacted == expected
    for row in rows:
        text = row.raw.decode()
        for secret in SENSITIVE_VALUES:
            assert secret not in text
        assert MARKER in text
        stored, original = json.loads(row.raw), originals[row.audit_id]
        for side in ("requestObject", "responseObject"):
            data, before = stored[side]["data"], original[side]["data"]
            assert data.keys() == before.keys()
            assert data["ui.properties"] == before["ui.properties"]
            # Each credential line keeps its key and loses its value.
            kept = [line.split("=", 1)[0] for line in data["access.properties"].splitlines()]
            assert kept == [line.split("=", 1)[0]
                            for line in before["access.properties"].splitlines()]
            assert all(line.split("=", 1)[1].strip() == MARKER
                       for line in data["access.properties"].splitlines())
        # Everything else in the event is untouched.
        for side in ("requestObject", "responseObject"):
            stored[side].pop("data")
            original[side].pop("data")
        assert stored == original


def test_a_configmap_without_sensitive_values_is_stored_unchanged(fixtures_dir):
    lines = falco_lines(falco(fixtures_dir, "create_configmap_no_sensitive_values.json"))

    rows, report = parse(b"".join(raw + b"\n" for raw, _e in lines))

    assert report.redacted == 0
    assert len(rows) == len(lines) == 1
    assert json.loads(rows[0].raw) == lines[0][1]
    assert rows[0].raw == lines[0][0]


# --- Secrets -----------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "name", ["create_secret.json", "create_kube_system_secret.json", "delete_secret.json"])
def test_metadata_level_secret_traces_parse_and_carry_no_data(fixtures_dir, name):
    lines = falco_lines(falco(fixtures_dir, name))
    assert all(e["level"] == "Metadata" for _raw, e in lines)

    rows, report = parse(b"".join(raw + b"\n" for raw, _e in lines), name=name)

    assert len(rows) == len(lines)
    assert report.redacted == 0 and report.skipped == 0
    for row, (_raw, e) in zip(rows, lines, strict=True):
        stored = json.loads(row.raw)
        assert stored == e
        assert "requestObject" not in stored and "responseObject" not in stored
        assert (row.resource, row.name) == (e["objectRef"]["resource"], e["objectRef"]["name"])


def test_secret_values_are_redacted_everywhere_keys_kept(fixtures_dir):
    event = secret_create(fixtures_dir)
    values = secret_values(event["requestObject"]) + secret_values(event["responseObject"])
    request_keys = {f: list(event["requestObject"][f]) for f in ("data", "stringData")}
    response_keys = list(event["responseObject"]["data"])

    rows, report = parse(as_line(event))

    assert report.redacted == len(values)
    (row,) = rows
    text = row.raw.decode()
    for value in set(values):
        assert value not in text
    stored = json.loads(row.raw)
    request, response = stored["requestObject"], stored["responseObject"]
    for field, keys in request_keys.items():
        assert request[field] == {key: MARKER for key in keys}
    assert response["data"] == {key: MARKER for key in response_keys}
    for obj in (request, response):
        applied = json.loads(obj["metadata"]["annotations"][LAST_APPLIED])
        original = json.loads(event["requestObject"]["metadata"]["annotations"][LAST_APPLIED])
        assert applied["data"] == {key: MARKER for key in original["data"]}
        assert applied["stringData"] == {key: MARKER for key in original["stringData"]}
        assert applied["metadata"] == original["metadata"]
    assert request["metadata"]["name"] == event["objectRef"]["name"]


def test_redact_event_counts_and_redacts_in_place(fixtures_dir):
    event = secret_create(fixtures_dir)
    expected = len(secret_values(event["requestObject"]) + secret_values(event["responseObject"]))

    assert Redactor().redact_event(event) == expected
    assert secret_values(event["requestObject"]) == [MARKER] * (expected // 2)
    # Redacting again finds nothing left.
    assert Redactor().redact_event(event) == 0


def test_every_item_of_a_secret_list_is_redacted(fixtures_dir):
    event = secret_list(fixtures_dir)
    items = event["responseObject"]["items"]
    expected = sum(len(item["data"]) for item in items)
    values = [v for item in items for v in item["data"].values()]

    direct = copy.deepcopy(event["responseObject"])
    assert redact_object(direct, "secrets") == expected
    assert all(set(item["data"].values()) == {MARKER} for item in direct["items"])

    rows, report = parse(as_line(event))

    assert report.redacted == expected
    stored = json.loads(rows[0].raw)["responseObject"]["items"]
    assert [list(i["data"]) for i in stored] == [list(i["data"]) for i in items]
    assert all(set(item["data"].values()) == {MARKER} for item in stored)
    assert not any(value in rows[0].raw.decode() for value in values)


def test_a_merge_patch_to_a_secret_is_redacted(fixtures_dir):
    event = other_event(fixtures_dir, "create_secret.json")
    patch = {"data": {"password": b64("patched-pa55")}, "metadata": {"labels": {"t": "x"}}}
    event.update(level="Request", verb="patch", requestObject=patch,
                 requestURI=event["requestURI"] + "/" + event["objectRef"]["name"])

    rows, report = parse(as_line(event))

    assert report.redacted == 1
    stored = json.loads(rows[0].raw)["requestObject"]
    assert stored == {"data": {"password": MARKER}, "metadata": {"labels": {"t": "x"}}}


def test_a_json_patch_to_a_secret_is_redacted(fixtures_dir):
    """``kubectl patch secret --type=json``: the request body is an RFC 6902 list."""
    event = other_event(fixtures_dir, "create_secret.json")
    patch = [
        {"op": "replace", "path": "/data/password", "value": b64("json-patched-pa55")},
        {"op": "add", "path": "/stringData", "value": {"token": "plain-token-31337"}},
        {"op": "add", "path": "/metadata/labels/team", "value": "payments"},
        {"op": "remove", "path": "/data/old"},
    ]
    secret_ops = [op for op in patch if op["path"].split("/")[1] in ("data", "stringData")
                  and "value" in op]
    expected = sum(len(op["value"]) if isinstance(op["value"], dict) else 1 for op in secret_ops)
    event.update(level="Request", verb="patch", requestObject=patch)

    rows, report = parse(as_line(event))

    assert report.redacted == expected
    stored = json.loads(rows[0].raw)["requestObject"]
    assert stored[0]["value"] == MARKER
    assert stored[1]["value"] == {"token": MARKER}
    assert stored[2:] == patch[2:]


# --- tokens ------------------------------------------------------------------------------------

def token_review(fixtures_dir: Path, token: str) -> dict:
    event = other_event(fixtures_dir)
    body = {"kind": "TokenReview", "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"creationTimestamp": None}, "spec": {"token": token}}
    event.update(
        level="RequestResponse", verb="create",
        requestURI="/apis/authentication.k8s.io/v1/tokenreviews",
        objectRef={"resource": "tokenreviews", "apiGroup": "authentication.k8s.io",
                   "apiVersion": "v1"},
        requestObject=body,
        responseObject={**copy.deepcopy(body), "status": {
            "authenticated": True, "user": {"username": "jane", "groups": ["dev"]}}},
    )
    return event


def test_token_review_spec_token_is_redacted(fixtures_dir):
    token = "opaque-webhook-token-0123456789"
    event = token_review(fixtures_dir, token)
    expected = sum(1 for side in ("requestObject", "responseObject")
                   if event[side]["spec"].get("token"))

    rows, report = parse(as_line(event))

    assert report.redacted == expected == 2
    stored = json.loads(rows[0].raw)
    assert token not in rows[0].raw.decode()
    assert stored["requestObject"]["spec"] == {"token": MARKER}
    assert stored["responseObject"]["status"] == event["responseObject"]["status"]


@pytest.mark.parametrize("with_kind", [True, False])
@pytest.mark.parametrize("token", ["opaque-sa-token-value-000111", JWT])
def test_token_request_status_token_is_redacted(fixtures_dir, with_kind, token):
    event = other_event(fixtures_dir)
    response = {"apiVersion": "authentication.k8s.io/v1", "metadata": {"name": "builder"},
                "spec": {"audiences": ["https://kubernetes.default.svc"]},
                "status": {"token": token, "expirationTimestamp": "2024-05-01T13:00:00Z"}}
    if with_kind:
        response["kind"] = "TokenRequest"
    event.update(
        level="RequestResponse", verb="create",
        requestURI="/api/v1/namespaces/ci/serviceaccounts/builder/token",
        objectRef={"resource": "serviceaccounts", "namespace": "ci", "name": "builder",
                   "apiVersion": "v1", "subresource": "token"},
        responseObject=response,
    )

    rows, report = parse(as_line(event))

    assert report.redacted == 1
    stored = json.loads(rows[0].raw)["responseObject"]
    assert stored["status"] == {"token": MARKER,
                                "expirationTimestamp": response["status"]["expirationTimestamp"]}
    assert token not in rows[0].raw.decode()


def test_bearer_basic_and_jwt_strings_are_redacted_anywhere(fixtures_dir):
    event = other_event(fixtures_dir)
    bearer = "abcdefgh12345678opaque"
    basic = b64("alice:hunter2-hunter2")
    detached = "eyJhbGciOiJIUzI1NiIsImtpZCI6ImFiY2RlZiJ9..RLx-c2lnbmF0dXJlLXZhbHVlLW9mLWl0"
    event["user"]["extra"] = {"example.com/id-token": [JWT], "example.com/team": ["payments"],
                              "example.com/jws": [detached]}
    event["annotations"] = {
        **event.get("annotations", {}),
        "example.com/forwarded": f"Authorization: Bearer {bearer}",
        "example.com/upstream": f"authorization: Basic {basic}",
    }
    expected = 4  # one JWT, one detached JWS, one bearer token, one basic credential

    rows, report = parse(as_line(event))

    assert report.redacted == expected
    text = rows[0].raw.decode()
    for secret in (JWT, bearer, basic, detached.split("..")[1]):
        assert secret not in text
    stored = json.loads(rows[0].raw)
    assert stored["user"]["extra"] == {"example.com/id-token": [MARKER],
                                       "example.com/team": ["payments"],
                                       "example.com/jws": [MARKER]}
    assert stored["annotations"]["example.com/forwarded"] == f"Authorization: Bearer {MARKER}"
    assert stored["annotations"]["example.com/upstream"] == f"authorization: Basic {MARKER}"
    assert rows[0].annotations == stored["annotations"]


URI_SECRET_PARAMS = {"access_token", "token"}


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/api/v1/namespaces/default/pods/web/exec",
         [("command", "sh"), ("access_token", "AT-SECRET-1"), ("stdin", "true")]),
        ("/api/v1/watch/namespaces/default/pods", [("token", "TOK-SECRET-2"), ("watch", "1")]),
        ("/api/v1/pods", [("access_token", "A-333"), ("limit", "5"), ("token", "B-444")]),
    ],
)
def test_token_query_values_in_the_request_uri_are_redacted(fixtures_dir, path, params):
    event = other_event(fixtures_dir)
    event["requestURI"] = path + "?" + "&".join(f"{k}={v}" for k, v in params)
    secrets = [v for k, v in params if k in URI_SECRET_PARAMS]
    redacted_uri = path + "?" + "&".join(
        f"{k}={MARKER if k in URI_SECRET_PARAMS else v}" for k, v in params)

    rows, report = parse(as_line(event))

    assert report.redacted == len(secrets)
    assert rows[0].request_uri == redacted_uri
    assert json.loads(rows[0].raw)["requestURI"] == redacted_uri
    assert not any(secret in rows[0].raw.decode() for secret in secrets)


@pytest.mark.parametrize("param", ["access_token", "id_token", "client_secret", "sig", "code"])
def test_a_uri_secret_is_redacted_alike_on_its_own_line_and_in_a_batch(fixtures_dir, param):
    event = other_event(fixtures_dir)
    event["requestURI"] = f"/apis/apps/v1/namespaces/default/deployments?{param}=VALUE-5150"

    line_rows, line_report = parse(as_line(copy.deepcopy(event)))
    batch_rows, batch_report = parse(as_batch(copy.deepcopy(event)))

    assert line_report.redacted == batch_report.redacted == 1
    assert line_rows[0].request_uri == batch_rows[0].request_uri == (
        f"/apis/apps/v1/namespaces/default/deployments?{param}={MARKER}")
    assert json.loads(line_rows[0].raw) == json.loads(batch_rows[0].raw)


# --- configuration -----------------------------------------------------------------------------

def pod_create(fixtures_dir: Path) -> dict:
    event = other_event(fixtures_dir, "create_nginx_pod_unprivileged.json")
    spec = {"containers": [
        {"name": "app", "image": "nginx", "env": [
            {"name": "DB_HOST", "value": "db.internal"},
            {"name": "FEATURE_FLAGS", "value": "alpha,beta"},
            {"name": "FROM_REF", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        ]},
        {"name": "sidecar", "image": "envoy", "env": [{"name": "MODE", "value": "proxy"}]},
        {"name": "plain", "image": "busybox"},
    ]}
    event["level"] = "RequestResponse"
    event["requestObject"] = {"kind": "Pod", "apiVersion": "v1",
                              "metadata": {"name": "web"}, "spec": spec}
    event["responseObject"] = copy.deepcopy(event["requestObject"])
    return event


def test_extra_paths_redact_the_configured_values_only(fixtures_dir):
    event = pod_create(fixtures_dir)
    containers = event["requestObject"]["spec"]["containers"]
    expected = sum(1 for c in containers for env in c.get("env", []) if "value" in env)
    redactor = Redactor(extra_paths=["requestObject.spec.containers.*.env.*.value"])

    assert Redactor().redact_event(copy.deepcopy(event)) == 0
    direct = copy.deepcopy(event)
    assert redactor.redact_event(direct) == expected
    rows, report = parse(as_line(event), redactor=redactor)

    assert report.redacted == expected
    stored = json.loads(rows[0].raw)
    assert stored == direct
    for before, after in zip(containers, stored["requestObject"]["spec"]["containers"],
                             strict=True):
        assert [e["name"] for e in after.get("env", [])] == [
            e["name"] for e in before.get("env", [])]
        for env_before, env_after in zip(before.get("env", []), after.get("env", []),
                                         strict=True):
            if "value" in env_before:
                assert env_after["value"] == MARKER
            else:
                assert env_after == env_before
    assert stored["responseObject"] == event["responseObject"]  # not on the configured path


def sensitive_events(fixtures_dir: Path) -> list[dict]:
    configmaps = [e for _raw, e in falco_lines(
        falco(fixtures_dir, "create_configmap_sensitive_values.json"))]
    uri = other_event(fixtures_dir)
    uri["requestURI"] += "?access_token=NOPE-123"
    jwt = other_event(fixtures_dir)
    jwt["user"]["extra"] = {"x": [JWT]}
    events = [*configmaps, secret_create(fixtures_dir), secret_list(fixtures_dir),
              token_review(fixtures_dir, "opaque-token-abcdefgh"), uri, jwt,
              pod_create(fixtures_dir)]
    for number, event in enumerate(events):  # several are built from the same falco event
        event["auditID"] = f"sensitive-{number}"
    return events


def test_a_disabled_redactor_redacts_nothing(fixtures_dir):
    events = sensitive_events(fixtures_dir)
    redactor = Redactor(enabled=False)

    for event in events:
        copied = copy.deepcopy(event)
        assert redactor.redact_event(copied) == 0
        assert copied == event
    assert Redactor(extra_paths=["requestObject.spec"], enabled=False).redact_event(
        copy.deepcopy(events[-1])) == 0

    lines_rows, lines_report = parse(b"".join(as_line(e) for e in events), redactor=redactor)
    batch_rows, batch_report = parse(as_batch(*events), redactor=redactor)

    assert lines_report.redacted == batch_report.redacted == 0
    by_id = {e["auditID"]: e for e in events}
    for row in lines_rows + batch_rows:
        assert row.raw is not None
        assert json.loads(row.raw) == by_id[row.audit_id]


def test_the_same_event_is_redacted_alike_on_its_own_line_and_in_a_batch(fixtures_dir):
    events = sensitive_events(fixtures_dir)
    expected = sum(Redactor().redact_event(copy.deepcopy(e)) for e in events)

    lines_rows, lines_report = parse(b"".join(as_line(e) for e in events))
    batch_rows, batch_report = parse(as_batch(*events))

    assert lines_report.redacted == batch_report.redacted == expected
    assert {r.audit_id: json.loads(r.raw) for r in lines_rows} == {
        r.audit_id: json.loads(r.raw) for r in batch_rows}


# --- the raw line spares the walk over every string --------------------------------------------

def escaped(line: bytes, word: bytes, at: int) -> bytes:
    """``line`` with letter ``at`` of every ``word`` in it written as a JSON escape."""
    return line.replace(word, word[:at] + f"\\u{word[at]:04x}".encode() + word[at + 1:])


def every_fixture_line(fixtures_dir: Path) -> list[bytes]:
    paths = sorted((fixtures_dir / "audit").rglob("*.json")) + sorted(
        (fixtures_dir / "audit").glob("*.log"))
    return [line.strip() for path in paths for line in path.read_bytes().split(b"\n")
            if line.strip().startswith(b"{")]


def test_with_its_line_an_event_is_redacted_as_without(fixtures_dir):
    """``redact_event(event, raw_line)`` skips the walk over strings only where the line shows
    that it would find nothing: on every real event and every sensitive one built here, and on
    the same lines with their tokens spelled through JSON escapes, the same values go."""
    lines = every_fixture_line(fixtures_dir) + [
        json.dumps(e).encode() for e in sensitive_events(fixtures_dir)]
    lines += [escaped(escaped(line, b"eyJ", 0), b"Bearer ", 1) for line in lines
              if b"eyJ" in line or b"Bearer " in line]
    redacted = 0
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:  # the malformed fixture
            continue
        if not isinstance(event, dict):
            continue
        without, given = copy.deepcopy(event), copy.deepcopy(event)
        count = Redactor().redact_event(without)
        assert Redactor().redact_event(given, line) == count, line[:200]
        assert given == without
        redacted += count
    assert redacted > 0


def test_a_token_spelled_through_an_escape_is_still_found():
    token = f"Bearer {'a1b2c3d4' * 4}"
    event = {"auditID": "x", "stage": "ResponseComplete", "requestObject": {
        "kind": "ConfigMap", "data": {"note": f"curl -H 'Authorization: {token}'"}}}
    line = escaped(json.dumps(event).encode(), b"Bearer ", 1)
    assert b"earer " not in line and json.loads(line) == event

    assert Redactor().redact_event(event, line) == 1
    assert event["requestObject"]["data"]["note"] == f"curl -H 'Authorization: Bearer {MARKER}'"
