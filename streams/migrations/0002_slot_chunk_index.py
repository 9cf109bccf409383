"""Each slot table of the streams made before gets the index on its rows' body chunk that
``streams.store.create_stream`` now makes (``CHUNK_INDEX``)."""

from django.db import migrations


def add_chunk_index(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    Segment = apps.get_model("streams", "Segment")
    with schema_editor.connection.cursor() as cursor:
        for stream_id, slot in Segment.objects.values_list("stream_id", "slot"):
            table = f"streams_event_{int(stream_id)}_{int(slot)}"
            cursor.execute("SELECT to_regclass(%s)", [table])
            if cursor.fetchone()[0] is not None:
                cursor.execute(f"CREATE INDEX IF NOT EXISTS {table}_chunk ON {table} (body_chunk)")


class Migration(migrations.Migration):

    dependencies = [("streams", "0001_initial")]

    operations = [migrations.RunPython(add_chunk_index, migrations.RunPython.noop)]
