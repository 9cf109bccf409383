"""The incident page in a real browser (Debian Chromium through Playwright).

The interactive timeline is driven the way a person uses it: typing filters, dragging across the
plot, clicking a bar, pressing j/k, finding text, diffing two versions of an object and opening
a copied link in a fresh browser. Expected events are read from the fixture files with ``json``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from hindsight.testing import page_query, wait_for_detail, write_audit_log
from timelines.figures.build import hover_texts
from timelines.models import Event

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_gantt_draws_the_fixture_incident(open_page, owner, incident, ingest_file, demo_log):
    upload = ingest_file(incident, demo_log)
    assert upload.status == "done"
    page = open_page(owner, f"/incidents/{incident.pk}/")
    page.wait_for_selector("#gantt .main-svg")
    page.wait_for_function(
        "document.getElementById('gantt-status').textContent.includes('events on')")
    status = page.text_content("#gantt-status")
    assert f"{upload.event_count} events on" in status
    # WebGL drew the bars: the gl canvas exists and has a non-zero size
    size = page.evaluate("""() => { const c = document.querySelector('#gantt canvas');
                                    return c ? c.width * c.height : 0; }""")
    assert size > 0


def _by_file(falco: list[dict], name: str) -> dict:
    return next(r for r in falco if r["file"] == name)


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


# --- page helpers -------------------------------------------------------------------------------

def _drawn(page, at_least: int = 1) -> None:
    page.wait_for_function(
        f"Number(document.getElementById('gantt').dataset.drawn || 0) >= {at_least}")


def _draws(page) -> int:
    return int(page.get_attribute("#gantt", "data-drawn") or 0)


def _table_ids(page) -> list[int]:
    return page.eval_on_selector_all("#events-table tr[data-event]",
                                     "rows => rows.map(r => Number(r.dataset.event))")


def _highlight_at(page) -> str | None:
    """Where the selection line is drawn on the plot (its x, as plotly holds it)."""
    return page.evaluate("""() => {
        const shapes = (document.getElementById('gantt').layout || {}).shapes || [];
        const line = shapes.find(s => s.name === 'selected');
        return line ? line.x0 : null; }""")


def _same_instant(plotly_time: str, expected: datetime) -> bool:
    return abs(_time(plotly_time.replace(" ", "T") + "Z") - expected) < timedelta(milliseconds=1)


def _point(page, event_id: int, *, end: bool = False) -> dict:
    """Viewport coordinates of an event's bar start (or end) on the plot."""
    return page.evaluate("""([id, end]) => {
        const gd = document.getElementById('gantt');
        gd.scrollIntoView({block: 'start'});
        const full = gd._fullLayout, box = gd.getBoundingClientRect();
        for (const trace of gd.data) {
            const start = (trace.customdata || []).indexOf(id);
            if (start < 0) continue;
            const i = end ? start + 1 : start;  // a bar's points: start, end, gap
            return {x: box.left + full._size.l + full.xaxis.d2p(trace.x[i]),
                    y: box.top + full._size.t + full.yaxis.l2p(trace.y[i])};
        }
        return null; }""", [event_id, end])


def _x_of(page, when: datetime) -> float:
    """Viewport x of a time on the plot."""
    stamp = when.strftime("%Y-%m-%d %H:%M:%S.%f")
    return page.evaluate("""(t) => {
        const gd = document.getElementById('gantt'), full = gd._fullLayout;
        return gd.getBoundingClientRect().left + full._size.l + full.xaxis.d2p(t); }""", stamp)


def _drag_window(page, start: datetime, end: datetime) -> None:
    """Drag across the plot from ``start`` to ``end``, as a person brushes a time window."""
    page.evaluate("document.getElementById('gantt').scrollIntoView({block: 'start'})")
    area = page.locator("#gantt .nsewdrag").first.bounding_box()
    y = area["y"] + area["height"] / 2
    before = _draws(page)
    left, right = area["x"] + 1, area["x"] + area["width"] - 1  # a drag starts on the plot
    page.mouse.move(max(left, _x_of(page, start)), y)
    page.mouse.down()
    page.mouse.move(min(right, _x_of(page, end)), y, steps=12)
    page.mouse.up()
    _drawn(page, before + 1)


def _window(page) -> tuple[datetime, datetime]:
    query = page_query(page)
    return _time(query["since"][0]), _time(query["until"][0])


# --- filters, window ----------------------------------------------------------------------------

def test_the_filter_form_filters_the_gantt_and_the_table(open_page, owner, incident, falco):
    expected = [r["id"] for r in falco if r["resource"] == "clusterroles"]
    page = open_page(owner, f"/incidents/{incident.pk}/")
    _drawn(page)
    assert sorted(_table_ids(page)) == sorted(r["id"] for r in falco)

    page.fill("#filters input[name=resource]", "clusterroles")
    page.click("#filters button")
    page.wait_for_url("**resource=clusterroles**")
    _drawn(page)

    assert _table_ids(page) == expected
    assert f"{len(expected)} events on" in page.text_content("#gantt-status")
    assert page_query(page)["resource"] == ["clusterroles"]
    assert "since" not in page_query(page)  # empty inputs stay out of the URL
    for link in ("#export-csv", "#export-json"):
        assert "resource=clusterroles" in page.get_attribute(link, "href")


def test_free_text_filter_matches_uri_and_name(open_page, owner, incident, falco):
    expected = [r["id"] for r in falco
                if "some-reader" in r["uri"].lower() or "some-reader" in r["name"].lower()]
    page = open_page(owner, f"/incidents/{incident.pk}/?q=SOME-reader")
    _drawn(page)

    assert _table_ids(page) == expected
    assert page.input_value("#filters input[name=q]") == "SOME-reader"


def test_dragging_across_the_gantt_sets_the_window(open_page, owner, incident, falco):
    first = _by_file(falco, "create_clusterrole.json")["received"]
    last = _by_file(falco, "create_cluster_role_write_privileges.json")["received"]
    page = open_page(owner, f"/incidents/{incident.pk}/")
    _drawn(page)

    _drag_window(page, first - timedelta(seconds=30), last + timedelta(seconds=30))

    since, until = _window(page)
    assert since < first and last < until < last + timedelta(minutes=2)
    inside = [r["id"] for r in falco if since <= r["received"] <= until]
    assert 0 < len(inside) < len(falco)
    page.wait_for_function(f"document.querySelectorAll('#events-table tr[data-event]').length"
                           f" === {len(inside)}")
    assert _table_ids(page) == inside  # the table follows the window
    assert f"{len(inside)} events on" in page.text_content("#gantt-status")
    shown = page.evaluate("document.getElementById('gantt').layout.xaxis.range")
    assert _same_instant(shown[0], since) and _same_instant(shown[1], until)
    assert page.input_value("#filters input[name=since]") == page_query(page)["since"][0]
    assert "since=" in page.get_attribute("#export-json", "href")

    before = _draws(page)
    page.click("#window-reset")
    _drawn(page, before + 1)
    assert "since" not in page_query(page) and "until" not in page_query(page)
    page.wait_for_function(f"document.querySelectorAll('#events-table tr[data-event]').length"
                           f" === {len(falco)}")

    _drag_window(page, first, last)
    area = page.locator("#gantt .nsewdrag").first.bounding_box()
    before = _draws(page)
    page.mouse.dblclick(area["x"] + 2, area["y"] + 2)  # a double click resets it too
    _drawn(page, before + 1)
    assert "since" not in page_query(page) and "until" not in page_query(page)


# --- selecting events ---------------------------------------------------------------------------

def test_clicking_a_bar_opens_the_event_in_the_page(open_page, owner, incident, falco):
    target = _by_file(falco, "create_configmap_no_sensitive_values.json")
    page = open_page(owner, f"/incidents/{incident.pk}/?resource=configmaps")
    _drawn(page)
    pages_before = len(page.context.pages)

    point = _point(page, target["id"])
    page.mouse.move(point["x"], point["y"])
    page.mouse.click(point["x"], point["y"])

    wait_for_detail(page, target["id"])
    assert len(page.context.pages) == pages_before  # no new window
    assert page_query(page)["event"] == [str(target["id"])]
    assert page.text_content("#detail-fields dd[data-field=audit_id]") == target["audit_id"]
    assert page.text_content("#detail-fields dd[data-field=verb]") == "create"
    raw = json.loads(page.text_content("#detail-body"))
    assert raw["auditID"] == target["audit_id"] and raw["requestURI"] == target["uri"]
    assert _same_instant(_highlight_at(page), target["received"])
    history = page.get_attribute("#link-object", "href")
    assert "resource=configmaps" in history and "name=my-config" in history
    assert "source=create_configmap_no_sensitive_values.json" in page.get_attribute(
        "#link-source", "href")


def test_a_bar_shows_its_hover_text_at_either_end(open_page, owner, incident, falco):
    """The figure carries a bar's text as numbers into a table of strings; the page joins them
    exactly as ``figures.build.hover_texts`` says, and shows the text at either end of the bar (a
    short bar is two pixels wide: the pointer is as often nearer its end)."""
    target = _by_file(falco, "create_configmap_no_sensitive_values.json")
    page = open_page(owner, f"/incidents/{incident.pk}/?resource=configmaps&lanes=actor")
    _drawn(page)
    clock = target["received"].strftime("%H:%M:%S.%f")
    figure, drawn = page.evaluate("""async () => {
        const gd = document.getElementById('gantt');
        const answer = await fetch(gd.dataset.figureUrl + '?resource=configmaps&lanes=actor');
        return [await answer.json(), gd.data.map(t => t.text)];
    }""")
    assert any("labels" in t for t in figure["data"])
    assert drawn[:len(figure["data"])] == hover_texts(figure)

    shown = []
    for end in (False, True):
        point = _point(page, target["id"], end=end)
        page.mouse.move(point["x"], point["y"])
        page.wait_for_function("""(clock) => [...document.querySelectorAll(
            '#gantt .hoverlayer .hovertext')].some(h => h.textContent.includes(clock))""",
                               arg=clock)
        shown.append(page.text_content("#gantt .hoverlayer .hovertext"))
        page.mouse.move(5, 5)  # off the plot: the label goes
        page.wait_for_selector("#gantt .hoverlayer .hovertext", state="detached")

    assert shown[0] == shown[1]
    assert shown[0].startswith(f"{clock} audit create ") and "configmaps" in shown[0]

    # object lanes: lifespans (texts of their own) and mutation markers (joined) as well
    page = open_page(owner, f"/incidents/{incident.pk}/?lanes=object")
    _drawn(page)
    figure, drawn = page.evaluate("""async () => {
        const gd = document.getElementById('gantt');
        const answer = await fetch(gd.dataset.figureUrl + '?lanes=object');
        return [await answer.json(), gd.data.map(t => t.text)];
    }""")
    forms = {t.get("labels", {}).get("form") for t in figure["data"]}
    assert {"bar", "marker", None} <= forms  # None: the lifespans
    assert drawn[:len(figure["data"])] == hover_texts(figure)


def test_j_and_k_step_through_the_filtered_events(open_page, owner, incident, falco):
    pods = [r for r in falco if r["resource"] == "pods"]
    page = open_page(owner, f"/incidents/{incident.pk}/?resource=pods")
    _drawn(page)

    page.keyboard.press("j")
    wait_for_detail(page, pods[0]["id"])
    page.keyboard.press("j")
    wait_for_detail(page, pods[1]["id"])
    page.keyboard.press("ArrowDown")
    wait_for_detail(page, pods[2]["id"])
    page.keyboard.press("k")
    wait_for_detail(page, pods[1]["id"])

    page.wait_for_function(
        f"document.getElementById('gantt').dataset.selected === '{pods[1]['id']}'")
    assert _same_instant(_highlight_at(page), pods[1]["received"])
    assert page.get_attribute(f"#events-table tr[data-event='{pods[1]['id']}']",
                              "class").endswith("selected")
    page.keyboard.press("Escape")
    page.wait_for_selector("#detail", state="hidden")
    assert "event" not in page_query(page)


def test_stepping_past_the_window_pans_it(open_page, owner, incident, falco):
    roles = [r for r in falco if r["resource"] == "clusterroles"]
    start = roles[0]["received"]
    page = open_page(owner, f"/incidents/{incident.pk}/?resource=clusterroles")
    _drawn(page)
    _drag_window(page, start - timedelta(minutes=1), start + timedelta(minutes=3))
    since, until = _window(page)
    inside = [r for r in roles if since <= r["received"] <= until]
    outside = next(r for r in roles if r["received"] > until)
    old_since = page_query(page)["since"][0]

    for request in inside:
        page.keyboard.press("j")
        wait_for_detail(page, request["id"])
    page.keyboard.press("j")
    wait_for_detail(page, outside["id"])

    page.wait_for_function("(old) => new URLSearchParams(location.search).get('since') !== old",
                           arg=old_since)
    new_since, new_until = _window(page)
    assert new_since <= outside["received"] <= new_until
    assert abs((new_until - new_since) - (until - since)) < timedelta(milliseconds=5)
    page.wait_for_selector(f"#events-table tr[data-event='{outside['id']}'].selected")


def test_find_next_selects_the_next_match_in_time_order(open_page, owner, incident, falco):
    matches = [r for r in falco if "reader-binding" in r["uri"] or "reader-binding" in r["name"]]
    assert len(matches) >= 3
    page = open_page(owner, f"/incidents/{incident.pk}/")
    _drawn(page)

    page.fill("#find", "Reader-Binding")
    page.press("#find", "Enter")
    wait_for_detail(page, matches[0]["id"])
    page.press("#find", "Enter")
    wait_for_detail(page, matches[1]["id"])
    page.click("#find-next")
    wait_for_detail(page, matches[2]["id"])
    page.press("#find", "Shift+Enter")
    wait_for_detail(page, matches[1]["id"])
    for _ in matches[1:]:  # to the last match, and once more
        page.press("#find", "Enter")
    page.wait_for_function("document.getElementById('view-status').textContent"
                           ".includes('No further event')")
    wait_for_detail(page, matches[-1]["id"])


# --- object versions ------------------------------------------------------------------------------

def test_two_versions_of_an_object_diff_in_the_panel(open_page, owner, incident, falco):
    created = _by_file(falco, "create_clusterrole.json")
    widened = _by_file(falco, "create_cluster_role_wildcard_verbs.json")
    deleted = _by_file(falco, "delete_clusterrole.json")
    versions = [r["id"] for r in falco if r["resource"] == "clusterroles"
                and r["name"] == "some-reader"]
    page = open_page(owner, f"/incidents/{incident.pk}/?event={widened['id']}")
    wait_for_detail(page, widened["id"])

    page.wait_for_selector("#versions-table tbody tr")
    assert page.eval_on_selector_all("#versions-table tbody tr",
                                     "rows => rows.map(r => Number(r.dataset.event))") == versions
    page.click(f"#versions-table button[data-against='{created['id']}']")

    page.wait_for_selector("#diff-table tbody tr")
    rows = page.eval_on_selector_all(
        "#diff-table tbody tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent))")
    assert ["rules.0.verbs.0", "get", "*"] in rows
    assert ["rules.0.verbs.1", "list", "—"] in rows
    assert "metadata.resourceVersion" not in [row[0] for row in rows]
    assert str(created["id"]) in page.text_content("#diff-title").split(" to ")[0]
    folded = page.text_content("#diff-folded")
    assert "bookkeeping change" in folded and "folded" in folded

    page.click("#diff-fold-toggle")
    page.wait_for_function("[...document.querySelectorAll('#diff-table tbody tr td:first-child')]"
                           ".some(c => c.textContent === 'metadata.resourceVersion')")

    # the delete answered with a Status, not the object: the reason shows, not an empty table
    page.click(f"#versions-table button[data-against='{deleted['id']}']")
    page.wait_for_selector("#diff-reason:not([hidden])")
    assert "no whole object" in page.text_content("#diff-reason")
    assert page.is_hidden("#diff-table")


# --- permalinks, layout ---------------------------------------------------------------------------

def test_a_copied_link_restores_the_view_in_a_fresh_browser(open_page, owner, teammate, incident,
                                                          falco):
    page = open_page(owner, f"/incidents/{incident.pk}/?resource=clusterroles"
                            f"&resource=clusterrolebindings&lanes=actor&colour=outcome")
    _drawn(page)
    start = _by_file(falco, "create_clusterrole.json")["received"]
    _drag_window(page, start - timedelta(seconds=5), start + timedelta(minutes=2))
    since, until = _window(page)
    rbac = [r for r in falco if r["resource"] in ("clusterroles", "clusterrolebindings")]
    first = next(n for n, r in enumerate(rbac) if since <= r["received"] <= until)
    chosen = rbac[first + 1]  # j: the first in the window, j: the next in the filters
    page.keyboard.press("j")
    page.keyboard.press("j")
    wait_for_detail(page, chosen["id"])
    page.click("#copy-link")
    page.wait_for_function("document.getElementById('view-status').textContent.includes('link')"
                           " || document.getElementById('view-status').textContent"
                           ".includes('Link')")
    link = page.url
    window = _window(page)
    rows = _table_ids(page)
    assert len(rows) >= 2

    again = open_page(teammate, link[link.index("/incidents/"):])
    _drawn(again)
    wait_for_detail(again, chosen["id"])

    assert page_query(again) == page_query(page)
    assert again.eval_on_selector_all("#filters input[name=resource]",
                                      "inputs => inputs.map(i => i.value)") == [
        "clusterroles", "clusterrolebindings"]
    assert again.input_value("#filters select[name=lanes]") == "actor"
    assert again.input_value("#filters select[name=colour]") == "outcome"
    shown = again.evaluate("document.getElementById('gantt').layout.xaxis.range")
    assert _same_instant(shown[0], window[0]) and _same_instant(shown[1], window[1])
    again.wait_for_function(
        f"document.getElementById('gantt').dataset.selected === '{chosen['id']}'")
    assert _same_instant(_highlight_at(again), chosen["received"])
    assert _table_ids(again) == rows


def test_the_events_table_scrolls_inside_its_card_on_a_narrow_screen(open_page, owner, incident,
                                                                     falco):
    page = open_page(owner, f"/incidents/{incident.pk}/")
    page.set_viewport_size({"width": 480, "height": 900})
    _drawn(page)

    sizes = page.evaluate("""() => {
        const card = document.getElementById('events');
        const scroller = card.querySelector('.scroll-x');
        return {card: card.getBoundingClientRect().right,
                page: document.documentElement.clientWidth,
                scrollable: scroller.scrollWidth > scroller.clientWidth,
                table: scroller.querySelector('table').getBoundingClientRect().width}; }""")
    assert sizes["card"] <= sizes["page"]
    assert sizes["scrollable"] and sizes["table"] > sizes["page"]


def test_a_large_incident_draws_a_heatmap_until_a_window_is_narrow(open_page, owner, incident,
                                                                   ingest_file, tmp_path):
    # volume by cloning one request: new auditIDs, shifted timestamps, thirty pods
    start = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)
    step = timedelta(milliseconds=180)
    path = tmp_path / "cloned-20050-requests.log"
    write_audit_log(path, start, [n * step for n in range(20_050)])
    assert ingest_file(incident, path).status == "done"
    page = open_page(owner, f"/incidents/{incident.pk}/")
    _drawn(page)

    assert page.get_attribute("#gantt", "data-mode") == "heatmap"
    assert "20050 events: counts per lane" in page.text_content("#gantt-status")
    page.keyboard.press("j")  # stepping works without bars: the line marks the time
    first = Event.objects.filter(incident=incident).order_by("received", "id").first()
    wait_for_detail(page, first.pk)
    assert _same_instant(_highlight_at(page), start)

    _drag_window(page, start + timedelta(minutes=20), start + timedelta(minutes=24))

    since, until = _window(page)
    inside = sum(1 for n in range(20_050) if since <= start + n * step <= until)
    assert 0 < inside <= 20_000
    assert page.get_attribute("#gantt", "data-mode") == "gantt"
    assert f"{inside} events on 30 lanes" in page.text_content("#gantt-status")



def test_the_events_tables_last_columns_are_in_reach(open_page, owner, incident):
    """A hundred rows of a bundle's long paths: the table scrolls in a box whose horizontal
    scroll bar is in view with the table's top, scrolled right it shows the Source column
    beside the Message, and a source shows its file's end, whole in its tooltip."""
    start = datetime(2024, 3, 1, 12, tzinfo=UTC)
    long = ("must-gather.local.5165939006394467466/quay-io-openshift-release-dev-ocp-v4-0-"
            "art-dev-sha256-6f0b3c2a/namespaces/openshift-ingress-operator/pods/"
            "ingress-operator-7b85cd998b-f4lj9/ingress-operator/ingress-operator/logs/current.log")
    Event.objects.bulk_create([
        Event(incident=incident, kind="log", audit_id=f"log:{n}", received=start
              + timedelta(seconds=n), completed=start + timedelta(seconds=n),
              component="ingress-operator", severity="error", resource="pods",
              namespace="openshift-ingress-operator", name="ingress-operator-7b85cd998b-f4lj9",
              message=f"failed to reconcile {n}: " + "x" * 120, source=long, line=n + 1)
        for n in range(150)])
    page = open_page(owner, f"/incidents/{incident.pk}/")
    box = page.locator("#events-table .events-box")
    box.scroll_into_view_if_needed()
    page.evaluate("() => document.querySelector('#events-table').scrollIntoView()")
    top = page.evaluate("() => document.querySelector('#events-table').getBoundingClientRect()"
                        ".top")
    bounds = box.bounding_box()
    viewport = page.viewport_size
    assert bounds["y"] + bounds["height"] <= viewport["height"] + 1, (top, bounds)
    assert page.evaluate("(b) => b.scrollWidth > b.clientWidth", box.element_handle())
    box.evaluate("(b) => { b.scrollLeft = b.scrollWidth; }")
    heads = page.locator("#events-table")
    source = heads.get_by_role("columnheader", name="Source", exact=True).bounding_box()
    message = heads.get_by_role("columnheader", name="Message", exact=True).bounding_box()
    assert 0 <= source["x"] and source["x"] + source["width"] <= viewport["width"]
    assert message["x"] + message["width"] > 0  # the Message beside it
    # a long word wraps in its cell instead of running over the Source
    assert page.locator("#events-table td.msg").first.evaluate(
        "(td) => td.scrollWidth <= td.clientWidth + 1")
    cell = page.locator("#events-table td.src").first
    assert cell.inner_text().startswith("…/logs/current.log:")
    assert cell.get_attribute("title") == f"{long}:1"
    assert cell.bounding_box()["width"] <= 22 * 16 + 20
