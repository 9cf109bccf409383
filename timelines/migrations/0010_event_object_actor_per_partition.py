"""The ``event_object`` and ``event_actor`` indexes become each partition's own (PostgreSQL only).

A partitioned index obliges every partition to have its copy before it is attached, so a bulk
load (``timelines.ingest.bulk``) built all four indexes of its table before the first answer:
these two took 2.4 of their 3.4 s at 500,000 events. As indexes of each partition instead of the
parent's, a load attaches with the primary key and the request identity (which the attach
requires) and builds these two after the first answer (``bulk.index_partition``, an analysis);
meanwhile its reads are exact, only without these two shortcuts. The DEFAULT partition keeps
both, maintained row by row as before.

Django's view does not change (``Event.Meta.indexes`` still names them; on SQLite they are the
table's). The indexes are named ``<name>_<partition suffix>``: ``event_actor_default``,
``event_actor_12``.
"""

from __future__ import annotations

from django.db import migrations

TABLE = "timelines_event"
# name → columns, as the DEFAULT partition has them (a bulk load's partition gets them without the
# leading incident_id: ``timelines.ingest.bulk.PARTITION_INDEXES``)
INDEXES = {
    "event_object": "(incident_id, resource, namespace, name, received)",
    "event_actor": "(incident_id, username, received)",
}


def _partitions(cursor) -> list[str]:
    cursor.execute("SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
                   f" WHERE i.inhparent = '{TABLE}'::regclass ORDER BY c.relname")
    return [name for (name,) in cursor.fetchall()]


def per_partition(apps, schema_editor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        partitions = _partitions(cursor)
        for name, columns in INDEXES.items():
            # with each partition's copy, made again below as the partition's own
            cursor.execute(f"DROP INDEX IF EXISTS {name}")
            for partition in partitions:
                suffix = partition.removeprefix(f"{TABLE}_")
                cursor.execute(f"CREATE INDEX IF NOT EXISTS {name}_{suffix} ON {partition}"
                               f" {columns}")


def on_the_parent(apps, schema_editor) -> None:
    """The parent's index again, which adopts each partition's own (made first where missing:
    a load whose analyses have not run), keeping the names that 0003 gave them."""
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        partitions = _partitions(cursor)
        for name, columns in INDEXES.items():
            for partition in partitions:
                suffix = partition.removeprefix(f"{TABLE}_")
                cursor.execute(f"CREATE INDEX IF NOT EXISTS {name}_{suffix} ON {partition}"
                               f" {columns}")
            cursor.execute(f"CREATE INDEX {name} ON {TABLE} {columns}")


class Migration(migrations.Migration):

    dependencies = [
        ("timelines", "0009_event_kind_state"),
    ]

    operations = [
        migrations.RunPython(per_partition, on_the_parent),
    ]
