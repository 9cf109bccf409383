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


def test_a_body_verdict_is_reused_only_for_the_same_values_of_the_fields_read():
    """A stored request's body is decided once per distinct combination of the values its
    open rules read: a pod that differs only in its name and auditID (which no rule reads)
    takes the first pod's verdict, one that is not privileged is decided again, and not
    matched."""
    import copy
    from collections import defaultdict

    from timelines.detections.incident import _Plan, _try, possible_stages

    ruleset = rules.load(rules.default_files())
    open_rules = [ruleset.rule("Create Privileged Pod"), ruleset.rule("Create HostPid Pod")]
    plan = _Plan(open_rules, {r.name: possible_stages(r) for r in open_rules})
    renamed = copy.deepcopy(POD)
    renamed["auditID"] = "another"
    renamed["objectRef"]["name"] = renamed["requestObject"]["metadata"]["name"] = "other"
    unprivileged = copy.deepcopy(POD)
    unprivileged["requestObject"]["spec"]["containers"][0]["securityContext"] = {}
    matched = defaultdict(list)
    for number, body in enumerate((POD, renamed, unprivileged), 1):
        _try(plan, body, number, matched)
    assert dict(matched) == {"Create Privileged Pod": [1, 2]}
    assert len(plan.memo) == 2


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
