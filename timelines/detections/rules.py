"""Falco rules files (``list``, ``macro``, ``rule`` items) loaded into one compiled rule set.

Files are read in order, as Falco reads them: a later item of the same name replaces the
earlier one, ``append: true`` (or ``override: {key: append}``) extends it, ``override: {key:
replace}`` replaces single keys, and a rule holding only ``enabled`` turns it on or off. Every
condition is compiled once the last file is read (so a later file may redefine a macro that an
earlier rule uses, which is how users tune the shipped rules). Anything wrong in a file refuses
the whole set with ``RulesError`` naming the file and line: nothing is half-loaded, since the
set is only built when every file compiles.

``required_engine_version`` and ``required_plugin_versions`` are noted, not enforced: the
fields are Hindsight's own implementation of the k8saudit plugin's (``fields.py``).
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from . import fields
from .condition import ConditionError, Context, Test, compile_condition

DEFAULT_DIR = Path(__file__).resolve().parent / "default"
DEFAULT_FILES = (DEFAULT_DIR / "k8s_audit_rules.yaml",)
PLUGIN_VERSION = "0.18.0"  # of the k8saudit plugin whose rules are the default
SOURCE = "k8s_audit"
PRIORITIES = ("EMERGENCY", "ALERT", "CRITICAL", "ERROR", "WARNING", "NOTICE", "INFORMATIONAL",
              "DEBUG")
PRIORITY_ALIASES = {"INFO": "INFORMATIONAL"}


def priority_name(text: str) -> str | None:
    upper = str(text).strip().upper()
    upper = PRIORITY_ALIASES.get(upper, upper)
    return upper if upper in PRIORITIES else None


def severity_of(priority: str) -> str:
    """EMERGENCY…ERROR → critical, WARNING → warning, lower → info (insight severities)."""
    rank = PRIORITIES.index(priority)
    return "critical" if rank <= PRIORITIES.index("ERROR") else (
        "warning" if priority == "WARNING" else "info")


class RulesError(ValueError):
    """A rules file refused: ``str()`` is ``file:line: reason``."""

    def __init__(self, file: str, line: int, reason: str):
        super().__init__(f"{file}:{line}: {reason}")
        self.file, self.line, self.reason = file, line, reason


@dataclass
class Rule:
    name: str
    condition: str
    output: str
    priority: str
    source: str
    file: str
    line: int
    condition_line: int
    desc: str = ""
    enabled: bool = True
    tags: list[str] = field(default_factory=list)
    exceptions: list[dict] = field(default_factory=list)
    test: Test | None = None
    fields: frozenset[str] = frozenset()

    @property
    def severity(self) -> str:
        return severity_of(self.priority)


@dataclass
class RuleSet:
    rules: list[Rule]  # in definition order; the enabled k8s_audit ones carry a test
    lists: dict[str, list[str]]
    macros: dict[str, str]
    files: list[str]
    notes: list[str]

    @property
    def active(self) -> list[Rule]:
        return [r for r in self.rules if r.enabled and r.source == SOURCE and r.test]

    def rule(self, name: str) -> Rule | None:
        return next((r for r in self.rules if r.name == name), None)


class _YamlLoader(yaml.SafeLoader):
    """Safe YAML, where a bare ``=`` (``comps: [=, in]`` in exceptions) is the string it is
    in Falco (YAML 1.1 calls it the "value" key)."""


_YamlLoader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: node.value)


@dataclass
class _Macro:
    condition: str
    file: str
    line: int


class _Loader:
    def __init__(self):
        self.lists: dict[str, list[str]] = {}
        self.macros: dict[str, _Macro] = {}
        self.rules: dict[str, Rule] = {}
        self.notes: list[str] = []
        self.files: list[str] = []

    # --- reading ------------------------------------------------------------------------------

    def load(self, name: str, text: str) -> None:
        self.files.append(name)
        try:
            root = yaml.compose(text, Loader=_YamlLoader)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            context = getattr(exc, "context_mark", None)
            if context is not None and (mark is None or mark.line >= len(text.splitlines())):
                mark = context  # at the end of the file: where the unclosed thing began
            line = mark.line + 1 if mark else 1
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise RulesError(name, line, f"YAML syntax error: {problem}") from None
        if root is None:
            return
        if not isinstance(root, yaml.SequenceNode):
            raise RulesError(name, root.start_mark.line + 1,
                             "a rules file is a list of list, macro and rule items")
        for node in root.value:
            self.item(name, node)

    def item(self, file: str, node) -> None:
        line = node.start_mark.line + 1
        if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null":
            return  # an empty item ("-" alone), which Falco skips (the 0.6.0 rules hold one)
        if not isinstance(node, yaml.MappingNode):
            raise RulesError(file, line, "each item is a mapping (list, macro or rule)")
        data, lines = {}, {}
        constructor = _YamlLoader("")
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if not isinstance(key, str):
                raise RulesError(file, key_node.start_mark.line + 1, "keys are strings")
            try:
                data[key] = constructor.construct_object(value_node, deep=True)
            except yaml.YAMLError as exc:
                raise RulesError(file, value_node.start_mark.line + 1,
                                 f"YAML: {getattr(exc, 'problem', None) or exc}") from None
            lines[key] = value_node.start_mark.line + 1
        if "required_engine_version" in data:
            self.notes.append(f"{file}: required_engine_version {data['required_engine_version']}"
                              " noted, not checked (Hindsight evaluates the rules itself)")
        elif "required_plugin_versions" in data:
            wanted = data["required_plugin_versions"]
            if not isinstance(wanted, list):
                raise RulesError(file, line, "required_plugin_versions is a list")
            for plugin in wanted:
                if isinstance(plugin, dict):
                    self.notes.append(
                        f"{file}: plugin {plugin.get('name')} {plugin.get('version')} noted, "
                        f"not checked (Hindsight implements the k8saudit {PLUGIN_VERSION} fields)")
        elif "list" in data:
            self.list_item(file, line, lines, data)
        elif "macro" in data:
            self.macro_item(file, line, lines, data)
        elif "rule" in data:
            self.rule_item(file, line, lines, data)
        else:
            raise RulesError(file, line, "unknown item: expected list, macro, rule, "
                             "required_engine_version or required_plugin_versions")

    @staticmethod
    def string(file, lines, data, key, *, required=True) -> str | None:
        value = data.get(key)
        if value is None:
            if required:
                raise RulesError(file, lines.get(key, 0) or 1, f"'{key}' is required")
            return None
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise RulesError(file, lines[key], f"'{key}' must be a string")
        return str(value)

    @staticmethod
    def mode(file, line, lines, data, key) -> str:
        """'append', 'replace' or '' (a plain definition) for one key of an item."""
        override = data.get("override")
        if override is not None:
            if not isinstance(override, dict):
                raise RulesError(file, lines["override"], "'override' is a mapping of key: "
                                 "append|replace")
            how = override.get(key)
            if how is not None and how not in ("append", "replace"):
                raise RulesError(file, lines["override"],
                                 f"override of '{key}' must be append or replace")
            return how or ""
        if data.get("append") is True:
            return "append"
        return ""

    def list_item(self, file, line, lines, data):
        name = self.string(file, lines, data, "list")
        items = data.get("items")
        if items is None:
            items = []
        if not isinstance(items, list) or any(
                isinstance(i, dict | list) or i is None for i in items):
            raise RulesError(file, lines.get("items", line), "'items' must be a list of strings")
        items = [fields.render(i) for i in items]
        how = self.mode(file, line, lines, data, "items")
        if how == "append":
            if name not in self.lists:
                raise RulesError(file, line, f"list '{name}' has append but no list by that name "
                                 "is defined before")
            self.lists[name] = self.lists[name] + items
        else:
            self.lists[name] = items

    def macro_item(self, file, line, lines, data):
        name = self.string(file, lines, data, "macro")
        condition = self.string(file, lines, data, "condition")
        how = self.mode(file, line, lines, data, "condition")
        if how == "append":
            if name not in self.macros:
                raise RulesError(file, line, f"macro '{name}' has append but no macro by that "
                                 "name is defined before")
            old = self.macros[name]
            self.macros[name] = _Macro(f"{old.condition} {condition}", old.file, old.line)
        else:
            self.macros[name] = _Macro(condition, file, lines["condition"])

    def rule_item(self, file, line, lines, data):
        name = self.string(file, lines, data, "rule")
        existing = self.rules.get(name)
        keys = set(data) - {"rule", "append", "override"}
        if "enabled" in data and not isinstance(data["enabled"], bool):
            raise RulesError(file, lines["enabled"], "'enabled' must be true or false")
        if "priority" in data and priority_name(data["priority"]) is None:
            raise RulesError(file, lines["priority"], f"unknown priority {data['priority']!r}"
                             f" (one of {', '.join(PRIORITIES)})")
        if "tags" in data and not isinstance(data["tags"], list):
            raise RulesError(file, lines["tags"], "'tags' must be a list")
        if "exceptions" in data:
            self.check_exceptions(file, lines["exceptions"], data["exceptions"])
        if existing is not None and (keys == {"enabled"} or "override" in data
                                     or data.get("append") is True):
            self.change_rule(existing, file, line, lines, data)
            return
        if existing is None and (data.get("append") is True or "override" in data):
            raise RulesError(file, line, f"rule '{name}' has append/override but no rule by "
                             "that name is defined before")
        if existing is None and keys == {"enabled"}:
            raise RulesError(file, line, f"rule '{name}' is enabled/disabled but not defined")
        for key in ("condition", "output", "priority"):
            if key not in data:
                raise RulesError(file, line, f"rule '{name}' has no '{key}'")
        self.rules[name] = Rule(
            name=name, condition=self.string(file, lines, data, "condition"),
            output=self.string(file, lines, data, "output").strip(),
            priority=priority_name(data["priority"]),
            source=str(data.get("source") or "syscall"), file=file, line=line,
            condition_line=lines["condition"], desc=str(data.get("desc") or "").strip(),
            enabled=data.get("enabled", True), tags=[str(t) for t in data.get("tags") or []],
            exceptions=list(data.get("exceptions") or []))

    def change_rule(self, rule: Rule, file, line, lines, data):
        for key in set(data) - {"rule", "append", "override"}:
            how = self.mode(file, line, lines, data, key) or (
                "replace" if key == "enabled" else "")
            if how == "":
                raise RulesError(file, lines[key], f"'{key}' of rule '{rule.name}' is neither "
                                 "appended nor overridden")
            value = data[key]
            if key == "condition":
                value = self.string(file, lines, data, key)
                rule.condition = f"{rule.condition} {value}" if how == "append" else value
                rule.condition_line = lines[key] if how == "replace" else rule.condition_line
            elif key == "output":
                value = self.string(file, lines, data, key).strip()
                rule.output = f"{rule.output} {value}" if how == "append" else value
            elif key == "desc":
                rule.desc = f"{rule.desc} {value}" if how == "append" else str(value)
            elif key == "priority":
                rule.priority = priority_name(value)
            elif key == "enabled":
                rule.enabled = value
            elif key == "tags":
                rule.tags = rule.tags + [str(t) for t in value] if how == "append" else [
                    str(t) for t in value]
            elif key == "exceptions":
                if how == "replace":
                    rule.exceptions = list(value)
                else:
                    for exception in value:
                        same = next((e for e in rule.exceptions
                                     if e.get("name") == exception.get("name")), None)
                        if same is not None and "fields" not in exception:
                            same["values"] = list(same.get("values") or []) + list(
                                exception.get("values") or [])
                        else:
                            rule.exceptions.append(exception)
            elif key == "source":
                rule.source = str(value)
            else:
                raise RulesError(file, lines[key], f"'{key}' cannot be appended or overridden")

    @staticmethod
    def check_exceptions(file, line, exceptions):
        if not isinstance(exceptions, list):
            raise RulesError(file, line, "'exceptions' must be a list")
        for exception in exceptions:
            if not isinstance(exception, dict) or not exception.get("name"):
                raise RulesError(file, line, "each exception is a mapping with a 'name'")
            names = exception.get("fields")
            if names is not None and not isinstance(names, str | list):
                raise RulesError(file, line, f"exception '{exception['name']}': 'fields' must "
                                 "be a field or a list of fields")

    # --- compiling ----------------------------------------------------------------------------

    def build(self) -> RuleSet:
        context = Context(macros={n: m.condition for n, m in self.macros.items()},
                          lists=self.lists)
        # every macro alone first, so that an error points at the macro's own line
        for name, macro in self.macros.items():
            try:
                compile_condition(macro.condition, Context(macros=context.macros,
                                                           lists=self.lists))
            except ConditionError as exc:
                raise RulesError(macro.file, macro.line, f"macro '{name}': {exc}") from None
        for rule in self.rules.values():
            if rule.source != SOURCE:
                self.notes.append(f"{rule.file}:{rule.line}: rule '{rule.name}' is for source "
                                  f"'{rule.source}', not evaluated")
                continue
            text = rule.condition
            try:
                exceptions = exception_condition(rule.exceptions)
            except ValueError as exc:
                raise RulesError(rule.file, rule.line, f"rule '{rule.name}': {exc}") from None
            if exceptions:
                text = f"({text}) and not ({exceptions})"
            try:
                rule.test, used = compile_condition(text, context)
            except ConditionError as exc:
                raise RulesError(rule.file, rule.condition_line,
                                 f"rule '{rule.name}': {exc}") from None
            for ref in output_fields(rule.output):
                if fields.extractor(ref) is None:
                    raise RulesError(rule.file, rule.line,
                                     f"rule '{rule.name}': unknown field '%{ref}' in output")
            rule.fields = frozenset(used)
        return RuleSet(rules=list(self.rules.values()), lists=dict(self.lists),
                       macros=context.macros, files=self.files, notes=self.notes)


def _quote(value) -> str:
    text = fields.render(value) or ""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def exception_condition(exceptions: list[dict]) -> str:
    """Falco's exceptions as one condition: any tuple of values that matches excludes."""
    alternatives = []
    for exception in exceptions:
        names = exception.get("fields")
        values = exception.get("values") or []
        if not values or names is None:
            continue
        if isinstance(names, str):  # one field: values are compared with `in` (or `comps`)
            comp = exception.get("comps") or "in"
            if comp in ("in", "intersects", "pmatch"):
                alternatives.append(f"{names} {comp} ({', '.join(_quote(v) for v in values)})")
            else:
                alternatives += [f"{names} {comp} {_quote(v)}" for v in values]
            continue
        comps = exception.get("comps") or ["="] * len(names)
        if not isinstance(comps, list) or len(comps) != len(names):
            raise ValueError(f"exception '{exception['name']}': 'comps' must match 'fields'")
        for row in values:
            if not isinstance(row, list) or len(row) != len(names):
                raise ValueError(f"exception '{exception['name']}': each value must have one "
                                 f"item per field ({len(names)})")
            parts = []
            for name, comp, value in zip(names, comps, row, strict=True):
                if comp in ("in", "intersects", "pmatch"):
                    items = value if isinstance(value, list) else [value]
                    parts.append(f"{name} {comp} ({', '.join(_quote(v) for v in items)})")
                else:
                    parts.append(f"{name} {comp} {_quote(value)}")
            alternatives.append("(" + " and ".join(parts) + ")")
    return " or ".join(alternatives)


OUTPUT_FIELD = re.compile(r"%(" + fields.FIELD_NAME.pattern + r")")


def output_fields(output: str) -> list[str]:
    return [m.group(1) for m in OUTPUT_FIELD.finditer(output)]


def format_value(value) -> str:
    if value is None:
        return "<NA>"
    if isinstance(value, list):
        return "(" + ",".join(value) + ")"
    return value


def render_output(rule: Rule, event: dict) -> str:
    """The rule's output with each ``%field`` replaced by the event's value (``<NA>`` when
    absent, ``(a,b)`` for list fields), as Falco prints it."""
    def value(match):
        extract = fields.extractor(match.group(1))
        return format_value(extract(event)) if extract else match.group(0)
    return OUTPUT_FIELD.sub(value, rule.output)


_LOADED: OrderedDict[tuple, RuleSet] = OrderedDict()
_LOADED_MAX = 32
_loaded_lock = threading.Lock()


def load(files: list[tuple[str, str]]) -> RuleSet:
    """The rule set of ``files`` ((name, text) in order); RulesError if any is refused.

    Rule sets read before are kept by the files' names and texts (the last ``_LOADED_MAX``):
    reading the shipped rules' YAML takes about 170 ms, which a stream paid for every batch.
    A rule set is not changed once built, so callers share it."""
    key = tuple((name, hashlib.sha256(text.encode()).digest()) for name, text in files)
    with _loaded_lock:
        found = _LOADED.get(key)
        if found is not None:
            _LOADED.move_to_end(key)
            return found
    loader = _Loader()
    for name, text in files:
        loader.load(name, text)
    ruleset = loader.build()
    with _loaded_lock:
        _LOADED[key] = ruleset
        while len(_LOADED) > _LOADED_MAX:
            _LOADED.popitem(last=False)
    return ruleset


def default_files() -> list[tuple[str, str]]:
    return [(path.name, path.read_text()) for path in DEFAULT_FILES]
