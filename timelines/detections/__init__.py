"""Security detections: Falco ``k8s_audit`` rules evaluated over an incident's requests.

- ``rules``: Falco rules files (lists, macros, rules, append/override, exceptions) loaded into
  one compiled set, refused as a whole with ``file:line: reason``;
- ``condition``: the condition language, compiled once into closures, three-valued so that the
  indexed columns alone can decide most rules;
- ``fields``: the ``ka.*`` and ``jevt.*`` fields, extracted from one audit event;
- ``engine``: rules over audit lines and stored requests (a request counted once).

- ``incident``: the rules over an incident's stored requests (columns first, bodies only where
  a rule needs them), its detection insights and the matches the ``detection=`` filter reads;
- ``models`` (app label ``detections``, its own migrations): added rules files, matches;
  ``views``: ``/api/v1/rules/``.

``rules``, ``condition``, ``fields`` and ``engine`` import nothing of Django: they run on plain
dicts (the tests feed them Falco's trace files).
"""
