"""Celery tasks: thin interfaces to ``timelines.ingest``. JSON arguments (primary keys) only."""

from __future__ import annotations

import logging
import threading

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import connection, transaction

from .analysis.registry import complete_incident
from .ingest import fail_upload, ingest_upload, purge, uploads
from .ingest.pipeline import TRANSIENT_ERRORS

log = logging.getLogger(__name__)


@shared_task(
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,  # a killed worker's upload is delivered again and re-run
    autoretry_for=TRANSIENT_ERRORS,
    retry_backoff=5,
    retry_backoff_max=300,
    retry_jitter=True,
    max_retries=8,
)
def ingest_upload_task(self, upload_id: int) -> None:
    """Ingest one upload; a bundle's files each get a task of their own, so that several workers
    share a large bundle. If the upload row has been deleted meanwhile, does nothing; if another
    worker holds it, does nothing. Retries database errors with backoff; the run is idempotent.
    Delivered again after its worker died (``reject_on_worker_lost``) once too often, it fails
    the upload: a file that kills its worker every time (out of memory) must not loop."""
    if uploads.lost_too_often(upload_id, self.request.id):
        return
    failure = None
    try:
        upload = ingest_upload(upload_id, claimant=self.request.id or None, spawn=_spawn,
                               complete=False)
    except SoftTimeLimitExceeded:
        failure = (f"ingest took longer than {settings.CELERY_TASK_SOFT_TIME_LIMIT} s "
                   "and was stopped; the events stored so far are kept")
    except TRANSIENT_ERRORS as exc:
        if self.request.retries >= self.max_retries:
            fail_upload(upload_id, f"database unavailable after {self.max_retries} retries: {exc}")
        raise
    except Exception as exc:  # anything else is not transient: the upload's outcome, not a retry
        log.exception("ingest of upload %s failed", upload_id)
        failure = f"ingest failed: {_reason(exc)}"
    if failure is not None:
        # Out of the except block: the exception's frames, and whatever they still hold open,
        # are released before the upload's files are removed and its outcome written.
        fail_upload(upload_id, failure)
        return
    if upload is not None and upload.finished:
        try:
            complete_incident_task.delay(upload.incident_id)
        except Exception:  # the broker is away (a restart): the analyses here, now, instead
            log.warning("could not queue the analyses of incident %s; running them here",
                        upload.incident_id, exc_info=True)
            complete_incident(upload.incident_id)


@shared_task(soft_time_limit=1800, time_limit=1860, autoretry_for=TRANSIENT_ERRORS,
             retry_backoff=5, retry_jitter=True, max_retries=3)
def complete_incident_task(incident_id: int) -> None:
    """Behind the first answer: once an incident's uploads are all ``ready``, run its analyses
    (``analysis.registry.complete_incident``: guessed years settled, the column index, the
    overview, insights, pod facts, whatever is registered) and mark its uploads ``done``. Does
    nothing if the incident was deleted meanwhile, if an upload is still being read (its own
    task does this when it is ready) or if another run completed it. Idempotent: database errors
    are retried; a completion lost altogether is queued again by ``requeue_stale_uploads``, and
    meanwhile every read computes what it needs itself."""
    complete_incident(incident_id)


def finish_incident(incident_id: int, *, cache_figures: bool = True) -> bool:
    """The incident's analyses run now, whether or not an upload waits for them
    (``complete_incident``; ``cache_figures`` says whether the figures counted go to a cache
    the readers share); does nothing while an upload is still being read."""
    return complete_incident(incident_id, cache=cache_figures, again=True)


def _reason(exc: Exception) -> str:
    """What went wrong, for the user: an OS error's own words (``No space left on device``)
    without the server's paths, else the exception."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {exc}"


def _spawn(upload_ids: list[int]) -> None:
    for upload_id in upload_ids:
        ingest_upload_task.delay(upload_id)


@shared_task
def requeue_stale_uploads() -> int:
    """Give uploads whose worker was lost to a new worker, or fail them
    (``ingest.uploads.requeue_stale``); the beat runs it every minute. Returns how many."""
    return uploads.requeue_stale(enqueue_ingest, enqueue_complete)


@shared_task(
    acks_late=True,
    reject_on_worker_lost=True,
    autoretry_for=TRANSIENT_ERRORS,  # also a partition whose lock did not come within a second
    retry_backoff=5,
    retry_backoff_max=300,
    retry_jitter=True,
    max_retries=8,
    soft_time_limit=3600,
    time_limit=3660,
)
def purge_incident_task(incident_id: int) -> None:
    """Remove what a deleted incident left: events, body chunks, partition, files, column index
    (``ingest.purge``). Does nothing if its ``IncidentPurge`` row is gone (purged already).
    Database errors retry with backoff; if every try fails or the worker dies, the row stays and
    ``requeue_lost_purges`` queues it again."""
    purge.purge_incident(incident_id)


@shared_task
def requeue_lost_purges() -> int:
    """Queue again the purges of deleted incidents still listed ``purge.LOST_AFTER`` after they
    were queued (a lost message, a dead worker, retries exhausted); returns how many. Reads only
    the few rows of ``IncidentPurge``."""
    return purge.requeue_lost(purge.enqueue_purge)


def enqueue_ingest(upload_id: int) -> None:
    """Start ingesting an upload once the current transaction commits: on a Celery worker when
    a broker is configured, else in a thread of this process (the embedded default)."""
    if settings.CELERY_BROKER_URL:
        ingest_upload_task.delay_on_commit(upload_id)
        return
    transaction.on_commit(lambda: _start_thread(upload_id))


def enqueue_complete(incident_id: int) -> None:
    """Complete an incident (its analyses) on a Celery worker when a broker is configured,
    else in a thread of this process."""
    if settings.CELERY_BROKER_URL:
        complete_incident_task.delay(incident_id)
        return

    def run() -> None:
        try:
            complete_incident(incident_id)
        except Exception:  # the uploads stay ready: the next sweep starts it again
            log.exception("analyses of incident %s failed", incident_id)
        finally:
            connection.close()

    threading.Thread(target=run, name=f"complete-{incident_id}", daemon=True).start()


def _start_thread(upload_id: int) -> None:
    def run() -> None:
        try:
            failed = False
            try:
                # the first answer once ready, then the analyses in this same thread
                ingest_upload(upload_id)
            except Exception:  # the row says failed (unless it was ready); the log says why
                log.exception("ingest of upload %s failed", upload_id)
                failed = True
            if failed:  # out of the except block, as in ingest_upload_task
                fail_upload(upload_id, "ingest failed unexpectedly; see the server log")
        finally:
            connection.close()

    threading.Thread(target=run, name=f"ingest-{upload_id}", daemon=True).start()
