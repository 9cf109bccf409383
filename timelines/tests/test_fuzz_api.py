"""schemathesis against the OpenAPI schema (``/api/schema/``): requests generated from the schema
to every GET endpoint, with a token of the incident's editor, over an incident holding fixture
evidence (audit requests, Kubernetes Events, klog lines). No answer may be a server error (5xx),
and every answer must conform to the schema (a documented status's body of the documented
shape, its content type).

The calls go through Django's WSGI application in-process (``schemathesis.openapi.from_wsgi``),
in the test's own transaction. Path parameters that name an incident, event or upload are set
to the real ones half of the time, so that generated query strings reach the filters and the
figures instead of a 404. ``HINDSIGHT_API_FUZZ_EXAMPLES`` sets the requests per endpoint.
"""

from __future__ import annotations

import os
import random

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
)

from timelines.models import Event

pytestmark = pytest.mark.django_db

EXAMPLES = int(os.environ.get("HINDSIGHT_API_FUZZ_EXAMPLES", "40"))
# Not status_code_conformance: the schema documents each operation's success only, not the
# 400/401/403/404 every endpoint may answer (drf-spectacular's default).
CHECKS = [not_a_server_error, content_type_conformance, response_schema_conformance]


@pytest.fixture
def wsgi():
    """Django's WSGI application, without closing the database connection at each request's
    start and end (as Django's test client does): the requests run in the test's transaction."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield get_wsgi_application()
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def evidence(incident, ingest_file, fixtures_dir):
    uploads = [ingest_file(incident, fixtures_dir / name) for name in (
        "audit/audit2rbac-demo.log", "events/kspan-deployment-2-pods.yaml",
        "klog/kind-kube-apiserver.txt")]
    assert all(upload.status == "done" for upload in uploads)
    return {"incident": incident.pk, "upload": uploads[0].pk,
            "events": list(Event.objects.filter(incident=incident).values_list("pk", flat=True))}


def _real_ids(path: str, parameters: dict, ids: dict, rng: random.Random) -> dict:
    parameters = dict(parameters or {})
    if "incident_pk" in parameters:
        parameters["incident_pk"] = ids["incident"]
    if "id" in parameters and path.startswith("/api/v1/incidents/{id}"):
        parameters["id"] = ids["incident"]
    elif "id" in parameters and path.startswith("/api/v1/events/"):
        parameters["id"] = rng.choice(ids["events"])
    elif "id" in parameters and path.startswith("/api/v1/uploads/"):
        parameters["id"] = ids["upload"]
    return parameters


def _fuzz(operation, headers: dict, ids: dict, rng: random.Random) -> None:
    @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
              phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy())
    def run(case):
        if rng.random() < 0.5:
            case.path_parameters = _real_ids(operation.path, case.path_parameters, ids, rng)
        response = case.call(headers=headers)
        case.validate_response(response, checks=CHECKS, headers=headers)

    run()


def test_no_get_endpoint_answers_a_server_error_or_outside_its_schema(wsgi, evidence, owner,
                                                                       token_for):
    schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", wsgi)
    headers = {"Authorization": f"Token {token_for(owner)}"}
    rng = random.Random(14)
    tested, failures = [], []
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.method.upper() != "GET":
            continue
        try:
            _fuzz(operation, headers, evidence, rng)
        except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001 - every endpoint is run
            failures.append(f"GET {operation.path}: {exc}"[:3000])
        tested.append(operation.path)
    assert len(tested) >= 20
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize("value", ["0121-09-05T10:05:44.3409+20:19", "2024-05-01T12:00:00+23:59",
                                   "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
def test_a_time_filter_with_any_offset_is_an_answer_never_a_server_error(api, incident, value):
    """Found by schemathesis: an offset past 15:59 reached PostgreSQL (500); a time UTC cannot
    hold is a 400 that names the parameter."""
    for url in (f"/api/v1/incidents/{incident.pk}/events/",
                f"/api/v1/incidents/{incident.pk}/annotations/"):
        for name in ("since", "until"):
            response = api(url, {name: value})
            assert response.status_code in (200, 400), (url, name, response.content[:300])
            if response.status_code == 400:
                assert name in response.json()


def test_a_nul_in_a_filter_value_is_a_bad_request(api, incident):
    """Found by schemathesis: ``user=\\x00…`` on the facets reached PostgreSQL (500)."""
    for path, params in (("facets/", {"field": "verb", "user": "\x00a"}),
                         ("events/", {"verb": ["get", "x\x00"]}), ("events/", {"q": "\x00"}),
                         ("overview/", {"namespace": "\x00"}), ("figure/", {"resource": "\x00"})):
        response = api(f"/api/v1/incidents/{incident.pk}/{path}", params)
        assert response.status_code == 400, (path, response.content[:300])
