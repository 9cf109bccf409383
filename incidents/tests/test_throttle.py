"""Request rate limits: ``HINDSIGHT_API_RATE`` on every API request, ``HINDSIGHT_UPLOAD_RATE`` on
creating uploads, counted in the Redis cache that all web processes share."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis
from django.conf import settings as django_settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def rates(settings):
    """``rates(api=..., upload=...)`` sets the limits, counted under a key prefix of this test's
    own in the real Redis cache; yields the prefix."""
    prefix = f"test-throttle-{uuid.uuid4().hex[:8]}"
    settings.CACHES = {"default": {**django_settings.CACHES["default"], "KEY_PREFIX": prefix}}
    assert settings.CACHES["default"]["BACKEND"].endswith("RedisCache")

    def set_rates(api="1000/min", upload="1000/min"):
        settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK,
                                   "DEFAULT_THROTTLE_RATES": {"api": api, "upload": upload}}

    set_rates.prefix = prefix
    yield set_rates
    connection = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    for key in connection.scan_iter(f"{prefix}:*"):
        connection.delete(key)


def as_user(user, token_for) -> Client:
    return Client(headers={"Authorization": f"Token {token_for(user)}"})


def test_past_the_api_rate_requests_get_429_with_retry_after(rates, owner, teammate, incident,
                                                             token_for):
    rates(api="3/min")
    client = as_user(owner, token_for)

    codes = [client.get(f"/api/v1/incidents/{incident.pk}/").status_code for _ in range(4)]

    assert codes == [200, 200, 200, 429]
    refused = client.get("/api/v1/incidents/")
    assert refused.status_code == 429
    assert 0 < int(refused.headers["Retry-After"]) <= 60
    assert "throttled" in refused.json()["detail"].lower()
    # counted per user: another user is not held back, another token of the same user is
    assert as_user(teammate, token_for).get("/api/v1/incidents/").status_code == 200
    assert as_user(owner, token_for).get("/api/v1/incidents/").status_code == 429


def test_the_upload_rate_limits_creating_uploads_only(rates, owner, incident, token_for,
                                                      demo_log):
    rates(api="1000/min", upload="2/min")
    client = as_user(owner, token_for)

    def post():
        return client.post("/api/v1/uploads/", {
            "incident_id": incident.pk,
            "file": SimpleUploadedFile("audit.log", demo_log.read_bytes())})

    created = [post() for _ in range(2)]
    refused = post()

    assert [r.status_code for r in created] == [202, 202]
    assert refused.status_code == 429
    assert incident.uploads.count() == 2
    assert client.get(created[0].json()["url"]).status_code == 200


def test_anonymous_requests_are_counted_by_address(rates, owner, token_for):
    rates(api="2/min")
    stranger = Client(REMOTE_ADDR="203.0.113.7")

    codes = [stranger.get("/api/v1/incidents/").status_code for _ in range(3)]

    assert codes == [401, 401, 401]  # refused before being counted: authentication comes first
    schema = [stranger.get("/api/schema/").status_code for _ in range(3)]
    assert schema == [200, 200, 429]
    assert Client(REMOTE_ADDR="203.0.113.8").get("/api/schema/").status_code == 200


def test_the_counts_live_in_redis_where_every_process_sees_them(rates, owner, token_for):
    rates(api="5/min")
    client = as_user(owner, token_for)
    for _ in range(3):
        client.get("/api/v1/incidents/")

    connection = redis.Redis.from_url(django_settings.CACHES["default"]["LOCATION"])
    keys = [k.decode() for k in connection.scan_iter(f"{rates.prefix}:*")]

    assert keys == [f"{rates.prefix}:1:throttle_api_user-{owner.pk}"]


def settings_in_a_new_process(**env) -> str:
    """Import the settings with only ``env`` set; the CACHES backend and the rates, or the
    error."""
    clean = {k: v for k, v in os.environ.items()
             if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "CACHE_URL")}
    code = ("from django.conf import settings as s; "
            "print(s.CACHES['default']['BACKEND'], s.CACHES['default'].get('LOCATION'), "
            "s.REST_FRAMEWORK['DEFAULT_THROTTLE_RATES'])")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, env={**clean, "DJANGO_SETTINGS_MODULE": "hindsight.settings",
                                          **env})
    return done.stdout + done.stderr


def test_the_cache_is_redis_whenever_there_is_one(tmp_path):
    data = {"HINDSIGHT_DATA_DIR": str(tmp_path)}
    assert "LocMemCache" in settings_in_a_new_process(**data)
    assert "RedisCache redis://broker:6379/0" in settings_in_a_new_process(
        CELERY_BROKER_URL="redis://broker:6379/0", **data)
    assert "RedisCache redis://cache:6379/1" in settings_in_a_new_process(
        CELERY_BROKER_URL="redis://broker:6379/0", CACHE_URL="redis://cache:6379/1", **data)
    assert "ImproperlyConfigured: CACHE_URL" in settings_in_a_new_process(
        CACHE_URL="memcached://cache:11211", **data)


def test_rates_come_from_the_environment(tmp_path):
    data = {"HINDSIGHT_DATA_DIR": str(tmp_path)}
    assert "{'api': '1200/min', 'upload': '60/min'}" in settings_in_a_new_process(**data)
    assert "{'api': '50/s', 'upload': None}" in settings_in_a_new_process(
        HINDSIGHT_API_RATE="50/s", HINDSIGHT_UPLOAD_RATE="off", **data)
    assert "HINDSIGHT_API_RATE must look like 1200/min" in settings_in_a_new_process(
        HINDSIGHT_API_RATE="lots", **data)
