"""The OpenAPI schema (``/api/schema/``) and its Swagger UI (``/api/docs/``): public, complete,
valid, and served without any other host."""

from __future__ import annotations

import re

import pytest
import yaml
from django.core.management import call_command
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

pytestmark = pytest.mark.django_db

NAMED_GROUP = re.compile(r"\(\?P<(\w+)>[^)]*\)")
CONVERTER = re.compile(r"<(?:\w+:)?(\w+)>")


def url_paths(patterns=None, prefix: str = "") -> set[str]:
    """Every URL of the project as an OpenAPI path (``/api/v1/incidents/{id}/``), read from
    the resolver itself, not from drf-spectacular's own walk; format-suffix variants left
    out."""
    paths = set()
    for entry in get_resolver().url_patterns if patterns is None else patterns:
        route = str(entry.pattern)
        if "(?P<format>" in route or "<drf_format_suffix" in route:
            continue
        route = CONVERTER.sub(r"{\1}", NAMED_GROUP.sub(r"{\1}", route.lstrip("^").rstrip("$")))
        # drf-spectacular names a primary key {id}, as the API answers do
        route = route.replace("\\.", ".").replace("{pk}", "{id}")
        if isinstance(entry, URLResolver):
            paths |= url_paths(entry.url_patterns, prefix + route)
        elif isinstance(entry, URLPattern):
            paths.add("/" + prefix + route)
    return paths


@pytest.fixture(scope="module")
def schema(django_db_blocker, tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("schema") / "schema.yaml"
    with django_db_blocker.unblock():
        call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(path))
    return yaml.safe_load(path.read_text())


def test_the_schema_builds_valid_and_without_warnings(schema):
    assert schema["openapi"].startswith("3.")
    assert schema["components"]["securitySchemes"]["tokenAuth"]["name"] == "Authorization"


def test_every_api_url_is_in_the_schema(schema):
    api = {p for p in url_paths() if p.startswith("/api/v1/")} - {"/api/v1/"}  # the root lists
    assert "/api/v1/incidents/{id}/share-links/" in api  # the walk finds router routes
    assert "/api/v1/incidents/{incident_pk}/figure/" in api

    missing = sorted(api - set(schema["paths"]))

    assert not missing, f"not in the OpenAPI schema: {missing}"
    assert set(schema["paths"]) <= api


def test_every_operation_says_what_it_answers(schema):
    undescribed = [f"{method.upper()} {path}" for path, operations in schema["paths"].items()
                   for method, operation in operations.items()
                   if not any(code.startswith("2") for code in operation.get("responses", {}))]
    assert not undescribed


def test_the_schema_is_public():
    response = Client().get("/api/schema/", HTTP_ACCEPT="application/json")

    assert response.status_code == 200
    assert "/api/v1/uploads/" in response.json()["paths"]


def test_the_docs_page_needs_no_other_host():
    response = Client().get("/api/docs/")

    assert response.status_code == 200
    page = response.content.decode()
    assert "SwaggerUIBundle" in page
    assert not re.search(r"(?:https?:)?//(?!testserver)[\w.-]+\.\w+", page), "an external host"
    assert '"validatorUrl": null' in page  # Swagger UI would call validator.swagger.io
    assets = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert len(assets) >= 4  # css, favicon, bundle, preset
    for asset in assets:
        assert asset.startswith("/static/"), asset
        served = Client().get(asset)
        assert served.status_code == 200, asset
