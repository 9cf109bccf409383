"""The matches of given events, by incident: a stream's detection round replaces those of its
requests, and the figure stars its drawn events."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('detections', '0001_initial'),
        ('incidents', '0005_upload_stage'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='detectionevent',
            index=models.Index(fields=['incident', 'event_id'], name='detection_event_id'),
        ),
    ]
