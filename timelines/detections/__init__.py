"""Security detections: Falco ``k8s_audit`` rules evaluated over an incident's requests.

- ``rules``: Falco rules files (lists, macros, rules, append/override, exceptions) loaded into
  one compiled set, refused as a whole with ``file:line: reason``;
- ``condition``: the condition language, compiled once into closures, three-valued so that the
  indexed columns alone can decide most rules;
- ``fields``: the ``ka.*`` and ``jevt.*`` fields, extracted from one audit event;
- ``engine``: rules over audit lines and stored requests (a request counted once).

No Django import in these modules; ``incident`` reads the event store.
"""
