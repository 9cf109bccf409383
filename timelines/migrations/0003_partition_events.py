"""``timelines_event`` becomes a table partitioned by incident (PostgreSQL only).

A large new incident is loaded into a table of its own without indexes, indexed once and attached
as the incident's partition (``timelines.ingest.bulk``: about 3x less database CPU than
maintaining six indexes row by row). The existing table, rows and indexes included, becomes the
DEFAULT partition, which holds every incident without a partition of its own.

Django's view of the table does not change: the same columns, and the parent keeps the index and
constraint names Django made. Two things differ, because PostgreSQL 15 requires them of a
partitioned table: ``id`` takes its value from a sequence owned by the column (an identity column
is not allowed), and the primary key is ``(id, incident_id)`` (it must hold the partition key);
the sequence alone keeps ids unique. On SQLite this migration does nothing.
"""

from __future__ import annotations

from django.db import migrations

TABLE = "timelines_event"
DEFAULT = "timelines_event_default"
SEQUENCE = "timelines_event_id_seq"
# Suffix of the default partition's index names: the parent's take the names Django knows.
SUFFIX = "_default"


def _next_id(cursor) -> int:
    """The first id not handed out yet, by the sequence or by an explicit insert."""
    cursor.execute(f"SELECT coalesce(max(id), 0), pg_sequence_last_value("
                   f"pg_get_serial_sequence('{TABLE}', 'id')::regclass) FROM {TABLE}")
    largest, last = cursor.fetchone()
    return max(largest, last or 0) + 1


def partition(apps, schema_editor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        # Every index with its constraint, if any, to be made again on the parent.
        cursor.execute(
            "SELECT i.relname, pg_get_indexdef(i.oid), c.conname, c.contype,"
            " pg_get_constraintdef(c.oid) FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid"
            " LEFT JOIN pg_constraint c ON c.conindid = i.oid AND c.conrelid = x.indrelid"
            f" WHERE x.indrelid = '{TABLE}'::regclass ORDER BY i.relname")
        indexes = cursor.fetchall()
        next_id = _next_id(cursor)
        statements = []
        for name, _, constraint, kind, _ in indexes:
            if kind == "p":  # replaced below by one that holds the partition key
                statements.append(f"ALTER TABLE {TABLE} DROP CONSTRAINT {constraint}")
        statements += [
            f"ALTER TABLE {TABLE} RENAME TO {DEFAULT}",
            f"ALTER TABLE {DEFAULT} ALTER COLUMN id DROP IDENTITY",  # drops its sequence too
            *(f"ALTER INDEX {name} RENAME TO {name}{SUFFIX}"  # renames its constraint too
              for name, _, _, kind, _ in indexes if kind != "p"),
            f"ALTER TABLE {DEFAULT} ADD PRIMARY KEY (id, incident_id)",
            f"CREATE TABLE {TABLE} (LIKE {DEFAULT} INCLUDING DEFAULTS)"
            f" PARTITION BY LIST (incident_id)",
            f"CREATE SEQUENCE {SEQUENCE} OWNED BY {TABLE}.id START WITH {next_id}",
            f"ALTER TABLE {TABLE} ALTER COLUMN id SET DEFAULT nextval('{SEQUENCE}')",
            f"ALTER TABLE {TABLE} ATTACH PARTITION {DEFAULT} DEFAULT",
        ]
        # Made on the parent after the attach, each index adopts the default partition's
        # equivalent instead of building another.
        for name, definition, constraint, kind, constraint_definition in indexes:
            if kind == "p":
                statements.append(f"ALTER TABLE {TABLE} ADD CONSTRAINT {constraint}"
                                  f" PRIMARY KEY (id, incident_id)")
            elif constraint:
                statements.append(f"ALTER TABLE {TABLE} ADD CONSTRAINT {constraint}"
                                  f" {constraint_definition}")
            else:
                statements.append(definition)  # still reads ON public.timelines_event
        for statement in statements:
            cursor.execute(statement)


def unpartition(apps, schema_editor) -> None:
    """Back to one plain table: every incident's partition is folded into the default one, which
    becomes the table again (loads in progress are dropped)."""
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        next_id = _next_id(cursor)
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            f" WHERE i.inhparent = '{TABLE}'::regclass AND c.relname <> '{DEFAULT}'")
        partitions = [name for (name,) in cursor.fetchall()]
        cursor.execute("SELECT relname FROM pg_class WHERE relkind = 'r'"
                       " AND relname ~ '^timelines_event_load_[0-9]+$'")
        loads = [name for (name,) in cursor.fetchall()]
        cursor.execute("SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum)"
                       f" FROM pg_attribute WHERE attrelid = '{TABLE}'::regclass AND attnum > 0"
                       " AND NOT attisdropped")
        columns = cursor.fetchone()[0]
        statements = []
        for name in partitions:
            statements += [f"ALTER TABLE {TABLE} DETACH PARTITION {name}",
                           f"INSERT INTO {DEFAULT} ({columns}) SELECT {columns} FROM {name}",
                           f"DROP TABLE {name}"]
        # Loads in progress go: their id default needs the sequence, which goes with the parent.
        statements += [f"DROP TABLE {name}" for name in loads]
        statements += [
            f"ALTER TABLE {TABLE} DETACH PARTITION {DEFAULT}",
            f"DROP TABLE {TABLE}",  # and its sequence
            f"ALTER TABLE {DEFAULT} RENAME TO {TABLE}",
            f"ALTER TABLE {TABLE} DROP CONSTRAINT {DEFAULT}_pkey",
            f"ALTER TABLE {TABLE} ADD CONSTRAINT {TABLE}_pkey PRIMARY KEY (id)",
            f"ALTER TABLE {TABLE} ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY"
            f" (START WITH {next_id})",
        ]
        for statement in statements:
            cursor.execute(statement)
        cursor.execute("SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid"
                       f" WHERE x.indrelid = '{TABLE}'::regclass AND i.relname LIKE %s",
                       ["%" + SUFFIX])
        for (name,) in cursor.fetchall():
            cursor.execute(f"ALTER INDEX {name} RENAME TO {name.removesuffix(SUFFIX)}")


class Migration(migrations.Migration):

    dependencies = [
        ("timelines", "0002_evidence_kinds"),
    ]

    operations = [
        migrations.RunPython(partition, unpartition, elidable=False),
    ]
