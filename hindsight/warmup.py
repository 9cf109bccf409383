"""A web process's first request as fast as the next ones: the work Django and the project
leave to the first request done at start instead (``hindsight.wsgi``).

Measured before: the first request of a fresh process took 0.5–1.2 s and the next ones at most
45 ms; what the first one paid for was importing the views and what they import, compiling the
templates, the database driver's first connection and the libraries' first calls
(``bench/cold``). ``HINDSIGHT_WARM_UP=false`` turns it off (``settings.WARM_UP``); only the
WSGI application does it, not ``manage.py`` commands or the Celery worker.
"""

from __future__ import annotations

import logging
import sys
import time
from io import BytesIO
from pathlib import Path

from django.conf import settings

log = logging.getLogger(__name__)

# Answered without a user (a redirect to the login page, 401, the login form) or without data:
# they go through the whole stack (middleware, sessions, authentication, DRF, the templates).
ANONYMOUS_PATHS = ["/healthz", "/", "/accounts/login/", "/api/v1/incidents/"]


def warm_up(application) -> float:
    """Import, compile and connect what the first request would, and send ``application`` a few
    anonymous requests; returns the seconds it took. Never raises: a database that is not up
    yet leaves the rest to the first request, as before."""
    started = time.perf_counter()
    try:
        _import_views()
        _compile_templates()
        _first_calls()
        for path in ANONYMOUS_PATHS:
            _request(application, path)
    except Exception:  # a warm-up that fails costs only the speed of the first request
        log.warning("warm-up incomplete", exc_info=True)
    seconds = time.perf_counter() - started
    log.info("warmed up in %.2f s", seconds)
    return seconds


def _import_views() -> None:
    from django.urls import get_resolver

    # every view imported and the URL tables built, those of each namespace too (``reverse``)
    resolvers = [get_resolver()]
    while resolvers:
        resolver = resolvers.pop()
        resolver.reverse_dict  # noqa: B018
        resolvers.extend(sub for _, sub in resolver.namespace_dict.values())
    from rest_framework.settings import api_settings

    for name in ("DEFAULT_RENDERER_CLASSES", "DEFAULT_PARSER_CLASSES",
                 "DEFAULT_AUTHENTICATION_CLASSES", "DEFAULT_PERMISSION_CLASSES",
                 "DEFAULT_THROTTLE_CLASSES", "DEFAULT_CONTENT_NEGOTIATION_CLASS",
                 "DEFAULT_PAGINATION_CLASS", "DEFAULT_FILTER_BACKENDS", "EXCEPTION_HANDLER"):
        getattr(api_settings, name)


def _compile_templates() -> None:
    """Every template of the project, compiled once (the cached loader keeps them)."""
    from django.template.loader import get_template

    for folder in (Path(d) for t in settings.TEMPLATES for d in t.get("DIRS", [])):
        for path in sorted(folder.rglob("*.html")):
            get_template(str(path.relative_to(folder)))


def _first_calls() -> None:
    """The first call of libraries that set themselves up on it."""
    import json

    import numpy as np
    import orjson
    import zstandard
    from django.core.cache import cache
    from django.core.serializers.json import DjangoJSONEncoder

    from hindsight.celery import app

    app.tasks  # noqa: B018 - the Celery app finalized, its task classes imported
    cache.get("hindsight:warm-up")  # the cache backend made (and connected)
    json.dumps({"warm": [1.5, None]}, cls=DjangoJSONEncoder)

    np.bincount(np.zeros(4, dtype=np.int64), minlength=2).cumsum()
    np.searchsorted(np.arange(4), 2)
    orjson.dumps({"warm": [1.5, None]}, option=orjson.OPT_SERIALIZE_NUMPY)
    zstandard.ZstdDecompressor().decompress(zstandard.ZstdCompressor(level=1).compress(b"warm"))


def _request(application, path: str) -> None:
    host = (settings.ALLOWED_HOSTS or ["localhost"])[0].lstrip(".")
    if host == "*":
        host = "localhost"
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": "",
               "SERVER_NAME": host, "SERVER_PORT": "80", "HTTP_HOST": host,
               "wsgi.url_scheme": "http", "wsgi.input": BytesIO(), "wsgi.errors": sys.stderr,
               "wsgi.version": (1, 0), "wsgi.multithread": False, "wsgi.multiprocess": True,
               "wsgi.run_once": False, "HTTP_ACCEPT": "text/html"}
    response = application(environ, lambda status, headers, exc_info=None: None)
    try:
        for _ in response:
            pass
    finally:
        if hasattr(response, "close"):
            response.close()
