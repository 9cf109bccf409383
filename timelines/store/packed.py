"""Packed arrays read from PostgreSQL as bytes.

Several readers have PostgreSQL pack a value per event into one ``bytea`` (``string_agg`` of
``int8send``…: the column index, the detections' body pointers, a selection's times, the
request statistics), which numpy then reads in place. Through Django's cursor (client-side
binding, results as text) a ``bytea`` arrives as hex text, twice its size, and is decoded into
a second copy: a million requests' body pointers (24 MB) took 150 MB at the peak. ``fetch``
asks for the results in binary instead: the bytes once, 50 MB at the peak.
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
from django.db import connection


def fetch(sql: str, params: Sequence = ()) -> list[tuple]:
    """The rows of ``sql`` (PostgreSQL, ``%s`` parameters bound by the server: give a
    parameter whose type the query does not tell a cast, ``%s::text``), every value in binary
    (a ``bytea`` as ``bytes``), on Django's connection: inside the caller's transaction."""
    connection.ensure_connection()
    with psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(sql, params, binary=True)
        return cursor.fetchall()
