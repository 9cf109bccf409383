"""The matches keyed by (incident, event, rule), the readers' index, instead of a serial id
beside it: storing them costs half as much. A table's primary key cannot change in place, so
the matches move to a new table."""

import django.db.models.deletion
from django.db import migrations, models


def move_matches(apps, schema_editor):
    old = apps.get_model("detections", "DetectionEvent")._meta.db_table
    new = apps.get_model("detections", "DetectionMatch")._meta.db_table
    schema_editor.execute(f"INSERT INTO {new} (incident_id, event_id, rule)"
                          f" SELECT DISTINCT incident_id, event_id, rule FROM {old}")


def move_back(apps, schema_editor):
    old = apps.get_model("detections", "DetectionEvent")._meta.db_table
    new = apps.get_model("detections", "DetectionMatch")._meta.db_table
    schema_editor.execute(f"INSERT INTO {old} (incident_id, event_id, rule)"
                          f" SELECT incident_id, event_id, rule FROM {new}")


class Migration(migrations.Migration):

    dependencies = [
        ('detections', '0002_detection_event_id'),
        ('incidents', '0005_upload_stage'),
    ]

    operations = [
        migrations.CreateModel(
            name='DetectionMatch',
            fields=[
                ('pk', models.CompositePrimaryKey('incident', 'event_id', 'rule', blank=True, editable=False, primary_key=True, serialize=False)),
                ('event_id', models.BigIntegerField()),
                ('rule', models.TextField()),
                ('incident', models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='incidents.incident')),
            ],
        ),
        migrations.RunPython(move_matches, move_back),
        migrations.DeleteModel(
            name='DetectionEvent',
        ),
    ]
