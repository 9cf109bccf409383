"""The rules loader and the condition language beyond what Falco's test cases exercise:
operators, exceptions, append/override, enabled, multi-valued and missing fields, errors with
file and line. Events are fixture lines (Falco's traces), never hand-written ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from timelines.detections import engine, rules

FALCO = Path(__file__).resolve().parents[3].parent / "shared" / "fixtures" / "audit" / "falco"


def trace(name: str) -> dict:
    return json.loads((FALCO / name).read_text())


POD = trace("create_nginx_pod_privileged.json")  # a pod create at RequestResponse level
EXEC = trace("exec_pod.json")  # ResponseStarted of an exec, with ?command=bash


def matches(condition: str, event: dict, extra: str = "") -> bool:
    text = (extra + f"\n- rule: r\n  desc: d\n  condition: >\n    {condition}\n  output: o\n"
            "  priority: INFO\n  source: k8s_audit\n")
    ruleset = rules.load([("t.yaml", text)])
    return bool(engine.evaluate_lines(ruleset, [event]))


def test_operators_on_fixture_fields():
    user = POD["user"]["username"]
    image = POD["requestObject"]["spec"]["containers"][0]["image"]
    assert matches(f"ka.user.name = {user}", POD)
    assert not matches(f"ka.user.name != {user}", POD)
    assert matches(f"ka.user.name startswith {user[:3]}", POD)
    assert matches(f"ka.user.name endswith {user[-3:]}", POD)
    assert matches(f"ka.user.name icontains {user.upper()[1:4]}", POD)
    assert matches(f"ka.user.name glob {user[0]}*", POD)
    assert matches(f"ka.req.pod.containers.image in ({image}, other)", POD)
    assert matches("ka.req.pod.containers.image intersects (x, " + image + ")", POD)
    assert matches("ka.uri pmatch (/api/v1/namespaces)", POD)
    assert matches(f"ka.response.code >= {POD['responseStatus']['code']}", POD)
    assert not matches(f"ka.response.code < {POD['responseStatus']['code']}", POD)
    assert matches("ka.uri.param[command] = bash", EXEC)
    assert matches("jevt.value[/objectRef/subresource] = exec", EXEC)
    assert matches("jevt.rawtime exists and not jevt.rawtime = 0", EXEC)


def test_missing_fields_make_comparisons_false_and_not_true():
    assert "impersonatedUser" not in POD
    assert not matches("ka.impuser.name = x", POD)
    assert not matches("ka.impuser.name != x", POD)
    assert matches("not ka.impuser.name = x", POD)
    assert not matches("ka.impuser.name exists", POD)


def test_nested_lists_macros_exceptions_append_override_enabled():
    user = POD["user"]["username"]
    extra = (f"- list: inner\n  items: [{user}]\n- list: outer\n  items: [inner, other]\n"
             "- macro: m\n  condition: ka.user.name in (outer)\n")
    assert matches("m", POD, extra)
    # an exception naming the user removes the match
    text = (extra + "- rule: r\n  desc: d\n  condition: m\n  output: o %ka.user.name\n"
            "  priority: WARNING\n  source: k8s_audit\n  exceptions:\n"
            f"    - name: known\n      fields: [ka.user.name, ka.verb]\n"
            f"      comps: [=, in]\n      values:\n        - [{user}, [create]]\n")
    assert not engine.evaluate_lines(rules.load([("t.yaml", text)]), [POD])
    no_exception = text.replace("[create]]", "[delete]]")
    found = engine.evaluate_lines(rules.load([("t.yaml", no_exception)]), [POD])
    assert [d.output for d in found] == [f"o {user}"]
    # a later file appends to the condition, overrides the priority, disables another rule
    later = ("- rule: r\n  condition: and ka.verb=create\n  priority: ERROR\n"
             "  override:\n    condition: append\n    priority: replace\n")
    ruleset = rules.load([("t.yaml", no_exception), ("later.yaml", later)])
    assert ruleset.rule("r").condition.endswith("and ka.verb=create")
    assert ruleset.rule("r").priority == "ERROR" and ruleset.rule("r").severity == "critical"
    assert engine.evaluate_lines(ruleset, [POD])
    off = rules.load([("t.yaml", no_exception), ("off.yaml", "- rule: r\n  enabled: false\n")])
    assert not engine.evaluate_lines(off, [POD])


@pytest.mark.parametrize("text,line,reason", [
    ("- rule: r\n  desc: d\n  condition: ka.verb = \n  output: o\n  priority: INFO\n"
     "  source: k8s_audit\n", 3, "'=' needs a value"),
    ("- macro: m\n  condition: (ka.verb=get\n", 2, "missing ')'"),
    ("- list: l\n  items: x\n", 2, "'items' must be a list"),
    ("- list: l\n  items: [a]\n  append: true\n", 1, "no list by that name"),
    ("- rule: r\n  desc: d\n  condition: ka.verb=get\n  output: o %ka.nope\n  priority: INFO\n"
     "  source: k8s_audit\n", 1, "unknown field '%ka.nope'"),
    ("- rule: r\n  desc: d\n  condition: ka.response.code > abc\n  output: o\n"
     "  priority: INFO\n  source: k8s_audit\n", 3, "compares numbers"),
    ("- rule: r\n  enabled: maybe\n", 2, "'enabled' must be true or false"),
    ("- bogus: 1\n", 1, "unknown item"),
])
def test_refusals_name_the_file_and_line(text, line, reason):
    with pytest.raises(rules.RulesError) as refused:
        rules.load([("bad.yaml", text)])
    assert str(refused.value).startswith(f"bad.yaml:{line}: ")
    assert reason in str(refused.value)


def test_the_raw_line_never_rules_out_a_match():
    """``RawLine``: a rule judged false on an event's raw JSON line is false on the parsed
    event, for every trace line, every rule of the shipped, 0.6.0 and engine-v4 rules, and every
    stage the engine tries; and the raw line does rule some out (else it would be useless)."""
    from timelines.detections.condition import View
    from timelines.detections.incident import RawView

    sets = [rules.load(rules.default_files()),
            rules.load([(p.name, p.read_text()) for p in (
                FALCO / "rules" / "k8s_audit_rules-0.6.0.yaml",)]),
            rules.load([(p.name, p.read_text()) for p in (
                FALCO / "rules" / "engine_v4_k8s_audit_rules.yaml",)])]
    ruled_out = 0
    lines = []
    for path in sorted(FALCO.glob("*.json")):
        events, _ = engine.read_trace(path)
        raw = path.read_bytes().splitlines()
        if len(raw) != len(events):  # one event over several lines: as a log line holds it
            raw = [json.dumps(e, separators=(",", ":")).encode() for e in events]
        lines += [(path, line) for line in raw]
    assert len(lines) > 45
    for path, line in lines:
        event = json.loads(line)
        for ruleset in sets:
            for rule in ruleset.active:
                if rule.test(RawView(line)) is False:
                    ruled_out += 1
                    assert not any(rule.test(View(stage)) for stage in
                                   engine.stages_of(event)), (path.name, rule.name)
    assert ruled_out > 100


def test_a_rule_set_is_read_once_for_the_same_files_and_again_when_one_changes():
    shipped = rules.default_files()
    first = rules.load(shipped)
    assert rules.load(list(shipped)) is first
    extra = ("extra.yaml", "- rule: Any pod\n  desc: d\n  condition: ka.target.resource=pods\n"
             "  output: o\n  priority: INFO\n  source: k8s_audit\n")
    added = rules.load(shipped + [extra])
    assert added is not first and added.rule("Any pod") is not None
    assert first.rule("Any pod") is None
    changed = (extra[0], extra[1].replace("Any pod", "Some pod"))
    assert rules.load(shipped + [changed]).rule("Some pod") is not None
    with pytest.raises(rules.RulesError):
        rules.load(shipped + [("bad.yaml", "- rule: x\n  condition: ka.nope=1\n")])
