"""DuckDB loading the same audit logs as ``bench/ingest``, for comparison; run by it with a
virtualenv of its own (DuckDB is installed for the benchmark only, never for Hindsight).

    python bench/duckdb_load.py memory|disk DATABASE FILE [FILE ...]

``memory``: the filter columns of every request, its stages collapsed to one row (the last
stage's code, the first received time), in an in-memory database: what it takes to answer the
first filtered question. ``disk``: every line kept whole (its JSON text) beside the same columns,
in a database file (``DATABASE``, removed first): closer to what Hindsight stores. Prints one JSON
line: ``{"mode", "seconds", "requests", "rows"}``; the caller times the process too.
"""

from __future__ import annotations

import json
import os
import sys
import time

import duckdb

COLUMNS = {
    "auditID": "VARCHAR", "stage": "VARCHAR", "verb": "VARCHAR", "requestURI": "VARCHAR",
    "userAgent": "VARCHAR", "sourceIPs": "VARCHAR[]",
    "requestReceivedTimestamp": "TIMESTAMP", "stageTimestamp": "TIMESTAMP",
    "user": "STRUCT(username VARCHAR)",
    "objectRef": "STRUCT(resource VARCHAR, namespace VARCHAR, name VARCHAR, "
                 "subresource VARCHAR, apiGroup VARCHAR)",
    "responseStatus": "STRUCT(code INTEGER)",
}
COLLAPSED = """
    SELECT auditID, min(requestReceivedTimestamp) AS received, max(stageTimestamp) AS completed,
           any_value(verb) AS verb, any_value("user".username) AS username,
           any_value(objectRef.resource) AS resource, any_value(objectRef.namespace) AS namespace,
           any_value(objectRef.name) AS name, max(responseStatus.code) AS code,
           any_value(userAgent) AS user_agent, any_value(requestURI) AS request_uri
    FROM {source} GROUP BY auditID
"""


def main() -> int:
    mode, database, *files = sys.argv[1:]
    started = time.perf_counter()
    columns = "{" + ", ".join(f"'{k}': '{v}'" for k, v in COLUMNS.items()) + "}"
    paths = "[" + ", ".join("'" + f.replace("'", "''") + "'" for f in files) + "]"
    reader = f"read_json({paths}, format='newline_delimited', columns={columns})"
    if mode == "memory":
        con = duckdb.connect(":memory:")
        con.execute("CREATE TABLE events AS " + COLLAPSED.format(source=reader))
        rows = None  # the lines themselves are not kept
    elif mode == "disk":
        if os.path.exists(database):
            os.unlink(database)
        con = duckdb.connect(database)
        lines = f"read_json_objects({paths}, format='newline_delimited')"
        con.execute(f"""CREATE TABLE lines AS SELECT json AS line,
            json ->> '$.auditID' AS auditID, json ->> '$.stage' AS stage,
            json ->> '$.verb' AS verb, json ->> '$.user.username' AS username,
            json ->> '$.objectRef.resource' AS resource,
            json ->> '$.objectRef.namespace' AS namespace, json ->> '$.objectRef.name' AS name,
            CAST(json ->> '$.responseStatus.code' AS INTEGER) AS code,
            CAST(json ->> '$.requestReceivedTimestamp' AS TIMESTAMP) AS received
            FROM {lines}""")
        con.execute("CHECKPOINT")
        rows = con.execute("SELECT count(*) FROM lines").fetchone()[0]
    else:
        raise SystemExit(f"mode must be memory or disk, not {mode!r}")
    requests = con.execute(
        "SELECT count(*) FROM events" if mode == "memory"
        else "SELECT count(DISTINCT auditID) FROM lines").fetchone()[0]
    seconds = time.perf_counter() - started
    print(json.dumps({"mode": mode, "seconds": round(seconds, 3), "requests": requests,
                      "rows": rows, "duckdb": duckdb.__version__}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
