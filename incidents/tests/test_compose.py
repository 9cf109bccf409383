"""docker-compose.yml lets ``docker compose up --scale worker=N`` run N ingest workers.

No Docker engine runs where the tests run, so the file is read as Compose reads it (YAML with
merge keys) and checked for what stops a service from scaling: a fixed container name or a
published host port (two replicas cannot both have them), a data volume other than the web
app's (a worker could not read the uploads web stored), and a periodic scheduler inside the
worker (N replicas would queue each periodic job N times).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


@pytest.fixture(scope="module")
def services() -> dict:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def _command(service: dict) -> list[str]:
    command = service.get("command") or []
    return command.split() if isinstance(command, str) else [str(part) for part in command]


def _mounts(service: dict) -> dict[str, str]:
    """Mount point → named volume (short syntax ``name:/path``, or the long one)."""
    mounts = {}
    for volume in service.get("volumes") or []:
        if isinstance(volume, str):
            source, target = volume.split(":")[:2]
        else:
            source, target = volume["source"], volume["target"]
        mounts[target] = source
    return mounts


def test_worker_can_scale(services):
    worker = services["worker"]
    assert "container_name" not in worker
    assert not worker.get("ports"), "a published host port can be bound by one replica only"
    command = _command(worker)
    assert command[:4] == ["celery", "-A", "hindsight", "worker"]
    assert "-B" not in command and "--beat" not in command, \
        "beat inside the worker runs once per replica"


def test_worker_reads_what_web_stores(services):
    web, worker = services["web"], services["worker"]
    data_dir = web["environment"]["HINDSIGHT_DATA_DIR"]
    assert worker["environment"]["HINDSIGHT_DATA_DIR"] == data_dir
    assert _mounts(web)[data_dir] == _mounts(worker)[data_dir]
    # and the same database and broker
    for name in ("DATABASE_URL", "CELERY_BROKER_URL"):
        assert worker["environment"][name] == web["environment"][name]


def test_one_scheduler(services):
    """The periodic jobs of settings.CELERY_BEAT_SCHEDULE are sent by exactly one service,
    which is not the scaled worker and is not replicated."""
    from django.conf import settings

    assert settings.CELERY_BEAT_SCHEDULE
    schedulers = [name for name, service in services.items()
                  if "beat" in _command(service) or "-B" in _command(service)]
    assert schedulers == ["beat"]
    beat = services["beat"]
    assert _command(beat)[:4] == ["celery", "-A", "hindsight", "beat"]
    assert (beat.get("deploy") or {}).get("replicas", 1) == 1
    assert "scale" not in beat
    assert beat["environment"]["CELERY_BROKER_URL"] == \
        services["worker"]["environment"]["CELERY_BROKER_URL"]


def test_only_web_publishes_a_port(services):
    published = {name for name, service in services.items() if service.get("ports")}
    assert published == {"web"}
