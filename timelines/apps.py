from django.apps import AppConfig
from django.db import transaction
from django.db.models.signals import pre_delete


class TimelinesConfig(AppConfig):
    name = "timelines"

    def ready(self) -> None:
        from incidents.models import Incident

        from .ingest import delete_incident_events, drop_incident_partition

        def delete_evidence(sender, instance, **kwargs) -> None:
            # The event table has no cascading foreign key (ingest speed): delete in bulk here,
            # a bulk-loaded incident's events by dropping their partition.
            drop_incident_partition(instance.pk)
            delete_incident_events(instance)
            pk = instance.pk

            def discard_column_index() -> None:
                from . import columns  # numpy only where it is used (see timelines.queries)

                columns.discard(pk)

            transaction.on_commit(discard_column_index)

        pre_delete.connect(delete_evidence, sender=Incident, weak=False,
                           dispatch_uid="timelines.delete_evidence")
