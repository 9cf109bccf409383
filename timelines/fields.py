"""A list-of-strings column: ``text[]`` on PostgreSQL (GIN-indexable), JSON text elsewhere."""

from __future__ import annotations

import json

from django.db import models


class StringListField(models.Field):
    description = "A list of strings"

    def db_type(self, connection) -> str:
        return "text[]" if connection.vendor == "postgresql" else "text"

    def get_db_prep_value(self, value, connection, prepared=False):
        if value is None:
            return None
        value = list(value)
        return value if connection.vendor == "postgresql" else json.dumps(value)

    def from_db_value(self, value, expression, connection):
        if value is None or isinstance(value, list):
            return value
        return json.loads(value)

    def to_python(self, value):
        if isinstance(value, str):
            return json.loads(value)
        return value


@StringListField.register_lookup
class Has(models.Lookup):
    """``groups__has="system:masters"``: the list contains this string."""

    lookup_name = "has"

    def get_db_prep_lookup(self, value, connection):
        return ("%s", [value])

    def as_sql(self, compiler, connection):
        lhs, lhs_params = self.process_lhs(compiler, connection)
        rhs, rhs_params = self.process_rhs(compiler, connection)
        if connection.vendor == "postgresql":
            return f"{lhs} @> ARRAY[{rhs}]::text[]", [*lhs_params, *rhs_params]
        return (f"EXISTS (SELECT 1 FROM json_each({lhs}) WHERE json_each.value = {rhs})",
                [*lhs_params, *rhs_params])
