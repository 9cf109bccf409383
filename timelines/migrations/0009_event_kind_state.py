"""Events of kind ``state``: an object's snapshot at a bundle's capture time and the time points
its state records (creation, conditions, container lives)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('timelines', '0008_incident_pod_facts'),
    ]

    operations = [
        migrations.AlterField(
            model_name='event',
            name='kind',
            field=models.TextField(choices=[('audit', 'Audit'), ('event', 'Event'),
                                            ('log', 'Log'), ('trace', 'Trace'),
                                            ('state', 'State')], default='audit'),
        ),
    ]
