"""A pytest plugin (``-p hindsight.pytest_workers``, in pyproject.toml's addopts) that lets
pytest-xdist's workers run the suite side by side: each gets a Redis database of its own (the
Celery broker and the cache, which key by ids that every worker's test database hands out
again) and a data directory of its own. pytest-django already gives each its own test
database. Imported while pytest reads its options, before Django reads its settings."""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

REDIS_DATABASES = 16  # Redis's default number of databases


def own_redis(url: str, worker: int) -> str:
    """``url`` with database ``worker`` places below its own (above when there is no room),
    so that the first worker keeps the one it was given."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        return url
    base = int(parts.path.strip("/") or 0)
    database = base - worker if base >= worker else base + worker
    if not 0 <= database < REDIS_DATABASES:
        raise RuntimeError(f"no Redis database left for pytest-xdist worker {worker} of {url}")
    return urlunsplit(parts._replace(path=f"/{database}"))


def _configure(environ=os.environ) -> None:
    worker = environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, … in a worker, unset otherwise
    if not worker:
        return
    number = int(worker.removeprefix("gw"))
    for name in ("CELERY_BROKER_URL", "CACHE_URL"):
        if environ.get(name):
            environ[name] = own_redis(environ[name], number)
    if environ.get("HINDSIGHT_DATA_DIR"):
        environ["HINDSIGHT_DATA_DIR"] = os.path.join(environ["HINDSIGHT_DATA_DIR"], worker)


_configure()
