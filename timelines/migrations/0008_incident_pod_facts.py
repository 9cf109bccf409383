"""What an incident's evidence says about its pods (timelines.analysis.pods_views), stored once
per data version and removed with the incident."""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('incidents', '0003_notes_and_sharing'),
        ('timelines', '0007_incident_insights'),
    ]

    operations = [
        migrations.CreateModel(
            name='IncidentPodFacts',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True,
                                           serialize=False, verbose_name='ID')),
                ('version', models.TextField()),
                ('computed_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('seconds', models.FloatField(default=0)),
                ('facts', models.BinaryField()),
                ('unfiltered', models.BinaryField(null=True)),
                ('incident', models.OneToOneField(
                    on_delete=django.db.models.deletion.CASCADE, related_name='+',
                    to='incidents.incident')),
            ],
        ),
    ]
