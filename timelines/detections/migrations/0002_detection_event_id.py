"""The matches indexed by event first, then rule: every reader asks for the matches of given
events (the events filter, the events page, the figure's stars, a stream's detection round)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('detections', '0001_initial'),
        ('incidents', '0005_upload_stage'),
    ]

    operations = [
        migrations.RemoveIndex(model_name='detectionevent', name='detection_event'),
        migrations.AddIndex(
            model_name='detectionevent',
            index=models.Index(fields=['incident', 'event_id', 'rule'],
                               name='detection_event_id'),
        ),
    ]
