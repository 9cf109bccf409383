"""``POST /api/v1/streams/{id}/audit/``: what kube-apiserver's webhook audit backend posts.

The body is an ``audit.k8s.io/v1`` (or ``v1beta1``) ``EventList`` (batch mode, and blocking mode,
which posts a list of one) or a single ``Event``. The answer is 200 only once every event of it
is stored durably (``streams.store.write_batch``): the apiserver drops a batch it got a 2xx for
and retries any other answer with back-off, so nothing acknowledged is lost and nothing retried
is stored twice (the store's identity ``(received, auditID)`` and its merge of stages).

- a wrong or missing token: 401; the token of another stream (or no such stream): 404;
- over ``HINDSIGHT_STREAM_MAX_BATCH_BYTES``: 413, before the body is read;
- not JSON, not an EventList or Event, or any event unusable: 400 naming the problem (the item's
  index in ``items``), and nothing of the batch is stored;
- more batches at once in this process than ``HINDSIGHT_STREAM_CONCURRENCY``: 429 with
  ``Retry-After`` (the apiserver backs off and sends it again);
- the database unreachable: 503 with ``Retry-After``.

Redaction is the upload's (``timelines.parsers.Redactor``), before anything is stored.
"""

from __future__ import annotations

import logging
import threading
import zlib

import orjson
from django.conf import settings
from django.http import JsonResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.decorators import (
    api_view,
    authentication_classes,
    parser_classes,
    permission_classes,
    throttle_classes,
)
from rest_framework.permissions import AllowAny

from timelines.ingest.pipeline import TRANSIENT_ERRORS
from timelines.parsers import Redactor, Report
from timelines.parsers.audit import NativeEvents

from .detect import enqueue as enqueue_detections
from .detect import receiving
from .models import Stream, hash_token
from .store import write_batch

log = logging.getLogger(__name__)

MAX_ERRORS = 20

_slots_lock = threading.Lock()
_slots: threading.BoundedSemaphore | None = None


def _semaphore() -> threading.BoundedSemaphore:
    global _slots
    with _slots_lock:
        if _slots is None or getattr(_slots, "size", None) != settings.STREAM_CONCURRENCY:
            _slots = threading.BoundedSemaphore(settings.STREAM_CONCURRENCY)
            _slots.size = settings.STREAM_CONCURRENCY  # type: ignore[attr-defined]
        return _slots


def _error(status: int, message: str, **headers) -> JsonResponse:
    response = JsonResponse({"detail": message}, status=status)
    for name, value in headers.items():
        response[name.replace("_", "-")] = value
    return response


def _bearer(request) -> str | None:
    header = request.headers.get("Authorization", "").split()
    if len(header) != 2 or header[0].lower() not in ("bearer", "token"):
        return None
    return header[1]


@extend_schema(
    request={"application/json": OpenApiTypes.OBJECT},
    responses={200: OpenApiResponse(OpenApiTypes.OBJECT,
                                    '{"events", "new", "too_old"}: stored durably'),
               400: OpenApiResponse(description="malformed: nothing of the batch stored"),
               401: OpenApiResponse(description="a wrong or missing stream token"),
               404: OpenApiResponse(description="another stream's token"),
               413: OpenApiResponse(description="over HINDSIGHT_STREAM_MAX_BATCH_BYTES"),
               429: OpenApiResponse(description="busy: send it again after Retry-After"),
               503: OpenApiResponse(description="database unavailable: send it again")},
    auth=[], description="kube-apiserver's audit webhook: an audit.k8s.io/v1 (or v1beta1) "
                         "EventList, or one Event, with the stream's token as "
                         "`Authorization: Bearer <token>`.")
@api_view(["POST"])
@authentication_classes([])  # the stream's own token, below: no user, no session
@permission_classes([AllowAny])
@throttle_classes([])  # overload is answered by the concurrency limit (429)
@parser_classes([])  # the body is read as it came
def receive_audit(drf_request, stream_pk: int):
    request = drf_request._request
    key = _bearer(request)
    if key is None:
        return _error(401, "Authorization: Bearer <stream token> is required.",
                      WWW_Authenticate="Bearer")
    stream = Stream.objects.filter(token_hash=hash_token(key)).first()
    if stream is None:
        return _error(401, "Invalid stream token.", WWW_Authenticate="Bearer")
    if stream.pk != stream_pk:
        return _error(404, "Not found.")  # a token posts into its own stream only
    limit = settings.STREAM_MAX_BATCH_BYTES
    try:
        length = int(request.headers.get("Content-Length") or 0)
    except ValueError:
        length = 0
    if length > limit:
        return _error(413, f"a batch of {length} bytes is over the limit of {limit} bytes"
                           " (HINDSIGHT_STREAM_MAX_BATCH_BYTES)")
    body = request.read(limit + 1)
    if len(body) > limit:
        return _error(413, f"a batch over the limit of {limit} bytes"
                           " (HINDSIGHT_STREAM_MAX_BATCH_BYTES)")
    if request.headers.get("Content-Encoding", "").lower() == "gzip":
        try:
            body = _gunzip(body, limit + 1)  # never more than the limit in memory (bombs)
        except (OSError, EOFError, zlib.error) as exc:
            return _error(400, f"the gzip body cannot be read: {exc}")
        if len(body) > limit:
            return _error(413, f"a batch over the limit of {limit} bytes once unzipped"
                               " (HINDSIGHT_STREAM_MAX_BATCH_BYTES)")
    with receiving():  # this process's detection round gives way meanwhile
        rows, problem = parse_batch(body, f"stream {stream.name}")
        if problem:
            return _error(400, problem)
        semaphore = _semaphore()
        if not semaphore.acquire(timeout=settings.STREAM_QUEUE_SECONDS):
            return _error(429, "too many batches at once; send it again later",
                          Retry_After=str(settings.STREAM_RETRY_AFTER))
        try:
            written = write_batch(stream, rows)
        except TRANSIENT_ERRORS as exc:
            log.warning("stream %s: batch not stored, database unavailable: %s", stream.pk,
                        exc)
            return _error(503, "the database is unavailable; send it again later",
                          Retry_After=str(settings.STREAM_RETRY_AFTER))
        finally:
            semaphore.release()
    enqueue_detections(written.stored)  # stored and committed: off the answer's path
    return JsonResponse({"events": written.events, "new": written.new,
                         "too_old": written.too_old})


def _gunzip(data: bytes, at_most: int) -> bytes:
    """A gzip body, decompressed up to ``at_most`` bytes (a longer one is cut there)."""
    stream = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = stream.decompress(data, at_most)
    if len(out) < at_most and not stream.eof:
        raise EOFError("the gzip stream ends early")
    return out


def parse_batch(body: bytes, source: str) -> tuple[list, str | None]:
    """The rows of a webhook body, or the reason it is refused (then no row)."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return [], f"the body is not JSON: {str(exc).splitlines()[0][:200]}"
    if not isinstance(value, dict):
        return [], "the body is not an audit.k8s.io EventList or Event (not a JSON object)"
    kind, api_version = value.get("kind"), value.get("apiVersion")
    if api_version not in ("audit.k8s.io/v1", "audit.k8s.io/v1beta1"):
        return [], (f"apiVersion {api_version!r}: expected audit.k8s.io/v1 or"
                    " audit.k8s.io/v1beta1")
    if kind == "EventList":
        items = value.get("items")
        if items is None:
            items = []
        if not isinstance(items, list):
            return [], "EventList.items is not a list"
    elif kind == "Event":
        items = [value]
    else:
        return [], f"kind {kind!r}: expected EventList or Event"
    report = Report(source)
    events = NativeEvents(report, Redactor(settings.REDACT_EXTRA_PATHS, enabled=settings.REDACT))
    rows = []
    for index, item in enumerate(items):
        # The item's JSON text lets the redactor decide from the bytes whether anything could
        # need replacing, as for a file's lines, instead of walking every string of every event
        # (a quarter of a batch's time); the same text is what is stored when nothing does.
        rows.extend(events.feed(item, index, orjson.dumps(item)))
    rows.extend(events.flush())
    if report.skipped:
        # Report.skip wrote "source:index: reason"
        problems = [e.split(":", 1)[1] if e.startswith(source + ":") else e
                    for e in report.errors[:MAX_ERRORS]]
        where = "; ".join(f"items[{p.split(':', 1)[0]}]:{p.split(':', 1)[1]}" for p in problems)
        return [], f"{report.skipped} unusable event(s), nothing of the batch stored: {where}"
    return rows, None
