"""The ingest pipeline: uploaded evidence into the event store. The only writer of events.

- ``pipeline``: one upload from claim to finish (parse in one thread, write in another);
- ``bundle``: a diagnose bundle unpacked into one child upload per file inside;
- ``unpacker``: unpacking a bundle safely into a work directory (limits on size, ratio and
  members; no path outside it), and what every file in it is;
- ``store``: batches of rows merged into ``timelines_event`` (COPY, staging, merge rule);
- ``bulk``: a large new incident COPYed into a table of its own, indexed once and attached as
  its partition;
- ``uploads``: making an upload's row, for a file received or one read in place;
- ``purge``: deleting an incident: the incident at once, its evidence in the background;
- ``years``: once an incident's uploads have all finished, the rows of logs whose year was guessed
  moved to the year the rest of the incident gives.
"""

from __future__ import annotations

from .bulk import drop_incident_partition, finish_load, start_load
from .pipeline import fail_upload, ingest_upload
from .purge import delete_incident, purge_incident, record_deletion
from .store import write_rows
from .uploads import create_local_upload, create_upload
from .years import settle_years

__all__ = ["create_local_upload", "create_upload", "delete_incident", "drop_incident_partition",
           "fail_upload", "finish_load",
           "purge_incident", "record_deletion", "ingest_upload", "settle_years", "start_load",
           "write_rows"]
