"""Settings: every variable documented in ``.env.example``, importing them writes nothing,
``manage.py check --deploy`` clean with the documented production environment, safe defaults.

Settings are read once per process, so each case runs in a subprocess of its own environment.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ENV_EXAMPLE = ROOT / ".env.example"
SECURITY = ["SECURE_PROXY_SSL_HEADER", "SECURE_SSL_REDIRECT", "SESSION_COOKIE_SECURE",
            "CSRF_COOKIE_SECURE", "SECURE_HSTS_SECONDS", "SECURE_HSTS_INCLUDE_SUBDOMAINS",
            "SECURE_HSTS_PRELOAD"]


def documented() -> dict[str, str]:
    """Every ``NAME=value`` line of .env.example, commented out or not: the example values."""
    found = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if match := re.fullmatch(r"#? ?([A-Z][A-Z0-9_]*)=(.*)", line.strip()):
            found[match[1]] = match[2]
    return found


def read_by_settings() -> set[str]:
    """The variables the settings module (and the startup it defers to) read."""
    names = set()
    for path in (ROOT / "hindsight" / "settings.py", ROOT / "hindsight" / "apps.py"):
        source = path.read_text()
        names |= set(re.findall(r'env_\w+\(\s*"([A-Z][A-Z0-9_]*)"', source))
        names |= set(re.findall(r'os\.environ(?:\.get\(|\[)\s*"([A-Z][A-Z0-9_]*)"', source))
    return names


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any setting the tests did not choose."""
    # DJANGO_ALLOW_ASYNC_UNSAFE: set by the browser tests' fixture in this process (conftest.py),
    # never in production, where check --deploy rightly refuses it
    env = {k: v for k, v in os.environ.items()
           if k not in documented() and k not in ("DJANGO_SETTINGS_MODULE",
                                                  "DJANGO_ALLOW_ASYNC_UNSAFE")}
    env.update(DJANGO_SETTINGS_MODULE="hindsight.settings", **extra)
    return env


def production_env(data_dir: Path) -> dict[str, str]:
    """The documented production environment: .env.example's example values, a fresh key."""
    return clean_env(**{**documented(), "SECRET_KEY": secrets.token_urlsafe(50),
                        "HINDSIGHT_DATA_DIR": str(data_dir)})


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


SHOW = ("import json; from django.conf import settings as s; print(json.dumps({k: getattr(s, k) "
        "for k in ['SECURE_SSL_REDIRECT', 'SESSION_COOKIE_SECURE', 'CSRF_COOKIE_SECURE', "
        "'SECURE_HSTS_SECONDS', 'SECURE_HSTS_INCLUDE_SUBDOMAINS', 'SECURE_HSTS_PRELOAD', "
        "'SECURE_PROXY_SSL_HEADER', 'ALLOWED_HOSTS', 'SECRET_KEY']}))")


def shown(env: dict[str, str]) -> dict:
    done = run(["-c", SHOW], env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_env_example_lists_every_variable_the_settings_read():
    assert read_by_settings()  # the patterns still find the reads
    assert set(documented()) == read_by_settings()


def test_importing_the_settings_writes_nothing(tmp_path):
    for database in ("", "postgres://nobody@127.0.0.1:1/none"):  # SQLite, PostgreSQL
        data_dir = tmp_path / f"data{bool(database)}"
        data_dir.mkdir()
        env = clean_env(HINDSIGHT_DATA_DIR=str(data_dir), DATABASE_URL=database)

        done = run(["-c", "import hindsight.settings; from django.conf import settings; "
                          "print(settings.SECRET_KEY, settings.DATABASES)"], env)

        assert done.returncode == 0, done.stderr
        assert list(data_dir.iterdir()) == []


def test_startup_makes_the_data_dir_and_keeps_the_generated_key(tmp_path):
    data_dir = tmp_path / "data"
    env = clean_env(HINDSIGHT_DATA_DIR=str(data_dir))
    key = ("import django; django.setup(); from django.conf import settings; "
           "print(settings.SECRET_KEY)")

    first, second = run(["-c", key], env), run(["-c", key], env)

    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    stored = (data_dir / "secret_key").read_text()
    assert first.stdout.strip() == second.stdout.strip() == stored
    assert (data_dir / "secret_key").stat().st_mode & 0o077 == 0  # the owner's only
    assert (data_dir / "static").is_dir()


def test_check_deploy_is_clean_with_the_documented_production_environment(tmp_path):
    done = run(["manage.py", "check", "--deploy", "--fail-level", "WARNING"],
               production_env(tmp_path / "data"))

    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout


def test_check_deploy_warns_when_a_production_setting_is_turned_off(tmp_path):
    env = production_env(tmp_path / "data")
    env["SESSION_COOKIE_SECURE"] = "false"

    done = run(["manage.py", "check", "--deploy", "--fail-level", "WARNING"], env)

    assert done.returncode != 0 and "security.W012" in done.stderr + done.stdout


def test_an_https_site_without_a_secret_key_refuses_to_start(tmp_path):
    env = clean_env(HINDSIGHT_DATA_DIR=str(tmp_path), SITE_URL="https://hindsight.example.com")

    done = run(["-c", SHOW], env)

    assert done.returncode != 0
    assert "ImproperlyConfigured: SECRET_KEY must be set" in done.stderr


def test_https_turns_the_security_settings_on_and_plain_http_leaves_them_off(tmp_path):
    over_http = shown(clean_env(HINDSIGHT_DATA_DIR=str(tmp_path)))
    over_https = shown(clean_env(HINDSIGHT_DATA_DIR=str(tmp_path), SECRET_KEY="k" * 50,
                                 SITE_URL="https://hindsight.example.com"))

    for name in ("SECURE_SSL_REDIRECT", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE"):
        assert (over_http[name], over_https[name]) == (False, True), name
    assert over_http["SECURE_HSTS_SECONDS"] == 0 < over_https["SECURE_HSTS_SECONDS"]
    # promises beyond this site are never made by default
    assert not over_https["SECURE_HSTS_INCLUDE_SUBDOMAINS"]
    assert not over_https["SECURE_HSTS_PRELOAD"]
    assert over_http["SECURE_PROXY_SSL_HEADER"] is None
    assert "testserver" not in over_http["ALLOWED_HOSTS"]


def test_every_security_setting_comes_from_the_environment(tmp_path):
    values = {"SECURE_PROXY_SSL_HEADER": "HTTP_X_FORWARDED_PROTO,https",
              "SECURE_SSL_REDIRECT": "false", "SESSION_COOKIE_SECURE": "true",
              "CSRF_COOKIE_SECURE": "true", "SECURE_HSTS_SECONDS": "60",
              "SECURE_HSTS_INCLUDE_SUBDOMAINS": "true", "SECURE_HSTS_PRELOAD": "true",
              "ALLOWED_HOSTS": "a.example,b.example"}

    got = shown(clean_env(HINDSIGHT_DATA_DIR=str(tmp_path), **values))

    assert got["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert got["SECURE_SSL_REDIRECT"] is False
    assert got["SESSION_COOKIE_SECURE"] is got["CSRF_COOKIE_SECURE"] is True
    assert got["SECURE_HSTS_SECONDS"] == 60
    assert got["SECURE_HSTS_INCLUDE_SUBDOMAINS"] is got["SECURE_HSTS_PRELOAD"] is True
    assert got["ALLOWED_HOSTS"] == ["a.example", "b.example"]


@pytest.mark.parametrize(("name", "value"), [("SECURE_PROXY_SSL_HEADER", "X-Forwarded-Proto"),
                                             ("SECURE_SSL_REDIRECT", "maybe"),
                                             ("SECURE_HSTS_SECONDS", "a year")])
def test_a_bad_value_is_a_clear_error_naming_the_variable(name, value, tmp_path):
    done = run(["-c", SHOW], clean_env(HINDSIGHT_DATA_DIR=str(tmp_path), **{name: value}))

    assert done.returncode != 0
    assert f"ImproperlyConfigured: {name} must" in done.stderr


@pytest.mark.django_db
def test_the_healthcheck_is_never_redirected_to_https(client, settings):
    settings.SECURE_SSL_REDIRECT = True

    assert client.get("/healthz").status_code == 200
    assert client.get("/accounts/login/").status_code == 301


def test_compose_passes_every_security_setting_through():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for service in ("web", "worker"):
        environment = compose["services"][service]["environment"]
        assert set(SECURITY) <= set(environment), service


def test_each_pytest_worker_has_its_own_redis_database_and_data_directory(settings):
    """scripts/test.sh runs the PostgreSQL pass in pytest-xdist workers: the first keeps the
    Redis database it was given, the others take those below it (above, when there is no
    room), and this process's settings read what the plugin set."""
    from hindsight.pytest_workers import _configure, own_redis

    assert own_redis("redis://127.0.0.1:6379/15", 0) == "redis://127.0.0.1:6379/15"
    assert own_redis("redis://127.0.0.1:6379/15", 1) == "redis://127.0.0.1:6379/14"
    assert own_redis("redis://h:6379", 2) == "redis://h:6379/2"
    assert own_redis("rediss://:pw@h:6380/1", 3) == "rediss://:pw@h:6380/4"
    with pytest.raises(RuntimeError, match="worker 9"):
        own_redis("redis://h/8", 9)
    environ = {"PYTEST_XDIST_WORKER": "gw1", "CELERY_BROKER_URL": "redis://h/15",
               "HINDSIGHT_DATA_DIR": "/data"}
    _configure(environ)
    assert environ == {"PYTEST_XDIST_WORKER": "gw1", "CELERY_BROKER_URL": "redis://h/14",
                       "HINDSIGHT_DATA_DIR": "/data/gw1"}
    alone = {"CELERY_BROKER_URL": "redis://h/15"}
    _configure(alone)
    assert alone == {"CELERY_BROKER_URL": "redis://h/15"}
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:  # the suite's own run: the plugin ran before the settings were read
        assert settings.DATA_DIR.name == worker
