"""Every write of something of an incident, when the incident is deleted between the request's
look-up and its write: 404, and nothing of it left behind (no row, no file waiting on disk).

The deletion is made to land in that gap by deleting the incident as soon as the request has
read it (or, for a step, its sequence): the request then writes for an incident that is gone,
which is what a DELETE racing it does. Before every write held the incident's row
(``incidents.models.writing``), such a write failed its foreign key check at commit: a 500, and
an uploaded file left in the upload directory.
"""

from __future__ import annotations

import json
import threading

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.db.models.signals import post_init
from django.test import Client
from django.utils import timezone

from incidents.models import Incident, Membership, Upload
from incidents.notes import Annotation, Sequence, SequenceStep
from incidents.sharing import IncidentGrant, ShareLink
from timelines.ingest import delete_incident

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def admin(team, other_team):
    """Admin of ``team`` and editor of ``other_team``: may write everything of the incident."""
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user("lead", password="pw-lead")
    Membership.objects.create(team=team, user=user, role=Membership.Role.ADMIN)
    Membership.objects.create(team=other_team, user=user, role=Membership.Role.EDITOR)
    return user


@pytest.fixture
def delete_once_read():
    """``delete_once_read(model, pk, incident_id)``: the first time the request loads the row
    ``pk`` of ``model``, the incident is deleted (once), by another connection in a transaction
    of its own, as a DELETE request racing this one does."""
    receivers = []

    def arm(model, pk, incident_id):
        def receiver(sender, instance, **kwargs):
            if instance.pk != pk:
                return
            post_init.disconnect(receiver, sender=model)

            def delete():
                try:
                    assert delete_incident(Incident(pk=incident_id))
                finally:
                    connection.close()

            other = threading.Thread(target=delete)
            other.start()
            other.join()

        post_init.connect(receiver, sender=model, weak=False)
        receivers.append((receiver, model))

    yield arm
    for receiver, model in receivers:
        post_init.disconnect(receiver, sender=model)


def _sequence(incident, admin):
    return Sequence.objects.create(incident=incident, author=admin, title="how")


WRITES = {
    "upload through the API": lambda c, i, a: c.post("/api/v1/uploads/", {
        "incident_id": i.pk, "file": SimpleUploadedFile("audit.log", b"{}\n")}),
    "upload through the page": lambda c, i, a: c.post(f"/incidents/{i.pk}/uploads/", {
        "file": SimpleUploadedFile("audit.log", b"{}\n")}),
    "rename": lambda c, i, a: c.patch(f"/api/v1/incidents/{i.pk}/", json.dumps(
        {"title": "renamed"}), content_type="application/json"),
    "grant": lambda c, i, a: c.post(f"/api/v1/incidents/{i.pk}/grants/", json.dumps(
        {"team": "payments", "role": "viewer"}), content_type="application/json"),
    "share link": lambda c, i, a: c.post(f"/api/v1/incidents/{i.pk}/share-links/",
                                         json.dumps({"label": "x"}),
                                         content_type="application/json"),
    "annotation": lambda c, i, a: c.post(f"/api/v1/incidents/{i.pk}/annotations/", json.dumps(
        {"start": timezone.now().isoformat(), "note": "seen"}), content_type="application/json"),
    "sequence": lambda c, i, a: c.post(f"/api/v1/incidents/{i.pk}/sequences/", json.dumps(
        {"title": "how", "steps": []}), content_type="application/json"),
}


@pytest.mark.parametrize("write", sorted(WRITES))
def test_a_write_to_an_incident_deleted_meanwhile_answers_404_and_leaves_nothing(
        write, incident, admin, delete_once_read, settings):
    client = Client()
    client.force_login(admin)
    delete_once_read(Incident, incident.pk, incident.pk)

    answer = WRITES[write](client, incident, admin)

    assert answer.status_code == 404, answer.content[:300]
    assert not Incident.objects.filter(pk=incident.pk).exists()
    for model in (Upload, IncidentGrant, ShareLink, Annotation, Sequence):
        assert not model.objects.filter(incident_id=incident.pk).exists(), model.__name__
    uploads = settings.UPLOAD_DIR
    assert not uploads.exists() or not any(uploads.rglob("*.log")), "a file was left on disk"


def test_a_step_added_to_a_sequence_whose_incident_was_deleted_meanwhile_answers_404(
        incident, admin, delete_once_read):
    sequence = _sequence(incident, admin)
    client = Client()
    client.force_login(admin)
    delete_once_read(Sequence, sequence.pk, incident.pk)

    answer = client.post(f"/api/v1/sequences/{sequence.pk}/steps/", json.dumps(
        {"event": 1}), content_type="application/json")

    assert answer.status_code == 404, answer.content[:300]
    assert not SequenceStep.objects.filter(sequence_id=sequence.pk).exists()
