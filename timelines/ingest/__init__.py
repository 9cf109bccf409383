"""The ingest pipeline: uploaded evidence into the event store. The only writer of events.

- ``pipeline``: one upload from claim to finish (parse in one thread, write in another);
- ``bundle``: a diagnose bundle unpacked into one child upload per file inside;
- ``store``: batches of rows merged into ``timelines_event`` (COPY, staging, merge rule).
"""

from __future__ import annotations

from .pipeline import create_local_upload, fail_upload, ingest_upload
from .store import delete_incident_events, write_rows

__all__ = ["create_local_upload", "delete_incident_events", "fail_upload", "ingest_upload",
           "write_rows"]
