"""Deleting an incident answers at once and its evidence is purged in the background: body chunks
lose their database foreign keys (like the events, which never had them), so that the incident's
row can go before its chunks do, and ``IncidentPurge`` remembers what is still to be removed."""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('incidents', '0003_notes_and_sharing'),
        ('timelines', '0005_bodychunk_storage_external'),
    ]

    operations = [
        migrations.CreateModel(
            name='IncidentPurge',
            fields=[
                ('incident_id', models.BigIntegerField(primary_key=True, serialize=False)),
                ('deleted_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('queued_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('files', models.JSONField(blank=True, default=list)),
                ('uploads', models.JSONField(blank=True, default=list)),
            ],
        ),
        migrations.AlterField(
            model_name='bodychunk',
            name='incident',
            field=models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='incidents.incident'),
        ),
        migrations.AlterField(
            model_name='bodychunk',
            name='upload',
            field=models.ForeignKey(db_constraint=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='incidents.upload'),
        ),
    ]
