from django.apps import AppConfig
from django.db.models.signals import pre_delete


class TimelinesConfig(AppConfig):
    name = "timelines"

    def ready(self) -> None:
        from incidents.models import Incident

        from .ingest import record_deletion

        def delete_evidence(sender, instance, **kwargs) -> None:
            # The event table has no cascading foreign key (ingest speed): whatever deletes an
            # incident, its evidence is purged in the background (timelines.ingest.purge).
            record_deletion(instance)

        pre_delete.connect(delete_evidence, sender=Incident, weak=False,
                           dispatch_uid="timelines.delete_evidence")
