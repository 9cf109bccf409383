"""Shared fixtures: personas, fixture paths, and the guard that tests use the real services.

The test command (scripts/test.sh) sets DATABASE_URL to the local PostgreSQL and
CELERY_BROKER_URL to the local Redis. Tests marked ``embedded`` run in a second pass without
them, against SQLite, and only those run then.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
FIXTURES = ROOT.parent / "shared" / "fixtures"


def pytest_collection_modifyitems(config, items):
    """Each pass runs only its own tests: ``embedded`` ones without DATABASE_URL (SQLite), the
    rest with it (PostgreSQL). The others are deselected, not skipped: nothing is hidden, the
    test command runs both passes."""
    embedded_pass = not os.environ.get("DATABASE_URL")
    keep, drop = [], []
    for item in items:
        (keep if embedded_pass == ("embedded" in item.keywords) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="session", autouse=True)
def _require_services(django_db_blocker):
    """Fail, never skip, when the services the suite needs are missing."""
    if not FIXTURES.is_dir():
        pytest.fail(f"fixtures not found at {FIXTURES}", pytrace=False)
    if not os.environ.get("DATABASE_URL"):
        return
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.fail("DATABASE_URL is set but the database is not PostgreSQL", pytrace=False)
    import redis

    try:
        redis.Redis.from_url(os.environ["CELERY_BROKER_URL"]).ping()
    except Exception as exc:  # noqa: BLE001 - any failure means the suite cannot run
        pytest.fail(f"Redis at CELERY_BROKER_URL is unreachable: {exc}", pytrace=False)


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture
def demo_log() -> Path:
    """audit2rbac's demo log: 37 requests, impersonation, 403s."""
    return FIXTURES / "audit" / "audit2rbac-demo.log"


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def team(db):
    from incidents.models import Team

    return Team.objects.create(name="platform")


@pytest.fixture
def other_team(db):
    from incidents.models import Team

    return Team.objects.create(name="payments")


def _member(username, team, role):
    from django.contrib.auth import get_user_model

    from incidents.models import Membership

    user = get_user_model().objects.create_user(username=username, password="pw-" + username)
    if team is not None:
        Membership.objects.create(team=team, user=user, role=role)
    return user


@pytest.fixture
def owner(team):
    """Editor of ``team``: may upload, annotate, share."""
    return _member("owner", team, "editor")


@pytest.fixture
def teammate(team):
    """Viewer of ``team``: may look, not upload."""
    return _member("teammate", team, "viewer")


@pytest.fixture
def outsider(other_team):
    """Editor of another team: must see nothing of ``team``'s incidents."""
    return _member("outsider", other_team, "editor")


@pytest.fixture
def superuser(db):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_superuser("root", "root@example.com", "pw-root")


@pytest.fixture
def incident(team, owner):
    from incidents.models import Incident

    return Incident.objects.create(title="etcd overload", team=team, created_by=owner)


@pytest.fixture
def token_for():
    """``token_for(user, scope="full")`` → the key of a new API token."""
    from incidents.models import ApiToken

    def make(user, scope="full"):
        return ApiToken.issue(user, scope=scope)[1]

    return make


@pytest.fixture
def api(client, owner, token_for):
    """``api(url, params=None, key=<owner's token>)`` → a GET with that token (None: none)."""
    key = token_for(owner)

    def get(url, params=None, key=key):
        headers = {"Authorization": f"Token {key}"} if key else {}
        return client.get(url, params or {}, headers=headers)

    return get


@pytest.fixture
def api_as():
    """``api_as(user, scope="full")`` → an APIClient sending that user's token (None:
    anonymous)."""
    from rest_framework.test import APIClient

    from incidents.models import ApiToken

    def make(user=None, scope="full"):
        client = APIClient()
        if user is not None:
            client.credentials(HTTP_AUTHORIZATION=f"Token {ApiToken.issue(user, scope=scope)[1]}")
        return client

    return make


@pytest.fixture
def ingest_file():
    """``ingest_file(incident, path)`` → the finished Upload, ingested in-process."""
    from timelines.ingest import create_local_upload, ingest_upload

    def run(incident, path):
        upload = create_local_upload(incident, path)
        return ingest_upload(upload.pk)

    return run


@pytest.fixture
def task_queue():
    """A Celery queue of this test's own, as the default for the tasks it sends, so that no
    stale message of an earlier run interferes and none is left behind; yields its name."""
    import uuid

    import redis
    from django.conf import settings

    from hindsight.celery import app

    name = f"test-{uuid.uuid4().hex[:8]}"
    previous = app.conf.task_default_queue
    app.conf.task_default_queue = name
    yield name
    app.conf.task_default_queue = previous
    redis.Redis.from_url(settings.CELERY_BROKER_URL).delete(name)


@pytest.fixture(autouse=True)
def _isolated_data_dir(settings, tmp_path):
    settings.UPLOAD_DIR = tmp_path / "uploads"
    settings.COLUMNS_DIR = tmp_path / "columns"


CHROMIUM = "/usr/bin/chromium"  # Debian's, installed by scripts/browser.sh
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"


@pytest.fixture(scope="session")
def browser():
    """Headless Debian Chromium driven by Playwright, with WebGL on SwiftShader."""
    # Playwright's sync API runs an event loop in this thread; the ORM calls the tests make
    # around it are still synchronous.
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/browser.sh", pytrace=False)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=["--enable-unsafe-swiftshader", "--use-angle=swiftshader", "--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture
def open_page(browser, live_server, request):
    """``open_page(user=None, path="/")`` → a Playwright page in a fresh browser context, signed
    in as ``user`` (anonymous when None), at ``live_server.url + path``. Every page's last view
    is saved to test-artifacts/screenshots/<test>-<n>.png."""
    from django.conf import settings
    from django.test import Client

    contexts = []

    def make(user=None, path="/"):
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        contexts.append(context)
        if user is not None:
            client = Client()
            client.force_login(user)
            cookie = client.cookies[settings.SESSION_COOKIE_NAME]
            context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": cookie.value,
                                  "url": live_server.url}])
        page = context.new_page()
        page.set_default_timeout(15_000)
        page.goto(live_server.url + path)
        return page

    yield make
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    stem = request.node.name.replace("/", "_").replace("[", "-").rstrip("]")
    for n, context in enumerate(contexts):
        for m, page in enumerate(context.pages):
            try:
                page.screenshot(path=str(SCREENSHOTS / f"{stem}-{n}{m}.png"), full_page=True)
            except Exception:  # noqa: BLE001 - a closed page leaves no picture, not a failure
                pass
        context.close()
