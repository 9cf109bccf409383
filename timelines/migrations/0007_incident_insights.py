"""An incident's findings (timelines.analysis.insights), stored once per data version and
removed with the incident."""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('incidents', '0003_notes_and_sharing'),
        ('timelines', '0006_incident_purge'),
    ]

    operations = [
        migrations.CreateModel(
            name='IncidentInsights',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('version', models.TextField()),
                ('computed_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('seconds', models.FloatField(default=0)),
                ('insights', models.JSONField(default=list)),
                ('incident', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='incidents.incident')),
            ],
        ),
    ]
