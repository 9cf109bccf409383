from django.apps import AppConfig
from django.db.models.signals import pre_delete


class DetectionsConfig(AppConfig):
    """Falco rules over incidents: added rules files and which events each rule matched. An app
    of its own (label ``detections``) so that its tables have their own migrations."""

    name = "timelines.detections"
    label = "detections"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from incidents.models import Incident

        from .models import DetectionEvent

        def forget_matches(sender, instance, **kwargs) -> None:
            # no foreign key (written in bulk, like the events they point at): removed with
            # the incident, by the incident index, in the deleting transaction
            DetectionEvent.objects.filter(incident_id=instance.pk)._raw_delete(
                DetectionEvent.objects.db)

        pre_delete.connect(forget_matches, sender=Incident, weak=False,
                           dispatch_uid="detections.forget_matches")
