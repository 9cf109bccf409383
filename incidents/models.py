"""The case file: teams, incidents, uploads, API tokens, and what people add to the evidence
(annotations, root-cause sequences, share links; see ``notes`` and ``sharing``)."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings
from django.db import connection, models, transaction
from django.urls import get_script_prefix, reverse
from django.utils import timezone


class Team(models.Model):
    name = models.CharField(max_length=100, unique=True)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    class Role(models.TextChoices):
        VIEWER = "viewer"
        EDITOR = "editor"  # may upload, annotate and share
        ADMIN = "admin"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.EDITOR)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="one_membership")]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class Incident(models.Model):
    title = models.CharField(max_length=300)
    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.PROTECT,
                             related_name="incidents")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    # A caller's own name for the incident (``incident_key``, e.g. the CI job URL): uploads with
    # the same key in the same team add to the same incident.
    key = models.CharField(max_length=500, blank=True)


    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["team", "key"], condition=~models.Q(key=""),
                                    name="one_incident_per_key"),
        ]

    def __str__(self) -> str:
        return self.title

    def get_absolute_url(self) -> str:
        return reverse("incidents:detail", args=[self.pk])

    # The incident page's path as ``incidents:detail`` makes it (a test compares them), for a
    # command that serves no page: reversing a name imports every view of the URLconf first,
    # 0.7 s of ``manage.py ingest`` before it could print its answer.
    PAGE = "incidents/{}/"

    def page_path(self) -> str:
        return get_script_prefix() + self.PAGE.format(self.pk)


class IncidentGone(Exception):
    """The incident was deleted: nothing more of it is written (its evidence is being purged).
    The API answers 404, as for any incident one cannot see (``access.exception_handler``)."""


def hold_incident(incident_id: int) -> None:
    """Inside a writing transaction: raise ``IncidentGone`` unless the incident still exists, and
    keep it from being deleted until the transaction ends. Every write of something of an
    incident (its events, uploads, annotations, sequences, grants, share links) calls it first.

    On PostgreSQL with ``FOR KEY SHARE``, the row lock a foreign key check takes: the deletion
    (``timelines.ingest.purge.delete_incident`` locks the row ``FOR UPDATE`` first) waits for a
    write in progress, and a write that starts after it finds no row, instead of failing its
    foreign key check at commit (a 500, and an uploaded file left on disk). On SQLite every
    writing transaction is IMMEDIATE, so writers run one at a time anyway. Either way nothing of
    an incident is committed after its deletion, so the purge that follows sees all of it. One
    indexed lookup.
    """
    lock = " FOR KEY SHARE" if connection.vendor == "postgresql" else ""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT 1 FROM {Incident._meta.db_table} WHERE id = %s{lock}",
                       [incident_id])
        if cursor.fetchone() is None:
            raise IncidentGone(f"incident {incident_id} was deleted")


@contextmanager
def writing(incident_id: int) -> Iterator[None]:
    """``with writing(incident.pk):`` a transaction that holds the incident (``hold_incident``):
    what is written in it belongs to an incident that exists, or nothing is (``IncidentGone``,
    which the API and the pages answer with 404)."""
    with transaction.atomic():
        hold_incident(incident_id)
        yield


class Upload(models.Model):
    """One file given to Hindsight, and what became of it. The row is what the user watches."""

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"
        SKIPPED = "skipped"  # a file inside a bundle that holds no evidence we read

    class Stage(models.TextChoices):
        """How far the incident's answer is, beside ``status`` (README, Architecture: the first
        answer first). ``reading``: the file is being read; ``ready``: its events are stored
        and every read answers exactly, while the analyses (``timelines.analysis.registry``)
        run behind it, ``status`` still ``running``; ``complete``: nothing more to do (``status``
        is ``done`` only then, or ``failed``/``skipped``)."""
        READING = "reading"
        READY = "ready"
        COMPLETE = "complete"

    incident = models.ForeignKey(Incident, on_delete=models.CASCADE, related_name="uploads")
    # A file inside a bundle is an upload of its own, with the bundle as parent.
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE,
                               related_name="files")
    name = models.CharField(max_length=1000)  # file name, or path inside the bundle
    format = models.CharField(max_length=40, blank=True)  # parser that read it, or "bundle"
    hints = models.JSONField(default=dict, blank=True)  # ParseHints from the bundle layout
    notes = models.JSONField(default=list, blank=True)  # what the format cannot give, inferred
    # Where the file waits for a worker; emptied once ingested (the redacted events are kept,
    # not the original with its secrets).
    path = models.CharField(max_length=1000, blank=True)
    # True when ``path`` is Hindsight's own copy (browser and API uploads), deleted after ingest;
    # False for files that ``manage.py ingest`` reads in place.
    path_is_copy = models.BooleanField(default=True)
    uploaded_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                    on_delete=models.SET_NULL, related_name="+")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    stage = models.CharField(max_length=10, choices=Stage.choices, default=Stage.READING)
    # The analyses behind the first answer while ``stage`` is ready: {"done": k, "total": n,
    # "running": name}; {"done": n, "total": n} once complete.
    analyses = models.JSONField(default=dict, blank=True)
    bytes_total = models.BigIntegerField(default=0)
    bytes_read = models.BigIntegerField(default=0)
    event_count = models.BigIntegerField(default=0)  # requests parsed from the file
    new_events = models.BigIntegerField(default=0)  # of which were not in the incident yet
    skipped_lines = models.BigIntegerField(default=0)
    redacted = models.BigIntegerField(default=0)
    errors = models.JSONField(default=list, blank=True)  # first "file:line: reason" entries
    message = models.TextField(blank=True)  # why it failed
    attempts = models.PositiveIntegerField(default=0)
    claimed_by = models.CharField(max_length=100, blank=True)  # the task (or process) ingesting it
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # The ``Idempotency-Key`` header of the request that made it: a retried request with the
    # same key from the same user answers with this upload instead of making another.
    idempotency_key = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["status", "heartbeat_at"]),
                   models.Index(fields=["parent", "status"])]
        constraints = [
            models.UniqueConstraint(fields=["uploaded_by", "idempotency_key"],
                                    condition=~models.Q(idempotency_key=""),
                                    name="one_upload_per_idempotency_key"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def progress(self) -> float:
        if self.status == self.Status.DONE:
            return 1.0
        if not self.bytes_total:
            return 0.0
        return min(1.0, self.bytes_read / self.bytes_total)

    @property
    def finished(self) -> bool:
        """Whether reading the file is over: its events are stored (``stage`` ready or
        complete) or it failed or held nothing we read."""
        return (self.status in (self.Status.DONE, self.Status.FAILED, self.Status.SKIPPED)
                or self.stage != self.Stage.READING)

    @property
    def complete(self) -> bool:
        """Whether nothing more will happen to it: read and analysed, failed or skipped."""
        return self.status in (self.Status.DONE, self.Status.FAILED, self.Status.SKIPPED)


def hash_token(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class ApiToken(models.Model):
    """A bearer credential for scripts and CI. Only its SHA-256 is stored; the key is shown once."""

    class Scope(models.TextChoices):
        FULL = "full"
        UPLOAD = "upload"  # may create uploads and read their status, nothing else

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=12)  # shown in lists to tell tokens apart
    key_hash = models.CharField(max_length=64, unique=True)
    scope = models.CharField(max_length=10, choices=Scope.choices, default=Scope.FULL)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.scope}) of {self.user}"

    @classmethod
    def issue(cls, user, *, name: str = "", scope: str = Scope.FULL,
              expires_at=None) -> tuple[ApiToken, str]:
        """Create a token; returns the row and the key, which is not stored anywhere."""
        key = "hs_" + secrets.token_urlsafe(32)
        token = cls.objects.create(user=user, name=name, prefix=key[:10], key_hash=hash_token(key),
                                   scope=scope, expires_at=expires_at)
        return token, key

    @property
    def expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()


from .notes import Annotation, Sequence, SequenceStep  # noqa: E402, F401 - models of this app
from .sharing import IncidentGrant, ShareLink  # noqa: E402, F401
