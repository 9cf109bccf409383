# An upload's ``events`` is a count: named for what it is. The API keeps the name ``events``.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("incidents", "0003_notes_and_sharing"),
    ]

    operations = [
        migrations.RenameField(model_name="upload", old_name="events", new_name="event_count"),
    ]
