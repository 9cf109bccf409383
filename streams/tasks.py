"""Periodic work of streams."""

from __future__ import annotations

import logging

from celery import shared_task

from .models import Stream
from .store import apply_retention

log = logging.getLogger(__name__)


@shared_task(time_limit=600)
def apply_stream_retention() -> int:
    """Empty every stream's slots past its retention (``store.apply_retention``); returns how
    many. A stream deleted meanwhile is simply not found."""
    emptied = 0
    for stream in Stream.objects.all():
        dropped = apply_retention(stream)
        if dropped:
            log.info("stream %s: slots %s emptied by retention", stream.pk, dropped)
        emptied += len(dropped)
    return emptied


@shared_task(time_limit=600)
def detect_stream_batch(stored: dict) -> dict[str, int]:
    """The Falco rules over one acknowledged batch (``streams.detect``)."""
    from .rounds import detect_batch

    return detect_batch(stored)
