"""Falco's own k8s_audit tests (falco_k8s_audit_tests.yaml), every case, evaluated in-process on
its trace file with the rules files it names.

The cases name three kinds of rules file: the test rules under ``./rules/k8s_audit/`` (in
fixtures, ``falco/rules/``), the k8saudit plugin's rules (``BUILD_DIR/k8saudit-rules…``: the
0.6.0 rules those tests were written against), and Falco's syscall rules ``falco_rules.yaml``,
which are not in fixtures. That file holds only ``source: syscall`` items, so no k8s_audit rule
can use its macros (a reference would be refused as an undefined macro): each case is first
loaded without it. Two of its lists are the exception, ``falco_privileged_images`` and
``falco_sensitive_mount_images``: the 0.6.0 k8s_audit rules name them and
``trust_nginx_container.yaml`` appends to them, which Falco refuses for a list not defined
before. For the cases that need them (and only those: the test checks that the refusal names
exactly these lists), STAND_IN defines them empty. Their real items are other images
(falcosecurity/falco, sysdig…), none of which is in these traces, so a trace's outcome does not
depend on them.
"""

from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path

import pytest
import yaml

from timelines.detections import engine, rules

FALCO = Path(__file__).resolve().parents[3].parent / "shared" / "fixtures" / "audit" / "falco"
CASES_FILE = FALCO / "falco_k8s_audit_tests.yaml"
SYSCALL_RULES = "falcosecurity-rules-falco/falco_rules.yaml"
PLUGIN_RULES = "k8saudit-rules/k8s_audit_rules.yaml"
STAND_IN = ("falco_rules.yaml (stand-in for the lists the k8s_audit rules name)", """
- list: falco_privileged_images
  items: []
- list: falco_sensitive_mount_images
  items: []
""")
STAND_IN_LISTS = {"falco_privileged_images", "falco_sensitive_mount_images"}


class _Loader(yaml.SafeLoader):
    pass


_Loader.add_constructor("!mux", lambda loader, node: loader.construct_mapping(node, deep=True))


def cases() -> dict[str, dict]:
    return yaml.load(CASES_FILE.read_text(), Loader=_Loader)["trace_files"]


def rules_path(named: str) -> Path | None:
    """The fixture file a case's rules_file names; None for Falco's syscall rules."""
    if named.endswith(SYSCALL_RULES):
        return None
    if named.endswith(PLUGIN_RULES):
        return FALCO / "rules" / "k8s_audit_rules-0.6.0.yaml"
    assert named.startswith("./rules/k8s_audit/"), named
    return FALCO / "rules" / named.removeprefix("./rules/k8s_audit/")


@functools.cache
def ruleset_of(name: str) -> tuple[rules.RuleSet, bool]:
    """The rules of case ``name`` (without falco_rules.yaml if it loads so) and whether it
    needed the stand-in."""
    named = CASES[name]["rules_file"]
    files = [(p.name, p.read_text()) for p in map(rules_path, named) if p is not None]
    try:
        return rules.load(files), False
    except rules.RulesError as exc:
        if not any(n.endswith(SYSCALL_RULES) for n in named):
            raise
        missing = exc.reason.split("'")[1] if "has append but no list" in exc.reason else None
        assert missing in STAND_IN_LISTS, f"needs falco_rules.yaml beyond the stand-in: {exc}"
        return rules.load([STAND_IN] + files), True


def trace_of(case: dict) -> Path:
    option = case["addl_cmdline_opts"]
    return FALCO / option.rsplit("/", 1)[1]


CASES = cases()


@pytest.mark.parametrize("name", sorted(CASES))
def test_falco_case(name):
    case = CASES[name]
    ruleset, _ = ruleset_of(name)
    events, errors = engine.read_trace(trace_of(case))
    found = engine.evaluate_lines(ruleset, events)
    counts = Counter(d.rule.name for d in found)
    if not case["detect"]:
        assert not found, [f"{d.rule.name}: {d.output}" for d in found]
    else:
        for expected in case.get("detect_counts", []):
            for rule_name, count in expected.items():
                assert counts[rule_name] == count, (rule_name, counts)
        level = rules.priority_name(case["detect_level"])
        assert any(d.rule.priority == level for d in found), (level, counts)
    if "stderr_contains" in case:
        assert any(case["stderr_contains"] in error for error in errors), errors
    else:
        assert not errors


def test_only_the_trusted_image_cases_need_falco_rules_lists():
    """The stand-in is used exactly where trust_nginx_container.yaml appends to the two lists."""
    needing = {name for name in CASES if ruleset_of(name)[1]}
    expected = {name for name, case in CASES.items()
                if "./rules/k8s_audit/trust_nginx_container.yaml" in case["rules_file"]
                and any(p.endswith(PLUGIN_RULES) for p in case["rules_file"])}
    assert needing == expected and needing


def test_default_rules_run_on_every_trace():
    """The vendored 0.18.0 rules load (48 rules) and run on every trace without error."""
    ruleset = rules.load(rules.default_files())
    assert len(ruleset.active) == 48
    assert (rules.DEFAULT_DIR / "LICENSE").read_text().startswith(" " * 32 + "Apache License") \
        or "Apache License" in (rules.DEFAULT_DIR / "LICENSE").read_text()[:200]
    assert (rules.DEFAULT_FILES[0].read_bytes()
            == (FALCO / "rules" / "k8s_audit_rules.yaml").read_bytes())
    for trace in sorted(FALCO.glob("*.json")):
        events, _ = engine.read_trace(trace)
        for detection in engine.evaluate_lines(ruleset, events):
            assert detection.output and "%ka." not in detection.output
