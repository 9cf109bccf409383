"""``manage.py ingest PATH [PATH ...] --incident TITLE [--json]``: the whole pipeline in-process.

A contract for scripts and CI: with ``--json`` the last line on stdout is one JSON object
``{"incident": {"id", "url"}, "uploads": [{"name", "format", "status", "events",
"skipped_lines", "redacted", "errors", "stage"}], "bundles": [...], "ready_s", "complete_s"}``
with one entry per file (a bundle's files each have their own, ``name`` being the path inside
the bundle; files holding nothing we read are ``skipped`` with the reason in ``message``); the
exit code is 0 only if no file failed.

It returns once the first answer is ready (``ready_s``: seconds from the start until every
file's events are stored and readable; their uploads ``running`` at stage ``ready``) and leaves
the analyses (``timelines.analysis.registry``) to a detached process of its own, which marks
the uploads ``done`` when they are complete (``complete_s`` is then null).
``--wait-complete`` waits for them too: ``complete_s`` is the seconds from the start until
then, and the uploads say ``done``.
"""

from __future__ import annotations

import contextlib
import gc
import json
import multiprocessing
import os
import stat
import sys
import time
from collections import Counter
from functools import partial
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, connection, connections
from django.db.models import F, Q, Sum

from incidents.access import slot_message, slot_owner
from incidents.models import Incident, IncidentGone, Team, Upload
from timelines.analysis.registry import complete_incident, prepare_reads
from timelines.ingest import bulk, create_local_upload, fail_upload, ingest_upload
from timelines.ingest.bundle import finish_bundle
from timelines.ingest.unpacker import is_bundle
from timelines.reads.queries import shared_cache


def _start_child() -> None:
    # The forked copy of the parent's connection must not be used: each process opens its own,
    # once, and keeps it for all the files it ingests (a bundle holds thousands of small ones).
    connections.close_all()


_committing_without_waiting = None  # the connection of this process told so


def _commit_without_waiting() -> None:
    """Each of a process's files commits a few times (the claim, its rows, its outcome): none
    waits for its WAL flush (3-4 ms here). The commit that makes the incident's events visible
    does (the parent's: ``bulk.finish_load``, or the completion's), and flushes all before it.
    A crash loses at most the last moments, which leave their uploads to be ingested again
    (idempotent), never rows without their upload's record (the WAL is in order). Told once
    per connection, here rather than when the process starts: a database that cannot be
    reached fails the file, as any query would, instead of the pool's start."""
    global _committing_without_waiting
    connection.ensure_connection()
    if _committing_without_waiting is not connection.connection:
        with connection.cursor() as cursor:
            cursor.execute("SET synchronous_commit = off")
        _committing_without_waiting = connection.connection


def _ingest_in_child(upload_id: int, table: str | None = None) -> int:
    _commit_without_waiting()
    ingest_upload(upload_id, table=table, complete=False, reread=False)
    return upload_id


def _check_path(path: Path) -> None:
    """Raise CommandError, naming ``path``, unless it is a file or directory this process can
    read."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise CommandError(f"{path}: no such file or directory") from None
    except OSError as exc:
        raise CommandError(f"{path}: cannot be read: {exc.strerror}") from None
    try:
        if stat.S_ISDIR(mode):
            with os.scandir(path):
                pass
        elif stat.S_ISREG(mode):
            with open(path, "rb") as handle:
                handle.read(1)
        else:
            raise CommandError(f"{path}: not a file or directory (a device, pipe or socket)")
    except OSError as exc:
        raise CommandError(f"{path}: cannot be read: {exc.strerror}") from None


class Command(BaseCommand):
    # The system checks cost a quarter of a second of every run, for a command that scripts and
    # CI jobs call again and again; migrate and the web server run them.
    requires_system_checks: list[str] = []
    help = ("Ingest evidence (audit logs, Events, component logs, diagnose bundles) into an "
            "incident, in this process, and wait for the result.")

    def add_arguments(self, parser) -> None:
        parser.add_argument("paths", nargs="+",
                            help="evidence files (audit logs, Events, component logs; gzipped or "
                                 "not), diagnose bundles (.tar, .tar.gz, .tar.xz, .zip) or "
                                 "directories (read as bundles)")
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("--incident", help="title of a new incident")
        target.add_argument("--incident-id", type=int, help="add to this existing incident")
        parser.add_argument("--team", help="team that owns a new incident (default: none, "
                                           "visible to superusers only)")
        parser.add_argument("--json", action="store_true",
                            help="print a JSON summary as the last line on stdout")
        parser.add_argument("--jobs", type=int, default=None,
                            help="files ingested at once, each in a process of its own "
                                 "(default: one more than the CPUs on PostgreSQL, 1 on SQLite)")
        parser.add_argument("--wait-complete", action="store_true",
                            help="return once the analyses behind the first answer are complete "
                                 "too (default: once the first answer is ready)")

    def run_from_argv(self, argv) -> None:
        # From the command line, Django and its imports live as long as the process: out of the
        # collector's sight, they are not traversed by each full collection nor at exit (0.3 s
        # at 200,000 requests), nor copied into the forked processes when a collection would
        # touch them. (Not in call_command: the caller's process goes on.)
        gc.freeze()
        super().run_from_argv(argv)

    def handle(self, *args, **options) -> None:
        self._started = time.monotonic()
        # Every argument is checked before anything is created: a typo makes no empty incident.
        for path in map(Path, options["paths"]):
            _check_path(path)
        if options["jobs"] is not None and options["jobs"] < 1:
            raise CommandError("--jobs must be at least 1")
        incident = self._incident(options)
        self._top: list[int] = []  # the uploads this run made (a bundle's files hang off them)
        try:
            self._ingest(incident, options)
        except (IncidentGone, Upload.DoesNotExist) as exc:
            if Incident.objects.filter(pk=incident.pk).exists():
                self._fail_unfinished(f"{type(exc).__name__}: {exc}")
                raise
            raise CommandError(f"incident {incident.pk} was deleted while its files were being "
                               "ingested: nothing of them is kept") from None
        except BaseException as exc:
            self._fail_unfinished("interrupted" if isinstance(exc, KeyboardInterrupt)
                                  else f"{type(exc).__name__}: {exc}")
            raise

    def _fail_unfinished(self, reason: str) -> None:
        """Whatever stopped the run, none of its uploads stays pending or running: no worker or
        sweep would ever take up a file of a command that has ended. (If the database itself is
        what failed, there is nothing to mark and the error is what the user sees.)"""
        with contextlib.suppress(DatabaseError):
            unfinished = Upload.objects.filter(
                Q(pk__in=self._top) | Q(parent_id__in=self._top),
                Q(status=Upload.Status.PENDING)
                | Q(status=Upload.Status.RUNNING, stage=Upload.Stage.READING),
            ).order_by(F("parent_id").desc(nulls_last=True))  # a bundle's files first
            for upload_id in list(unfinished.values_list("pk", flat=True)):
                fail_upload(upload_id, f"manage.py ingest stopped before this file was done: "
                                       f"{reason}")

    def _ingest(self, incident: Incident, options) -> None:
        uploads = []
        for path in map(Path, options["paths"]):  # files and directories (read as bundles)
            uploads.append(create_local_upload(incident, path))
            self._top.append(uploads[-1].pk)
        # Bundles are unpacked first; then every file, loose or from a bundle, is ingested.
        files: list[int] = []
        for upload in uploads:
            if upload.status != Upload.Status.PENDING:
                continue
            if is_bundle(Path(upload.path)):
                self.stderr.write(f"{upload.name}: unpacking …", style_func=str)
                ingest_upload(upload.pk, spawn=files.extend, complete=False)
            else:
                files.append(upload.pk)
        jobs = min(len(files), self._jobs(options["jobs"]))
        # A large new incident is loaded into a table of its own and indexed once at the end
        # (timelines.ingest.bulk); its files are reported then, with their final counts.
        table = bulk.start_load(incident.pk) if self._bulk(options, files) else None
        try:
            if jobs > 1:
                self._ingest_in_processes(files, jobs, options["json"], table)
            else:
                for upload_id in files:
                    ingest_upload(upload_id, on_progress=self._progress(upload_id), table=table,
                                  complete=False, reread=False)
                    if self.stderr.isatty():
                        self.stderr.write("\r\033[K", ending="", style_func=str)
                    if table is None and upload_id in self._top:  # not a bundle's file
                        self._report(Upload.objects.get(pk=upload_id), options["json"])
        finally:
            # Also after an error or an interrupt: what was loaded so far is kept.
            if table is not None:
                self._finish_load(incident.pk, table, files)
        if table is not None:  # the loose files (a bundle's summary speaks for its own)
            for upload in Upload.objects.filter(pk__in=files, parent=None).order_by("pk"):
                self._report(upload, options["json"])
        # Files were ingested in parallel: a log whose lines have no year may have been read
        # before the evidence that gives it one (timelines.ingest.years; logged, and in --json
        # the file's notes).
        prepare_reads(incident.pk)
        ready_s = time.monotonic() - self._started
        complete_s = None
        # The analyses (the column index, on disk, which the web processes share; the overview
        # figures only when they share this process's cache too). A caller's transaction is
        # seen by no other process, and SQLite has one writer at a time (the web process's
        # reads would wait for it): then here too.
        behind = not (options["wait_complete"] or connection.in_atomic_block
                      or connection.vendor != "postgresql")
        if not behind:
            complete_incident(incident.pk, cache=shared_cache(), again=True)
            complete_s = time.monotonic() - self._started
        top = list(Upload.objects.filter(pk__in=[u.pk for u in uploads]).order_by("pk"))
        # One entry per file: a bundle's files stand for the bundle.
        entries = []
        for upload in top:
            inside = list(upload.files.order_by("pk"))
            entries.extend(inside or [upload])
            if upload.pk not in files and not inside:
                self._report(upload, options["json"])
            if inside:
                self._report_bundle(upload, inside, options["json"])
        url = settings.SITE_URL + incident.page_path()
        if options["json"]:
            summary = {
                "incident": {"id": incident.pk, "title": incident.title, "url": url},
                "uploads": [
                    {"id": u.pk, "name": u.name, "format": u.format, "status": u.status,
                     "events": u.event_count, "new_events": u.new_events,
                     "skipped_lines": u.skipped_lines, "redacted": u.redacted,
                     "errors": u.errors, "message": u.message, "notes": u.notes,
                     "stage": u.stage}
                    for u in entries
                ],
                "bundles": [
                    {"id": u.pk, "name": u.name, "status": u.status, "events": u.event_count,
                     "files": u.files.count(), "message": u.message}
                    for u in top if u.format == "bundle"
                ],
                "ready_s": round(ready_s, 3),
                "complete_s": None if complete_s is None else round(complete_s, 3),
            }
            self.stdout.write(json.dumps(summary))
        else:
            self.stdout.write(f"Incident {incident.pk}: {url}")
        if behind:  # after the report: it says what the first answer was
            self._complete_behind(incident.pk)
        failed = [u for u in entries if u.status == Upload.Status.FAILED]
        if failed:
            sys.stdout.flush()
            raise CommandError(f"{len(failed)} of {len(entries)} files failed: "
                               + ", ".join(u.name for u in failed[:10])
                               + (" …" if len(failed) > 10 else ""))

    @staticmethod
    def _complete_behind(incident_id: int) -> None:
        """The incident's analyses in a detached process (its own session, no terminal, no
        pipe of ours held open), so that this command returns now. If it dies, the uploads
        stay ``ready`` and the sweep (``tasks.requeue_stale_uploads``) starts them again."""
        sys.stdout.flush()
        sys.stderr.flush()
        connections.close_all()  # the child opens its own
        if os.fork():
            return
        code = 0
        try:
            os.setsid()
            if os.fork():  # a grandchild, which init adopts: nobody has to wait for it
                os._exit(0)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            complete_incident(incident_id, cache=shared_cache(), again=True)
        except BaseException:
            code = 1
        finally:
            with contextlib.suppress(BaseException):
                connections.close_all()
            os._exit(code)

    def _report_bundle(self, bundle: Upload, files: list[Upload], as_json: bool) -> None:
        by_status = Counter(f.status for f in files)
        by_format = Counter(f.format for f in files if f.status == Upload.Status.DONE)
        line = (f"{bundle.name}: {bundle.status}, {len(files)} files ("
                + ", ".join(f"{n} {s}" for s, n in sorted(by_status.items())) + "); "
                + ", ".join(f"{n} {fmt}" for fmt, n in by_format.most_common())
                + f"; {bundle.event_count} events, {bundle.redacted} values redacted")
        if bundle.message:
            line += f" — {bundle.message}"
        for failed in [f for f in files if f.status == Upload.Status.FAILED][:10]:
            line += f"\n  {failed.message or failed.name}"
        (self.stderr if as_json else self.stdout).write(line)

    def _report(self, upload: Upload, as_json: bool) -> None:
        if upload.parent_id is not None:
            return  # a bundle's file: the bundle's summary speaks for it
        line = (f"{upload.name}: {upload.status}, {upload.event_count} events "
                f"({upload.new_events} new), {upload.skipped_lines} lines skipped, "
                f"{upload.redacted} values redacted")
        if upload.message:
            line += f" — {upload.message}"
        for error in upload.errors[:5]:
            line += f"\n  {error}"
        (self.stderr if as_json else self.stdout).write(line)

    @staticmethod
    def _jobs(wanted: int | None) -> int:
        if connection.vendor != "postgresql" or connection.in_atomic_block:
            # SQLite has one writer at a time; other processes cannot see a caller's open
            # transaction.
            return 1
        if wanted is None:
            # One more than the CPUs: files are ingested whole, so with one process per CPU the
            # last file (the third apiserver's log of three, on two CPUs) would run alone while
            # a CPU idles; the PostgreSQL backends take their share of the CPUs anyway.
            return (os.cpu_count() or 1) + 1
        return wanted

    def _ingest_in_processes(self, upload_ids: list[int], jobs: int, as_json: bool,
                             table: str | None = None) -> None:
        """Files ingested by ``jobs`` forked processes, each with its own database connection:
        parsing is CPU-bound Python, so threads would share one core. ``table``: the bulk load
        they all COPY into (then the caller reports the files)."""
        connections.close_all()  # nothing of the parent's connection is handed to the children
        context = multiprocessing.get_context("fork")
        with context.Pool(jobs, initializer=_start_child) as pool:
            for upload_id in pool.imap_unordered(partial(_ingest_in_child, table=table),
                                                 upload_ids):
                if table is None and upload_id in self._top:  # not a bundle's file
                    self._report(Upload.objects.get(pk=upload_id), as_json)

    @staticmethod
    def _bulk(options, files: list[int]) -> bool:
        """Whether to bulk load: a new incident (nothing to merge with), on PostgreSQL, outside a
        caller's transaction (the forked processes must see the load table), of enough bytes for
        the index build at the end to pay off."""
        if (connection.vendor != "postgresql" or connection.in_atomic_block
                or options["incident"] is None or not files):
            return False
        total = Upload.objects.filter(pk__in=files).aggregate(total=Sum("bytes_total"))["total"]
        return (total or 0) >= settings.BULK_LOAD_MIN_BYTES

    def _finish_load(self, incident_id: int, table: str, upload_ids: list[int]) -> None:
        def say(message: str) -> None:
            self.stderr.write(message, style_func=str)

        # the files read into the load, waiting for it (timelines.ingest.pipeline._finish)
        loaded = Upload.objects.filter(pk__in=upload_ids, status=Upload.Status.RUNNING,
                                       stage=Upload.Stage.READING, finished_at__isnull=False)
        try:
            result = bulk.finish_load(incident_id, table, on_step=say)
        except BaseException as exc:
            # Nothing of the load is visible: drop it rather than leave a table behind, and say
            # so on its files (their source is intact for another try).
            bulk.abandon_load(incident_id, table)
            loaded.update(status=Upload.Status.FAILED, stage=Upload.Stage.COMPLETE, new_events=0,
                          message=f"the bulk load could not be finished: {exc}")
            raise
        # Their events are visible now: ready, and so are the bundles whose files they are.
        loaded.update(stage=Upload.Stage.READY)
        for parent_id in set(Upload.objects.filter(pk__in=upload_ids).exclude(parent_id=None)
                             .values_list("parent_id", flat=True)):
            finish_bundle(parent_id)
        say(f"{'attached' if result.attached else 'merged'} {result.events:,} events in "
            f"{sum(result.seconds.values()):.1f} s ("
            + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in result.seconds.items())
            + ")")

    def _progress(self, upload_id: int):
        """A progress line on a terminal (stderr, so that --json output stays clean)."""
        if not self.stderr.isatty():
            return None
        name = Upload.objects.filter(pk=upload_id).values_list("name", flat=True)[0]

        def show(done: int, total: int, rows: int) -> None:
            percent = 100 * done / total if total else 0
            self.stderr.write(f"\r\033[K{name}: {percent:5.1f}%  {done / 1e6:,.1f} of "
                              f"{total / 1e6:,.1f} MB, {rows:,} events", ending="",
                              style_func=str)
            self.stderr.flush()

        return show

    def _incident(self, options) -> Incident:
        if options["incident_id"] is not None:
            incident = Incident.objects.filter(pk=options["incident_id"]).first()
            if incident is None:
                raise CommandError(f"no incident {options['incident_id']}")
            segment = slot_owner(incident.pk)
            if segment is not None:  # written by the stream's receiver only
                raise CommandError(slot_message(segment))
            return incident
        team = None
        if options["team"]:
            team = Team.objects.filter(name=options["team"]).first()
            if team is None:
                raise CommandError(f"no team {options['team']!r} (create_api_token USER "
                                   f"--team {options['team']} makes one)")
        return Incident.objects.create(title=options["incident"], team=team)
