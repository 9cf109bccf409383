"""Posting audit logs to a stream as kube-apiserver's webhook does: ``EventList`` batches of at
most ``batch`` events, at most ``rate`` events a second, each batch sent again with exponential
back-off (and ``Retry-After`` when given) until it is acknowledged. Used by ``manage.py
replay_audit`` and the load benchmark (``bench/stream``). No Django import."""

from __future__ import annotations

import gzip
import http.client
import random
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import orjson

# Answers that sending again cannot change: the apiserver retries them anyway, which only
# repeats the error; a sender for people stops and says why.
PERMANENT = {400, 401, 403, 404, 413}


class Refused(Exception):
    """The receiver refused a batch for good (``PERMANENT``)."""


@dataclass
class Tally:
    batches: int = 0
    events: int = 0
    new: int = 0
    retries: int = 0
    acks: list[float] = field(default_factory=list)  # seconds from send to 200, per batch


def read_events(paths: Iterable[str]) -> Iterator[bytes]:
    """The events of audit logs (gzipped or not) as JSON, one each: JSON lines, or one JSON
    document (an Event, an EventList or a list of Events, pretty-printed or not)."""
    for path in paths:
        with open(path, "rb") as raw:
            magic = raw.read(2)
        opener = gzip.open if magic == b"\x1f\x8b" else open
        with opener(path, "rb") as lines:
            first = b""
            for line in lines:
                first = line.strip()
                if first:
                    break
            try:
                orjson.loads(first)
            except orjson.JSONDecodeError:
                lines.seek(0)
                yield from _items(orjson.loads(lines.read()))
                continue
            yield first
            for line in lines:
                line = line.strip()
                if line:
                    yield line


def _items(value) -> Iterator[bytes]:
    if isinstance(value, dict) and value.get("kind") == "EventList":
        value = value.get("items") or []
    for item in value if isinstance(value, list) else [value]:
        yield orjson.dumps(item)


def batches(lines: Iterable[bytes], size: int) -> Iterator[tuple[bytes, int]]:
    """(EventList body, events in it) of at most ``size`` events; a line holding an EventList
    (a webhook capture) gives its items."""
    items: list[bytes] = []
    for line in lines:
        if b'"EventList"' in line[:200]:
            value = orjson.loads(line)
            found = [orjson.dumps(item) for item in value.get("items") or []]
        else:
            found = [line]
        for item in found:
            items.append(item)
            if len(items) >= size:
                yield body_of(items), len(items)
                items = []
    if items:
        yield body_of(items), len(items)


def body_of(items: list[bytes]) -> bytes:
    return (b'{"kind":"EventList","apiVersion":"audit.k8s.io/v1","metadata":{},"items":['
            + b",".join(items) + b"]}")


class Sender:
    def __init__(self, url: str, token: str, *, timeout: float = 30.0,
                 max_backoff: float = 10.0) -> None:
        self.url = urllib.parse.urlsplit(url)
        self.token = token
        self.timeout = timeout
        self.max_backoff = max_backoff
        self.connection: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        if self.connection is None:
            kind = (http.client.HTTPSConnection if self.url.scheme == "https"
                    else http.client.HTTPConnection)
            self.connection = kind(self.url.netloc, timeout=self.timeout)
        return self.connection

    def post(self, body: bytes) -> tuple[int, bytes, dict]:
        connection = self._connect()
        path = self.url.path + (f"?{self.url.query}" if self.url.query else "")
        try:
            connection.request("POST", path, body, {
                "Authorization": f"Bearer {self.token}", "Content-Type": "application/json",
                "User-Agent": "hindsight-replay-audit"})
            answer = connection.getresponse()
            return answer.status, answer.read(), dict(answer.getheaders())
        except (OSError, http.client.HTTPException):
            self.close()
            raise

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None

    def send(self, body: bytes, tally: Tally,
             on_retry: Callable[[str], None] | None = None) -> dict:
        """Post one batch until it is acknowledged (200); returns the receiver's answer.
        Raises ``Refused`` on a permanent refusal."""
        delay = 0.1
        while True:
            started = time.monotonic()
            try:
                status, text, headers = self.post(body)
            except (OSError, http.client.HTTPException) as exc:
                status, text, headers = None, str(exc).encode(), {}
            if status == 200:
                tally.acks.append(time.monotonic() - started)
                return orjson.loads(text) if text else {}
            if status in PERMANENT:
                raise Refused(f"{status}: {text.decode(errors='replace')[:500]}")
            tally.retries += 1
            if on_retry is not None:
                on_retry(f"{status or 'no answer'}: {text.decode(errors='replace')[:200]}")
            wait = delay
            retry_after = {k.lower(): v for k, v in headers.items()}.get("retry-after")
            if retry_after and retry_after.isdigit():
                wait = max(wait, float(retry_after))
            time.sleep(wait * (0.5 + random.random()))  # noqa: S311 - jitter, not a secret
            delay = min(delay * 2, self.max_backoff)


def replay(paths: Iterable[str], url: str, token: str, *, batch: int = 400,
           rate: float | None = None, on_retry: Callable[[str], None] | None = None) -> Tally:
    """Post every event of ``paths`` to ``url``; returns what was acknowledged."""
    sender = Sender(url, token)
    tally = Tally()
    started = time.monotonic()
    try:
        for body, count in batches(read_events(paths), batch):
            if rate:
                due = started + tally.events / rate
                if due > time.monotonic():
                    time.sleep(due - time.monotonic())
            answer = sender.send(body, tally, on_retry)
            tally.batches += 1
            tally.events += count
            tally.new += int(answer.get("new", 0))
    finally:
        sender.close()
    return tally
