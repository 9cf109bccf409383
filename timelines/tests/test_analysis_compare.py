"""Run against run (``timelines.analysis.compare``): two synthetic runs written here, the same
test with different timing and one extra step on each side; every expectation is computed from
the steps and timestamps this module writes."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from incidents.models import Incident
from timelines.analysis import compare_views
from timelines.analysis.compare import Step, default_anchors, match_steps
from timelines.models import Event

START_A = datetime(2024, 3, 1, 10, 0, 0, tzinfo=UTC)
START_B = datetime(2024, 3, 5, 8, 0, 0, 500_000, tzinfo=UTC)
# (user, verb, resource, subresource, namespace, name, seconds from the start, code)
RUN_A = [
    ("tester", "get", "namespaces", "", "", "e2e", 0.0, 200),
    ("tester", "create", "configmaps", "", "e2e", "early", 0.2, 409),  # failed: no anchor
    ("tester", "create", "serviceaccounts", "", "e2e", "robot-a", 0.4, 201),  # not in b
    ("tester", "create", "configmaps", "", "e2e", "cfg", 1.0, 201),  # the anchor
    ("tester", "create", "pods", "", "e2e", "web", 1.5, 201),
    ("tester", "get", "pods", "", "e2e", "web", 2.0, 200),
    ("tester", "get", "pods", "", "e2e", "web", 3.0, 200),
    ("kubelet", "patch", "pods", "status", "e2e", "web", 4.0, 200),
    ("tester", "delete", "secrets", "", "e2e", "old", 5.0, 200),  # only in a
]
RUN_B = [
    ("tester", "create", "leases", "", "e2e", "robot-b", 0.0, 201),  # created before, not in a
    ("tester", "get", "namespaces", "", "", "e2e", 0.3, 200),
    ("tester", "create", "configmaps", "", "e2e", "early", 0.5, 409),
    ("tester", "create", "configmaps", "", "e2e", "cfg", 2.0, 201),  # the anchor
    ("tester", "create", "pods", "", "e2e", "web", 2.1, 201),
    ("tester", "get", "pods", "", "e2e", "web", 3.0, 200),
    ("tester", "get", "pods", "", "e2e", "web", 32.0, 200),
    ("kubelet", "patch", "pods", "status", "e2e", "web", 46.0, 200),
    ("tester", "create", "services", "", "e2e", "svc", 47.0, 201),  # only in b
]


def _write_run(path: Path, start: datetime, steps) -> None:
    lines = []
    for n, (user, verb, resource, sub, namespace, name, seconds, code) in enumerate(steps):
        at = start + timedelta(seconds=seconds)
        ref = {"resource": resource, "name": name, **({"namespace": namespace} if namespace
                                                      else {}),
               **({"subresource": sub} if sub else {})}
        lines.append(json.dumps({
            "kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
            "auditID": f"{path.stem}-{n:04d}", "stage": "ResponseComplete", "verb": verb,
            "requestURI": f"/{resource}/{name}", "user": {"username": user},
            "objectRef": ref, "responseStatus": {"code": code},
            "requestReceivedTimestamp": at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "stageTimestamp": (at + timedelta(milliseconds=3)).strftime(
                "%Y-%m-%dT%H:%M:%S.%fZ")}))
    path.write_text("\n".join(lines) + "\n")


def _key(step) -> tuple:
    user, verb, resource, sub, namespace, name = step[:6]
    return (user, verb, resource, namespace, name, sub)


def _expected(steps_a, steps_b, anchor_a: int, anchor_b: int) -> dict:
    """key → [(offset in a or None, offset in b or None)], the i-th occurrence with the i-th,
    offsets in ms from the written anchor times."""
    out: dict[tuple, list] = {}
    for side, steps, anchor in (("a", steps_a, anchor_a), ("b", steps_b, anchor_b)):
        seen: Counter = Counter()
        for step in steps:
            key = _key(step)
            slots = out.setdefault(key, [])
            n = seen[key]
            seen[key] += 1
            if n == len(slots):
                slots.append([None, None])
            slots[n][0 if side == "a" else 1] = round((step[6] - steps[anchor][6]) * 1000, 3)
    return {key: [tuple(slot) for slot in slots] for key, slots in out.items()}


def _answered(steps: list[dict]) -> dict:
    out: dict[tuple, list] = {}
    for step in steps:
        key = (step["user"], step["verb"], step["resource"], step["namespace"], step["name"],
               step["subresource"])
        out.setdefault(key, []).append(tuple(
            None if step[side] is None else round(step[side]["offset_ms"], 3)
            for side in ("a", "b")))
    return out


@pytest.fixture
def runs(tmp_path, team, owner, incident, ingest_file):
    """Run a (the ``incident`` fixture) and run b, ingested from RUN_A and RUN_B."""
    other = Incident.objects.create(title="the same test, new version", team=team,
                                    created_by=owner)
    for name, target, start, steps in (("run-a", incident, START_A, RUN_A),
                                       ("run-b", other, START_B, RUN_B)):
        path = tmp_path / f"{name}.log"
        _write_run(path, start, steps)
        assert ingest_file(target, path).status == "done"
    return incident, other


def _ids(incident) -> dict[int, int]:
    """Row index in the written run → event id."""
    return {int(audit_id.rsplit("-", 1)[1]): pk for audit_id, pk in
            Event.objects.filter(incident=incident).values_list("audit_id", "id")}


def _compare(api, a, b, **params):
    return api(f"/api/v1/incidents/{a.pk}/compare/", {"against": b.pk, **params})


def test_it_matches_the_steps_of_two_runs_in_order_from_the_first_shared_create(api, runs):
    _assert_matched(api, *runs)


@pytest.mark.embedded
def test_it_matches_the_steps_in_the_embedded_mode_too(api, runs):
    _assert_matched(api, *runs)


def _assert_matched(api, a, b) -> None:
    answer = _compare(api, a, b)
    assert answer.status_code == 200, answer.content
    body = answer.json()
    anchor_a = next(n for n, s in enumerate(RUN_A) if s[5] == "cfg")
    anchor_b = next(n for n, s in enumerate(RUN_B) if s[5] == "cfg")
    assert body["anchor"]["a"] == _ids(a)[anchor_a]
    assert body["anchor"]["b"] == _ids(b)[anchor_b]
    assert body["anchor"]["rule"] == "first-shared-create"
    expected = _expected(RUN_A, RUN_B, anchor_a, anchor_b)
    assert _answered(body["steps"]) == expected
    only_a = [k for k, slots in expected.items() for x, y in slots if y is None]
    only_b = [k for k, slots in expected.items() for x, y in slots if x is None]
    assert sorted(only_a) == [("tester", "create", "serviceaccounts", "e2e", "robot-a", ""),
                              ("tester", "delete", "secrets", "e2e", "old", "")]
    assert sorted(only_b) == [("tester", "create", "leases", "e2e", "robot-b", ""),
                              ("tester", "create", "services", "e2e", "svc", "")]
    assert (sorted(only_a + only_b) == sorted(
        (s["user"], s["verb"], s["resource"], s["namespace"], s["name"], s["subresource"])
        for s in body["steps"] if s["a"] is None or s["b"] is None))
    assert body["summary"] == {"both": len(body["steps"]) - len(only_a) - len(only_b),
                               "only_a": len(only_a), "only_b": len(only_b)}
    for step in body["steps"]:
        if step["a"] and step["b"]:
            assert step["delta_ms"] == pytest.approx(step["b"]["offset_ms"]
                                                     - step["a"]["offset_ms"])
        for side, run in (("a", a), ("b", b)):
            if step[side]:
                assert Event.objects.filter(incident=run, pk=step[side]["event"]).exists()
    # the second get of the pod: 2 s after the anchor in a, 30 s in b
    gets = [s for s in body["steps"] if s["verb"] == "get" and s["name"] == "web"]
    assert [(s["a"]["offset_ms"], s["b"]["offset_ms"]) for s in gets] == [
        (1000.0, 1000.0), (2000.0, 30000.0)]
    assert body["truncated"] == {"a": False, "b": False}


def test_given_anchors_move_the_offsets(api, runs):
    a, b = runs
    ids_a, ids_b = _ids(a), _ids(b)
    answer = _compare(api, a, b, anchor_a=ids_a[0], anchor_b=ids_b[1]).json()
    assert answer["anchor"] == {**answer["anchor"], "a": ids_a[0], "b": ids_b[1],
                                "rule": "given"}
    assert _answered(answer["steps"]) == _expected(RUN_A, RUN_B, 0, 1)


def test_bad_anchors_get_a_clear_400(api, runs):
    a, b = runs
    ids_a, ids_b = _ids(a), _ids(b)
    only_one = _compare(api, a, b, anchor_a=ids_a[0])
    assert only_one.status_code == 400
    assert "anchor_a and anchor_b" in only_one.json()["detail"]
    wrong = _compare(api, a, b, anchor_a=ids_b[0], anchor_b=ids_b[1])  # b's event as a's
    assert wrong.status_code == 400
    assert wrong.json()["anchor_a"] == f"event {ids_b[0]} is not an event of incident {a.pk}"
    assert _compare(api, a, b, anchor_a="x", anchor_b=ids_b[1]).status_code == 400
    assert api(f"/api/v1/incidents/{a.pk}/compare/").status_code == 400  # no against


def test_without_a_shared_create_each_run_starts_at_its_first_request(api, runs):
    a, b = runs
    # filtered to gets, neither run has a create: the anchors are each run's first get
    body = _compare(api, a, b, verb="get").json()
    assert body["anchor"]["rule"] == "first-request"
    first_a = next(n for n, s in enumerate(RUN_A) if s[1] == "get")
    first_b = next(n for n, s in enumerate(RUN_B) if s[1] == "get")
    assert (body["anchor"]["a"], body["anchor"]["b"]) == (_ids(a)[first_a], _ids(b)[first_b])
    gets_a = [s for s in RUN_A if s[1] == "get"]
    gets_b = [s for s in RUN_B if s[1] == "get"]
    assert _answered(body["steps"]) == _expected(gets_a, gets_b, 0, 0)


def test_filters_narrow_both_runs(api, runs):
    a, b = runs
    body = _compare(api, a, b, user="kubelet").json()
    # the kubelet created nothing: first-request anchors, one status patch on each side
    assert [(s["verb"], s["subresource"], s["a"]["offset_ms"], s["b"]["offset_ms"])
            for s in body["steps"]] == [("patch", "status", 0.0, 0.0)]
    assert _compare(api, a, b, code="abc").status_code == 400


def test_a_run_of_more_steps_than_the_cap_says_so(api, runs, monkeypatch):
    a, b = runs
    monkeypatch.setattr(compare_views, "MAX_STEPS", 4)
    body = _compare(api, a, b).json()
    assert body["truncated"] == {"a": True, "b": True}
    assert sum(1 for s in body["steps"] if s["a"]) == 4
    assert sum(1 for s in body["steps"] if s["b"]) == 4


def test_both_incidents_must_be_visible(api_as, client, outsider, runs, team, owner):
    a, b = runs
    hidden = Incident.objects.create(title="elsewhere", team=None, created_by=owner)
    client = api_as(owner)
    assert client.get(f"/api/v1/incidents/{a.pk}/compare/",
                      {"against": hidden.pk}).status_code == 404
    assert client.get(f"/api/v1/incidents/{hidden.pk}/compare/",
                      {"against": a.pk}).status_code == 404
    stranger = api_as(outsider)
    assert stranger.get(f"/api/v1/incidents/{a.pk}/compare/",
                        {"against": b.pk}).status_code == 404
    client.force_login(outsider)
    assert client.get(f"/incidents/{a.pk}/compare/", {"against": b.pk}).status_code == 404
    assert api_as(None).get(f"/api/v1/incidents/{a.pk}/compare/",
                            {"against": b.pk}).status_code in (401, 403)


def test_the_figures_share_one_axis_of_milliseconds_from_the_anchors(api, runs):
    a, b = runs
    body = _compare(api, a, b, figures="1").json()
    figures = body["figures"]
    anchor_a = next(n for n, s in enumerate(RUN_A) if s[5] == "cfg")
    anchor_b = next(n for n, s in enumerate(RUN_B) if s[5] == "cfg")
    for side, steps, anchor in (("a", RUN_A, anchor_a), ("b", RUN_B, anchor_b)):
        figure = figures[side]
        assert figure["layout"]["xaxis"]["type"] == "linear"
        starts = sorted(x for trace in figure["data"] if trace["mode"] == "lines"
                        and trace.get("customdata") for x in trace["x"][::3])
        assert starts == pytest.approx(sorted((s[6] - steps[anchor][6]) * 1000 for s in steps))
    low, high = figures["range"]
    offsets = [(s[6] - run[anchor][6]) * 1000 for run, anchor in ((RUN_A, anchor_a),
                                                                  (RUN_B, anchor_b)) for s in run]
    assert low < min(offsets) and high > max(offsets) + 3  # the last request lasts 3 ms


def test_match_steps_pairs_the_nth_occurrences():
    def step(pk, at, verb="get"):
        return Step(pk, at, at + 10, "u", verb, "pods", "", "ns", "p", 200)

    a = [step(1, 1_000), step(2, 2_000), step(3, 3_000)]
    b = [step(11, 5_000), step(12, 9_000)]
    rows = match_steps(a, b, 1_000, 5_000)
    assert [(r["a"] and r["a"]["event"], r["b"] and r["b"]["event"], r["delta_ms"])
            for r in rows] == [(1, 11, 0.0), (2, 12, 3.0), (3, None, None)]
    created = [Step(5, 0, 1, "u", "create", "pods", "", "x", "p", 201)]
    assert default_anchors(created, [Step(6, 0, 1, "v", "create", "pods", "", "y", "p", 201)]
                           ) == (created[0], Step(6, 0, 1, "v", "create", "pods", "", "y", "p",
                                                  201))
    assert default_anchors(created, [Step(6, 0, 1, "v", "create", "pods", "binding", "y", "p",
                                          201)]) is None


def _ink(page, box_id: str):
    """The pixels a Gantt's traces draw (a screenshot with them minus one without), as a mask
    of the page's box, and the page x pixel of an offset: ``x(ms)``."""
    import io

    import numpy as np
    from PIL import Image

    box = page.locator(f"#{box_id}")
    shown = box.screenshot(animations="disabled")
    page.evaluate(f"() => Plotly.restyle(document.getElementById('{box_id}'), {{visible: false}})")
    empty = box.screenshot(animations="disabled")
    page.evaluate(f"() => Plotly.restyle(document.getElementById('{box_id}'), {{visible: true}})")
    before, after = (np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.int16)
                     for png in (shown, empty))
    mask = np.abs(before - after).max(axis=2) > 8
    left = box.bounding_box()["x"]

    def x(ms: float) -> float:
        return left + page.evaluate(f"""(ms) => {{
            const layout = document.getElementById('{box_id}')._fullLayout;
            return layout._size.l + layout.xaxis.l2p(ms); }}""", ms)

    return mask, left, x


@pytest.mark.django_db(transaction=True)
def test_the_compare_page_draws_both_runs_on_one_axis_and_lists_the_steps(open_page, owner,
                                                                        runs):
    a, b = runs
    page = open_page(owner, f"/incidents/{a.pk}/compare/?against={b.pk}")
    for box in ("gantt-a", "gantt-b"):
        page.wait_for_function(f"Number(document.getElementById('{box}').dataset.drawn || 0)"
                               f" >= 1")
    ranges = page.evaluate("""() => ['gantt-a', 'gantt-b'].map(
        id => document.getElementById(id)._fullLayout.xaxis.range)""")
    assert ranges[0] == ranges[1]
    anchor_a = next(n for n, s in enumerate(RUN_A) if s[5] == "cfg")
    anchor_b = next(n for n, s in enumerate(RUN_B) if s[5] == "cfg")
    offsets_a = [(s[6] - RUN_A[anchor_a][6]) * 1000 for s in RUN_A]
    offsets_b = [(s[6] - RUN_B[anchor_b][6]) * 1000 for s in RUN_B]
    ink_a, left_a, x_a = _ink(page, "gantt-a")
    ink_b, left_b, x_b = _ink(page, "gantt-b")
    # the same offset is at the same place on the page in both
    for ms in (0, max(offsets_a), max(offsets_b)):
        assert abs(x_a(ms) - x_b(ms)) < 1
    def inked(mask, left, x_page):  # noqa: E306 - a column near x, any row
        column = round(x_page - left)
        return bool(mask[:, max(column - 3, 0):column + 4].any())
    # every step is drawn at its offset from its run's anchor
    for ms in offsets_a:
        assert inked(ink_a, left_a, x_a(ms)), ms
    for ms in offsets_b:
        assert inked(ink_b, left_b, x_b(ms)), ms
    # run a ends long before run b: nothing of a is drawn where b's last steps are
    assert not inked(ink_a, left_a, x_a(max(offsets_b)))
    # the steps table: the largest change first, highlighted
    expected = _expected(RUN_A, RUN_B, anchor_a, anchor_b)
    both = sorted(((key, x, y) for key, slots in expected.items() for x, y in slots
                   if x is not None and y is not None), key=lambda item: -abs(item[2] - item[1]))
    rows = page.locator("#steps-both tbody tr")
    assert rows.count() == len(both)
    first = rows.nth(0)
    assert float(first.locator("td.delta").text_content()) == pytest.approx(
        both[0][2] - both[0][1])
    assert "changed" in first.get_attribute("class")
    only_a = sum(1 for slots in expected.values() for x, y in slots if y is None)
    only_b = sum(1 for slots in expected.values() for x, y in slots if x is None)
    assert page.locator("#steps-only-a tbody tr").count() == only_a
    assert page.locator("#steps-only-b tbody tr").count() == only_b
    assert "the first create of an object name both runs share" in page.text_content("#anchors")


def test_a_large_answer_goes_gzipped_to_a_client_that_accepts_it(client, owner, runs,
                                                                  monkeypatch):
    import gzip

    a, b = runs
    client.force_login(owner)
    url = f"/api/v1/incidents/{a.pk}/compare/"
    plain = client.get(url, {"against": b.pk, "figures": "1"})
    monkeypatch.setattr(compare_views, "GZIP_MIN_BYTES", 1)
    packed = client.get(url, {"against": b.pk, "figures": "1"}, HTTP_ACCEPT_ENCODING="gzip")
    assert packed["Content-Encoding"] == "gzip"
    assert json.loads(gzip.decompress(packed.content)) == plain.json()


def test_the_page_offers_only_the_incidents_the_user_sees(client, owner, runs):
    a, b = runs
    hidden = Incident.objects.create(title="not theirs", team=None, created_by=owner)
    client.force_login(owner)
    page = client.get(f"/incidents/{a.pk}/compare/")
    assert page.status_code == 200
    offered = [other["pk"] for other in page.context["others"]]
    assert offered == [b.pk]  # not a itself, not the hidden one
    assert hidden.pk not in offered
    chosen = client.get(f"/incidents/{a.pk}/compare/", {"against": b.pk})
    assert f'<option value="{b.pk}" selected>' in chosen.content.decode()


def test_the_default_anchor_prefers_the_same_object_then_the_same_name(api, tmp_path, team,
                                                                        owner, incident,
                                                                        ingest_file):
    # a creates x then y in "one"; b creates x in "two" (the same name only), then y in "one"
    run_a = [("t", "create", "configmaps", "", "one", "x", 0.0, 201),
             ("t", "create", "configmaps", "", "one", "y", 1.0, 201)]
    run_b = [("t", "create", "configmaps", "", "two", "x", 0.0, 201),
             ("t", "create", "configmaps", "", "one", "y", 5.0, 201)]
    elsewhere = [("t", "create", "configmaps", "", "two", "x", 0.0, 201),
                 ("t", "create", "configmaps", "", "two", "y", 5.0, 201)]
    incidents = [incident]
    for name, steps in (("b", run_b), ("c", elsewhere)):
        incidents.append(Incident.objects.create(title=name, team=team, created_by=owner))
        _write_run(tmp_path / f"{name}.log", START_B, steps)
        assert ingest_file(incidents[-1], tmp_path / f"{name}.log").status == "done"
    _write_run(tmp_path / "a.log", START_A, run_a)
    assert ingest_file(incident, tmp_path / "a.log").status == "done"
    a, b, c = incidents
    same_object = _compare(api, a, b).json()["anchor"]
    assert (same_object["a"], same_object["b"]) == (_ids(a)[1], _ids(b)[1])  # y, in "one"
    same_name = _compare(api, a, c).json()["anchor"]
    assert (same_name["a"], same_name["b"]) == (_ids(a)[0], _ids(c)[0])  # x, by name
    assert same_name["rule"] == "first-shared-create"
