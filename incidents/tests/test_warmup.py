"""A fresh web process does at start what its first request would (``hindsight/warmup.py``): by
the time the WSGI application is imported, the views are imported, the templates compiled and
the libraries' first calls made; a database that is down does not stop it from starting.

Each case imports ``hindsight.wsgi`` in a subprocess of its own, as gunicorn's worker does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = sorted(str(p.relative_to(ROOT / "templates"))
                   for p in (ROOT / "templates").rglob("*.html"))

# What the fresh process reports once ``hindsight.wsgi`` is imported, before any request.
PROBE = r"""
import json, sys
import hindsight.wsgi
from django.template import engines
from django.urls import get_resolver
loader = engines["django"].engine.template_loaders[0]
print(json.dumps({
    "templates": sorted(loader.get_template_cache),
    "urls_ready": get_resolver()._populated,
    "modules": sorted(m for m in ("numpy", "timelines.web.api", "timelines.store.columns",
                                  "timelines.analysis.pods_views", "rest_framework.renderers")
                      if m in sys.modules),
}))
"""


def probe(env: dict) -> dict:
    result = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def environment(**extra) -> dict:
    db = connection.settings_dict
    return {**os.environ, "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:"
                                          f"{db['PORT'] or 5432}/{db['NAME']}", **extra}


@pytest.mark.django_db
def test_a_fresh_web_process_is_warm_before_its_first_request():
    warm = probe(environment())

    assert set(TEMPLATES) <= set(warm["templates"])
    assert warm["urls_ready"]
    assert warm["modules"] == ["numpy", "rest_framework.renderers", "timelines.analysis.pods_views",
                               "timelines.store.columns", "timelines.web.api"]

    cold = probe(environment(HINDSIGHT_WARM_UP="false"))  # what it was: all left to the request
    assert cold["templates"] == [] and not cold["urls_ready"]


def test_a_database_that_is_down_does_not_stop_the_web_process_from_starting():
    down = probe({**os.environ, "DATABASE_URL": "postgres://postgres@127.0.0.1:1/nothing"})

    assert set(TEMPLATES) <= set(down["templates"])  # the rest of the warm-up is done all the same
