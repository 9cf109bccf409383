from django.apps import AppConfig


class DetectionsConfig(AppConfig):
    """Falco rules over incidents: added rules files and which events each rule matched. An app
    of its own (label ``detections``) so that its tables have their own migrations. The matches
    of a deleted incident are removed by its background purge (``timelines.ingest.purge``),
    with its events: they are as many, and the deletion must answer at once."""

    name = "timelines.detections"
    label = "detections"
    default_auto_field = "django.db.models.BigAutoField"
