"""``manage.py build_columns [INCIDENT_ID ...]``: build the column index of large incidents.

Ingest builds an incident's index (``timelines.store.columns``) when its uploads finish. An index is
read only in the format of the running code, so after an upgrade that changes the format the
older ones are ignored (the database counts instead, slower) until this rebuilds them, or
until the incident's next upload does. Incidents with an upload running, or too small to need
an index, are left as they are.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand

from incidents.access import stream_slot_ids
from incidents.models import Incident
from timelines.reads.queries import warm_overview
from timelines.store import aggregate, columns


class Command(BaseCommand):
    help = "Build (or rebuild) the column index of every large incident, or of those given."

    def add_arguments(self, parser) -> None:
        parser.add_argument("incident_ids", nargs="*", type=int,
                            help="incidents to index (default: all)")

    def handle(self, *args, incident_ids: list[int], **options) -> None:
        # never a stream's slots: written as batches arrive, emptied by the hour
        incidents = Incident.objects.exclude(pk__in=stream_slot_ids()).order_by("pk")
        if incident_ids:
            incidents = incidents.filter(pk__in=incident_ids)
        for incident_id in incidents.values_list("pk", flat=True):
            warm_overview(incident_id, cache_figures=False)
            version = aggregate.data_version(incident_id)
            built = version is not None and columns.load(incident_id, version) is not None
            self.stdout.write(f"incident {incident_id}: {'indexed' if built else 'no index'}")
