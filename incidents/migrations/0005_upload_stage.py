# An upload's stage beside its status (reading, ready, complete); uploads that ended before
# this migration are complete.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('incidents', '0004_upload_event_count'),
    ]

    operations = [
        migrations.AddField(
            model_name='upload',
            name='analyses',
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name='upload',
            name='stage',
            field=models.CharField(choices=[('reading', 'Reading'), ('ready', 'Ready'), ('complete', 'Complete')], default='reading', max_length=10),
        ),
        migrations.RunSQL(
            "UPDATE incidents_upload SET stage = 'complete' "
            "WHERE status IN ('done', 'failed', 'skipped')",
            migrations.RunSQL.noop,
        ),
    ]
