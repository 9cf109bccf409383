"""What every Hindsight process needs on disk before it serves or works, made when Django starts
(``manage.py``, the WSGI server, a Celery worker, the tests) rather than when the settings are
imported: the data directory (the SQLite database lives there), the static root, and the
embedded default's secret key."""

from __future__ import annotations

import contextlib
import os

from django.apps import AppConfig
from django.conf import settings


class HindsightConfig(AppConfig):
    name = "hindsight"
    verbose_name = "Hindsight"

    def ready(self) -> None:
        prepare_data_dir()


def prepare_data_dir() -> None:
    """Make the data and static directories, and store the secret key the settings generated
    (no SECRET_KEY set, no key stored yet), so that the next start reads the same one. Two
    processes starting at once: the first stored key wins, the other process keeps its own until
    it restarts."""
    data_dir = settings.DATA_DIR
    data_dir.mkdir(parents=True, exist_ok=True)
    settings.STATIC_ROOT.mkdir(parents=True, exist_ok=True)
    key_file = settings.SECRET_KEY_FILE
    if os.environ.get("SECRET_KEY") or key_file.exists():
        return
    with contextlib.suppress(FileExistsError):
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(settings.SECRET_KEY)
