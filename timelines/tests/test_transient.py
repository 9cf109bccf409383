"""One list of transient errors (``ingest.pipeline.TRANSIENT_ERRORS``) for the ingest and its
tasks: an error of the connection is retried by the task, whether Django raised it or psycopg
did (a COPY goes to psycopg directly); after the last retry the upload fails saying so."""

from __future__ import annotations

import psycopg
import pytest
from django.db import OperationalError

from incidents.models import Upload
from timelines import tasks
from timelines.ingest import create_local_upload
from timelines.ingest.pipeline import is_data_error

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("error", [
    OperationalError("server closed the connection unexpectedly"),
    psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
    psycopg.OperationalError("consuming input failed: server closed the connection"),
], ids=["django", "psycopg-sqlstate-57", "psycopg-no-sqlstate"])
def test_a_connection_error_is_retried_then_fails_the_upload(incident, tmp_path, monkeypatch,
                                                             error):
    path = tmp_path / "audit.log"
    path.write_text("{}\n")
    upload = create_local_upload(incident, path)
    tries = []

    def lose_the_connection(upload_id, **kwargs):
        tries.append(upload_id)
        raise error

    monkeypatch.setattr(tasks, "ingest_upload", lose_the_connection)

    result = tasks.ingest_upload_task.apply(args=[upload.pk])

    assert not is_data_error(error)
    assert isinstance(result.result, type(error))
    assert len(tries) == tasks.ingest_upload_task.max_retries + 1
    upload.refresh_from_db()
    assert upload.status == Upload.Status.FAILED
    assert f"database unavailable after {tasks.ingest_upload_task.max_retries} retries" \
        in upload.message


def test_a_refused_value_is_an_outcome_not_a_retry(incident, tmp_path, monkeypatch):
    path = tmp_path / "audit.log"
    path.write_text("{}\n")
    upload = create_local_upload(incident, path)
    tries = []

    def refuse(upload_id, **kwargs):
        tries.append(upload_id)
        raise psycopg.errors.InvalidTextRepresentation("invalid input syntax")

    monkeypatch.setattr(tasks, "ingest_upload", refuse)

    tasks.ingest_upload_task.apply(args=[upload.pk])

    assert tries == [upload.pk]
    upload.refresh_from_db()
    assert upload.status == Upload.Status.FAILED
    assert "InvalidTextRepresentation" in upload.message
