"""What runs after the first answer: the analyses of an incident, registered in one place.

An incident's uploads go ``reading`` → ``ready`` → ``complete`` (``Upload.Stage``). Once the last
of them is ``ready`` (its events stored, every read answering exactly), ``complete_incident``
runs the analyses registered here, in order, behind the first answer (a Celery task, the
embedded ingest thread, or a detached process of ``manage.py ingest``), shows its progress on
the uploads (``Upload.analyses``), and then marks them ``done``/``complete``.

Adding an analysis is one line, a function of the incident's id, registered with a name::

    @after_ready("findings")
    def refresh_findings(incident_id: int) -> None: ...

in a module that this one imports (``_register_builtin`` below), or here. Those registered
``alongside=True`` (the column index, the overview counted from it, then a bulk load's
partition indexes) run in a thread of their own beside the others, on PostgreSQL outside a
caller's transaction: the others are mostly queries too, so the two lanes keep both CPUs busy
(the detections wait for the column index they read, ``timelines.store.columns.wait_built``).
An analysis must be
idempotent (a lost run is run again) and must not change what reads answer, only how fast:
every reader computes what it needs itself when an analysis has not run yet. Its failure is
logged and does not stop the others; database connection errors propagate, so that the
worker's task retries the whole completion.
"""

from __future__ import annotations

import contextvars
import ctypes
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import timedelta

from django.conf import settings
from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    connection,
    connections,
    transaction,
)
from django.db.models import Q
from django.utils import timezone

from incidents.models import Upload

log = logging.getLogger(__name__)

Analysis = Callable[[int], None]

# name → analysis, in the order of registration (the order they run in)
ANALYSES: dict[str, Analysis] = {}
ALONGSIDE: set[str] = set()  # of those, the ones run in the thread beside the others

COLUMN_INDEX = "column index"  # the analysis that builds it (``timelines.store.columns``)

# Whether counted figures go to a cache other processes share (``cache_figures()``).
_cache_figures: contextvars.ContextVar[bool] = contextvars.ContextVar("cache_figures",
                                                                     default=True)


def after_ready(name: str, *, alongside: bool = False) -> Callable[[Analysis], Analysis]:
    """Register ``function(incident_id)`` to run after the incident's first answer is ready;
    ``alongside``: in the thread beside the others (see above)."""
    def register(function: Analysis) -> Analysis:
        if name in ANALYSES and ANALYSES[name] is not function:
            raise ValueError(f"two analyses named {name!r}")
        ANALYSES[name] = function
        if alongside:
            ALONGSIDE.add(name)
        return function
    return register


def registered() -> dict[str, Analysis]:
    """Every analysis, by name, in the order they run."""
    _register_builtin()
    return ANALYSES


def cache_figures() -> bool:
    """Whether an analysis should count and cache figures: only where the cache is the readers'
    own (not in a ``manage.py ingest`` process with the in-process cache)."""
    return _cache_figures.get()


def still_reading(incident_id: int) -> bool:
    """Whether an upload of the incident is waiting or being read (its events not all stored)."""
    return Upload.objects.filter(
        Q(status=Upload.Status.PENDING)
        | Q(status=Upload.Status.RUNNING, stage=Upload.Stage.READING),
        incident_id=incident_id).exists()


def prepare_reads(incident_id: int) -> None:
    """What the first answer needs once every file is stored: the years of logs that had none
    settled (``ingest.years.settle_years``: it moves rows), one name per node
    (``ingest.nodes.unify_node_names``: it renames rows), the state time points that audit
    requests also hold folded into those requests (``statelinks``: it removes rows) and the
    planner's statistics of time order. Part of ``ready``, not of the analyses: cheap, and it
    changes answers or their speed. It names the ingest modules it calls, not the package
    ``timelines.ingest``, which hands on the pipeline that calls ``complete_incident``: neither of
    them imports this module back."""
    from ..ingest.nodes import unify_node_names
    from ..ingest.store import analyze_time_order
    from ..ingest.years import settle_years
    from .statelinks import fold_state_into_requests

    settle_years(incident_id)
    unify_node_names(incident_id)
    fold_state_into_requests(incident_id)
    analyze_time_order()


def complete_incident(incident_id: int, *, cache: bool = True, again: bool = False) -> bool:
    """Run every registered analysis of the incident and mark its ``ready`` uploads ``done`` and
    ``complete``; returns whether it did. Does nothing while an upload of the incident is still
    being read (the last one to be ready completes) or when none is ``ready`` (completed
    already, or the incident was deleted meanwhile). ``cache``: see ``cache_figures``. Uploads
    that become ready meanwhile are left ``ready`` for their own completion. ``again``: run
    the analyses even if no upload waits for them (``manage.py`` commands, tests)."""
    if still_reading(incident_id):
        return False
    ready = Upload.objects.filter(incident_id=incident_id, status=Upload.Status.RUNNING,
                                  stage=Upload.Stage.READY)
    ids = list(ready.values_list("pk", flat=True))
    run = f"{uuid.uuid4()}"
    if not again and (not ids or not _claim(ids, run)):
        return False
    analyses = list(registered().items())
    prepare_reads(incident_id)
    progress = _Progress(ids, run, len(analyses))
    # A caller's open transaction is seen by no other connection, and SQLite has one writer.
    beside = [a for a in analyses if a[0] in ALONGSIDE] if (
        connection.vendor == "postgresql" and not connection.in_atomic_block) else []
    lane = _Lane(incident_id, beside, progress, cache) if beside else None
    token = _cache_figures.set(cache)
    try:
        with _share_of_cpus(lanes=2 if lane is not None else 1):
            _run(incident_id, [a for a in analyses if a not in beside], progress)
    finally:
        _cache_figures.reset(token)
        if lane is not None:
            lane.join()  # its database errors are raised here, as the others' are
    Upload.objects.filter(pk__in=ids, status=Upload.Status.RUNNING,
                          stage=Upload.Stage.READY).update(
        status=Upload.Status.DONE, stage=Upload.Stage.COMPLETE,
        analyses={"done": progress.total, "total": progress.total}, heartbeat_at=timezone.now())
    return True


def _run(incident_id: int, analyses: list[tuple[str, Analysis]], progress: _Progress,
         ended: Callable[[str], None] = lambda name: None) -> None:
    """The analyses one after the other; ``ended(name)`` after each, whether it failed or not."""
    for name, analysis in analyses:
        progress.started(name)
        started = time.monotonic()
        try:
            analysis(incident_id)
        except (OperationalError, InterfaceError):
            raise
        except Exception:  # the readers compute it themselves: never fail the ingest
            log.exception("analysis %r of incident %s failed", name, incident_id)
        finally:
            progress.ended(name)
            ended(name)
        log.info("analysis %r of incident %s: %.2f s", name, incident_id,
                 time.monotonic() - started)
        _give_back_memory()


# PostgreSQL's settings of parallel work that ``_share_of_cpus`` sets on a lane's connection
_PARALLEL_SETTINGS = ("max_parallel_workers_per_gather", "max_parallel_maintenance_workers")


@contextmanager
def _share_of_cpus(lanes: int) -> Iterator[None]:
    """Plan this connection's queries and index builds for a lane's share of the CPUs: the
    lanes are the parallel work, and a parallel plan's workers only take CPU from the other
    lane (and cost their own: the insights of 500,000 requests took 10.5 s of PostgreSQL's CPU
    with two workers per query, 7.6 s without, bench/README.md). With two lanes on two CPUs,
    no workers; on eight, three per query. Reset after (a worker's connection serves other
    tasks next); nothing on SQLite."""
    if connection.vendor != "postgresql":
        yield
        return
    workers = max(0, (os.cpu_count() or 1) // lanes - 1)
    with connection.cursor() as cursor:
        for name in _PARALLEL_SETTINGS:
            cursor.execute(f"SET {name} = {int(workers)}")
    try:
        yield
    finally:
        # (not over an error of the connection's: that one is what the caller hears)
        if connection.connection is not None:
            with suppress(DatabaseError), connection.cursor() as cursor:
                for name in _PARALLEL_SETTINGS:
                    cursor.execute(f"RESET {name}")


def _give_back_memory() -> None:
    """Return the heap an analysis freed to the system (glibc's ``malloc_trim``; elsewhere
    nothing). glibc keeps what a thread freed in that thread's arena: the column index's build
    (500,000 events) left 48 MB held in the lane's thread while the detections, in the other,
    took theirs, and a million requests' analyses peaked at 346 MB instead of 283 MB."""
    if _malloc_trim is not None:
        _malloc_trim(0)


def _find_malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


_malloc_trim = _find_malloc_trim()


class _Progress:
    """The uploads' ``analyses`` as the two lanes go: how many are done, which are running."""

    def __init__(self, ids: list[int], run: str, total: int) -> None:
        self.ids, self.run, self.total = ids, run, total
        self.done = 0
        self.running: list[str] = []
        self.lock = threading.Lock()

    def started(self, name: str) -> None:
        with self.lock:
            self.running.append(name)
            self._show()

    def ended(self, name: str) -> None:
        with self.lock:
            self.running.remove(name)
            self.done += 1

    def _show(self) -> None:
        _show(self.ids, {"done": self.done, "total": self.total,
                         "running": ", ".join(self.running), "run": self.run})


class _Lane(threading.Thread):
    """The analyses registered ``alongside``, in a thread of their own with its own database
    connection; the column index's build is announced before it starts, so that whatever
    reads the index waits for it (``columns.wait_built``) instead of finding none: until the
    index is built, not until the lane's other analyses (the partition indexes) end."""

    def __init__(self, incident_id: int, analyses: list[tuple[str, Analysis]],
                 progress: _Progress, cache: bool) -> None:
        super().__init__(name=f"analyses-{incident_id}", daemon=True)
        from ..store import columns

        self.incident_id, self.analyses, self.progress = incident_id, analyses, progress
        self.context = contextvars.copy_context()
        self.context.run(_cache_figures.set, cache)
        self.error: BaseException | None = None
        self.built = columns.announce_build(incident_id)
        self.start()

    def run(self) -> None:
        try:
            with _share_of_cpus(lanes=2):
                # the readers of the index go on once it is built, not after the whole lane
                self.context.run(_run, self.incident_id, self.analyses, self.progress,
                                 lambda name: name == COLUMN_INDEX and self.built())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            self.error = exc
        finally:
            self.built()
            connections.close_all()

    def join(self, timeout: float | None = None) -> None:
        super().join(timeout)
        if self.error is not None:
            raise self.error


def _claim(ids: list[int], run: str) -> bool:
    """Whether this run takes the analyses of these ready uploads: none is being analysed by
    another run (``analyses["run"]``, with a fresh heartbeat), so that the tasks of a bundle's
    last files, finishing together, do not both run them."""
    stale = timezone.now() - timedelta(seconds=settings.UPLOAD_STALE_SECONDS)
    ready = Upload.objects.filter(pk__in=ids, status=Upload.Status.RUNNING,
                                  stage=Upload.Stage.READY)
    with transaction.atomic():  # the rows locked: two runs claim one after the other
        rows = list(ready.select_for_update().values_list("analyses", "heartbeat_at"))
        if not rows or any((analyses or {}).get("run") and beat and beat >= stale
                           for analyses, beat in rows):
            return False
        ready.update(analyses={"done": 0, "total": len(registered()), "run": run},
                     heartbeat_at=timezone.now())
    return True


def _show(ids: list[int], progress: dict) -> None:
    """Progress on the uploads' rows, also their heartbeat: a completion that stops beating is
    started again (``ingest.uploads.requeue_stale``)."""
    Upload.objects.filter(pk__in=ids, stage=Upload.Stage.READY).update(
        analyses=progress, heartbeat_at=timezone.now())


_registered = False


def _register_builtin() -> None:
    """Register the project's own analyses, in the order they run (imported late: they read
    the whole store, which imports the ingest that calls ``complete_incident``)."""
    global _registered
    if _registered:
        return
    _registered = True
    from ..ingest.bulk import index_partition
    from ..reads.queries import build_column_index, warm_overview
    from . import insights, pods_views

    after_ready(COLUMN_INDEX, alongside=True)(build_column_index)
    after_ready("overview", alongside=True)(lambda incident_id: warm_overview(
        incident_id, cache_figures=cache_figures()))
    # after the column index, which the detections wait for
    after_ready("partition indexes", alongside=True)(index_partition)
    after_ready("insights")(insights.refresh_after_ingest)
    after_ready("pod facts")(lambda incident_id: cache_figures() and pods_views.warm(incident_id))
