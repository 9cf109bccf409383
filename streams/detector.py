"""The detection rounds of a web process, in a child process of their own, below the receivers.

Without a broker, a web process evaluates the Falco rules over the batches it acknowledged
(``streams.detect``). In a thread of that process, the rounds shared its interpreter with the
receivers' threads, and a batch received during a round waited its turns for it: at 6,000
events/s over five minutes, acknowledgments p99 207 ms, against 100 ms with no detections at all
and 110 ms with the rounds in this child (the same machine).
So on PostgreSQL each web process hands its rounds to one child process (``python -m
streams.detector``), started when the first round comes, which runs them at the lowest CPU
priority (nice 19): it has an interpreter of its own and takes only the CPU the receivers leave
(bench/README.md, stream benchmark).

The protocol is one JSON line each way: the parent writes a round (slot incident →
[(received, auditID)], ``rounds.detect_batch``'s argument), the child answers with the matches
per rule, or ``{"error": …}``. The child takes its database settings from the parent (so a test
database is the same), exits when its input closes (the parent stopped or died), and logs to
the parent's standard error. A child that dies is started again for the next round; the round it
died in is run once more in a new one, and if that one dies too (a child that cannot start, say
under a server whose ``sys.executable`` is not Python), ``streams.detect`` runs the round in
its thread instead.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading

import orjson
from django.conf import settings
from django.db import connection

log = logging.getLogger(__name__)

NICE = 19  # the child's CPU priority: what the receivers and PostgreSQL leave
PYTHON = sys.executable  # the child's interpreter: this process's
DATABASE_ENV = "HINDSIGHT_DETECTOR_DATABASE"  # the parent's database settings, as JSON


class DetectorGone(RuntimeError):
    """The child stopped before answering a round."""


class Detector:
    """The parent's side: one child, started when first needed, one round at a time."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def run(self, stored: dict) -> dict[str, int]:
        """One round in the child: matches per rule. A child that dies meanwhile is started
        again and given the round once more; ``DetectorGone`` if that one dies too."""
        with self.lock:
            try:
                return self._round(stored)
            except DetectorGone:
                self.stop()
                log.warning("stream detector stopped during a round; starting it again")
            try:
                return self._round(stored)
            except DetectorGone:
                self.stop()
                raise

    def _round(self, stored: dict) -> dict[str, int]:
        process = self._started()
        try:
            process.stdin.write(orjson.dumps(stored) + b"\n")
            process.stdin.flush()
            line = process.stdout.readline()
        except (BrokenPipeError, ValueError, OSError) as exc:
            raise DetectorGone(str(exc)) from exc
        if not line:
            raise DetectorGone(f"exit status {process.poll()}")
        answer = orjson.loads(line)
        if "error" in answer:
            raise RuntimeError(f"stream detector: {answer['error']}")
        return answer["counts"]

    def _started(self) -> subprocess.Popen:
        if self.process is not None and self.process.poll() is None:
            return self.process
        database = dict(connection.settings_dict)
        database.pop("TEST", None)
        env = {**os.environ, DATABASE_ENV: orjson.dumps(database, default=str).decode(),
               "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE",
                                                        "hindsight.settings")}
        self.process = subprocess.Popen(
            [PYTHON, "-m", "streams.detector"], cwd=settings.BASE_DIR, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        return self.process

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        for stream in (process.stdin, process.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


_detector: Detector | None = None
_detector_lock = threading.Lock()


def detector() -> Detector:
    """This process's detector (one child per web process)."""
    global _detector
    with _detector_lock:
        if _detector is None:
            _detector = Detector()
        return _detector


def main() -> None:
    """The child: rounds from standard input, answers on the standard output it had (Django's
    own output, if any, goes to standard error)."""
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, NICE)
    except OSError:  # not allowed: the same priority as the parent
        pass
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hindsight.settings")
    import django
    from django.conf import settings as configured

    database = os.environ.get(DATABASE_ENV)
    if database:
        configured.DATABASES = {**configured.DATABASES, "default": orjson.loads(database)}
    django.setup()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="stream detector %(process)d: %(levelname)s %(message)s")
    from django.db import connections

    from .rounds import detect_batch

    for line in sys.stdin.buffer:
        try:
            answer = {"counts": detect_batch(orjson.loads(line))}
        except Exception as exc:  # noqa: BLE001 - answered, and the child goes on
            log.exception("detections of stream batches failed")
            answer = {"error": f"{type(exc).__name__}: {exc}"}
            connections.close_all()  # a broken connection is made again for the next
        answers.write(orjson.dumps(answer) + b"\n")
        answers.flush()


if __name__ == "__main__":
    main()
