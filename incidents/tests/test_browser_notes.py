"""Annotations, root-cause sequences and share links on the incident page, in a real browser
(Debian Chromium through Playwright), driven the way a person uses them: selecting events on
the timeline, typing notes, pressing buttons, opening a share link in a fresh browser. Expected
times come from the database rows of the ingested fixture, expected text from its facts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import pytest
from django.test import Client
from django.utils import timezone

from hindsight.testing import page_query, wait_for_detail
from incidents.models import Incident
from incidents.notes import Annotation, Sequence, format_delta, format_duration, format_time
from incidents.sharing import ShareLink
from timelines.models import Event

pytestmark = pytest.mark.django_db(transaction=True)


# --- page helpers -------------------------------------------------------------------------------

def _drawn(page, at_least: int = 1) -> None:
    page.wait_for_function(
        f"Number(document.getElementById('gantt').dataset.drawn || 0) >= {at_least}")


def _select_row(page, event_id: int) -> None:
    """Click the event's row in the events table, as a person picks an event."""
    page.click(f"#events-table tr[data-event='{event_id}'] td:nth-child(2)")
    wait_for_detail(page, event_id)


def _markers(page, prefix: str) -> list[dict]:
    """The plot's layout annotations (markers) whose name starts with ``prefix``, with the lane
    the timeline has for their event."""
    return page.evaluate("""(prefix) => {
        const gd = document.getElementById('gantt');
        return (gd.layout.annotations || []).filter(a => (a.name || '').startsWith(prefix))
            .map(a => ({name: a.name, text: a.text, x: a.x, y: a.y, yref: a.yref})); }""", prefix)


def _lane(page, event_id: int):
    return page.evaluate("(id) => window.HindsightTimeline.laneOf(id)", event_id)


def _same_instant(plotly_time: str, expected: datetime) -> bool:
    shown = datetime.fromisoformat(plotly_time.replace(" ", "T") + "+00:00")
    return abs(shown - expected) < timedelta(milliseconds=1)


def _texts(page, selector: str) -> list[str]:
    return page.eval_on_selector_all(selector, "nodes => nodes.map(n => n.textContent.trim())")


def _wait_count(page, selector: str, count: int) -> None:
    page.wait_for_function(f"document.querySelectorAll({selector!r}).length === {count}")


@pytest.fixture
def events(incident, ingest_file, demo_log) -> list[Event]:
    """The demo log's requests (37, one second apart or more), in time order."""
    assert ingest_file(incident, demo_log).status == "done"
    rows = list(Event.objects.filter(incident=incident).order_by("received", "id"))
    assert len(rows) == 37
    return rows


def _distinct_times(events: list[Event], count: int) -> list[Event]:
    """``count`` events on objects (so on a lane of their own), each later than the last."""
    chosen: list[Event] = []
    for event in events:
        if event.resource and (not chosen or event.received > chosen[-1].received):
            chosen.append(event)
    assert len(chosen) >= count
    return chosen[:count]


# --- annotations --------------------------------------------------------------------------------

def test_an_owner_annotates_an_event_and_a_window_and_filters_them(open_page, owner, incident,
                                                                    events):
    target = _distinct_times(events, 1)[0]
    page = open_page(owner, f"/incidents/{incident.pk}/?event={target.pk}")
    _drawn(page)
    wait_for_detail(page, target.pk)

    page.click("#detail-annotate")  # "Annotate this event" in the detail panel
    assert f"On event {target.pk}" in page.text_content("#annotation-target")
    page.fill("#annotation-form textarea[name=note]",
              "**Bob** is refused here <img src=x onerror=alert(1)>\n\nsee the RBAC change")
    page.fill("#annotation-form input[name=tags]", "RBAC, root-cause, <b>odd</b>")
    page.check("#annotation-form input[name=starred]")
    page.click("#annotation-save")

    page.wait_for_selector("#annotation-list li[data-annotation]")
    note = Annotation.objects.get(incident=incident)
    assert (note.event_id, note.start, note.author) == (target.pk, target.received, owner)
    assert note.tags == ["rbac", "root-cause", "<b>odd</b>"] and note.starred
    entry = f"#annotation-list li[data-annotation='{note.pk}']"
    assert page.text_content(f"{entry} .note-body strong") == "Bob"
    assert page.query_selector(f"{entry} .note-body img[onerror]") is None
    assert _texts(page, f"{entry} .tags button") == ["rbac", "root-cause", "<b>odd</b>"]
    assert page.query_selector(f"{entry} .tags b") is None  # a tag is text, never markup
    assert "owner" in page.text_content(f"{entry} .note-head")

    # the marker sits on the event's lane, at its time
    page.wait_for_function("(id) => (document.getElementById('gantt').layout.annotations || [])"
                           ".some(a => a.name === 'note:' + id)", arg=note.pk)
    [marker] = _markers(page, "note:")
    assert marker["yref"] == "y" and marker["y"] == _lane(page, target.pk) is not None
    assert _same_instant(marker["x"], target.received)

    # a time range: the window in the URL, annotated as such, drawn as a band
    since, until = events[5].received, events[12].received
    page.goto(page.url.split("?")[0] + f"?since={format_time(since)}&until={format_time(until)}")
    _drawn(page)
    page.click("#annotate-window")
    page.fill("#annotation-form textarea[name=note]", "the quiet minutes")
    page.fill("#annotation-form input[name=tags]", "timeline")
    page.click("#annotation-save")
    _wait_count(page, "#annotation-list li[data-annotation]", 2)
    band = Annotation.objects.exclude(pk=note.pk).get()
    assert (band.event_id, band.start, band.end) == (None, since, until)
    page.wait_for_function("(id) => (document.getElementById('gantt').layout.shapes || [])"
                           ".some(s => s.name === 'note:' + id && s.type === 'rect')",
                           arg=band.pk)

    # filters: a tag (typed, or clicked on an entry), starred only, text
    page.fill("#annotation-filter input[name=tag]", "RBAC")
    _wait_count(page, "#annotation-list li[data-annotation]", 1)
    assert page.get_attribute("#annotation-list li[data-annotation]", "data-annotation") == str(
        note.pk)
    page.fill("#annotation-filter input[name=tag]", "")
    _wait_count(page, "#annotation-list li[data-annotation]", 2)
    page.click(f"#annotation-list li[data-annotation='{band.pk}'] button.tag")
    _wait_count(page, "#annotation-list li[data-annotation]", 1)
    assert page.input_value("#annotation-filter input[name=tag]") == "timeline"
    page.fill("#annotation-filter input[name=tag]", "")
    page.check("#annotation-filter input[name=starred]")
    page.wait_for_selector(f"#annotation-list li[data-annotation='{band.pk}']", state="detached")
    _wait_count(page, "#annotation-list li[data-annotation]", 1)
    page.uncheck("#annotation-filter input[name=starred]")
    page.fill("#annotation-filter input[name=q]", "quiet")
    page.wait_for_selector(f"#annotation-list li[data-annotation='{note.pk}']", state="detached")
    page.fill("#annotation-filter input[name=q]", "")
    _wait_count(page, "#annotation-list li[data-annotation]", 2)

    # clicking an entry selects its event, or zooms to its range
    page.click(f"#annotation-list li[data-annotation='{note.pk}'] .note-when")
    wait_for_detail(page, target.pk)
    page.click(f"#annotation-list li[data-annotation='{band.pk}'] .note-when")
    page.wait_for_function("(t) => new URLSearchParams(location.search).get('until') === t",
                           arg=format_time(until).replace("Z", ".000Z"))
    assert page_query(page)["since"] == [format_time(since).replace("Z", ".000Z")]

    # edit and delete (the delete button asks once more)
    page.click(f"#annotation-list li[data-annotation='{band.pk}'] button.edit")
    assert page.input_value("#annotation-form textarea[name=note]") == "the quiet minutes"
    page.fill("#annotation-form textarea[name=note]", "the *quiet* minutes")
    page.click("#annotation-save")
    page.wait_for_selector(f"#annotation-list li[data-annotation='{band.pk}'] .note-body em")
    band.refresh_from_db()
    assert band.note == "the *quiet* minutes" and band.end == until
    page.click(f"#annotation-list li[data-annotation='{band.pk}'] button.delete")
    assert Annotation.objects.filter(pk=band.pk).exists()
    page.click(f"#annotation-list li[data-annotation='{band.pk}'] button.delete")
    page.wait_for_selector(f"#annotation-list li[data-annotation='{band.pk}']", state="detached")
    assert not Annotation.objects.filter(pk=band.pk).exists()


# --- sequences ----------------------------------------------------------------------------------

def _step_events(sequence_id: int) -> list[int]:
    return list(Sequence.objects.get(pk=sequence_id).steps.values_list("event_id", flat=True))


def test_an_owner_builds_reorders_and_exports_a_sequence(open_page, owner, incident, events,
                                                         live_server):
    first, second, third, fourth = _distinct_times(events, 4)
    page = open_page(owner, f"/incidents/{incident.pk}/")
    _drawn(page)

    page.fill("#sequence-new input[name=title]", "Why bob was refused")
    page.click("#sequence-new button")
    page.wait_for_selector("#sequence-view:not([hidden])")
    sequence = Sequence.objects.get(incident=incident)
    assert page_query(page)["sequence"] == [str(sequence.pk)]
    assert page.input_value("#sequence-select") == str(sequence.pk)

    for n, (event, note) in enumerate([(first, "bob lists pods"), (second, "still refused"),
                                       (third, "")], start=1):
        _select_row(page, event.pk)
        page.fill("#step-form input[name=note]", note)
        page.click("#step-add")
        _wait_count(page, "#sequence-steps li.step", n)
    assert _step_events(sequence.pk) == [first.pk, second.pk, third.pk]

    def deltas(*chosen: Event) -> list[str]:
        return ["start"] + [format_delta((b.received - a.received) / timedelta(milliseconds=1))
                            for a, b in zip(chosen, chosen[1:], strict=False)]

    def offsets(*chosen: Event) -> list[str]:
        return [("T+" + format_duration((e.received - chosen[0].received)
                                        / timedelta(milliseconds=1))) if e != chosen[0]
                else "T+0" for e in chosen]

    assert _texts(page, "#sequence-steps .step-no") == ["1", "2", "3"]
    assert _texts(page, "#sequence-steps .step-delta") == deltas(first, second, third)
    assert _texts(page, "#sequence-steps .step-offset") == offsets(first, second, third)
    assert _texts(page, "#sequence-steps .step-note") == ["bob lists pods", "still refused", ""]
    assert "system:admin as bob LISTs pods" in _texts(page, "#sequence-steps .step-desc")[0]

    # numbered markers on each event's lane, at its time
    page.wait_for_function("(document.getElementById('gantt').layout.annotations || [])"
                           ".filter(a => (a.name || '').startsWith('step:')).length === 3")
    markers = sorted(_markers(page, "step:"), key=lambda m: m["text"])
    for marker, event in zip(markers, (first, second, third), strict=True):
        assert marker["yref"] == "y" and marker["y"] == _lane(page, event.pk)
        assert _same_instant(marker["x"], event.received)
    assert [m["text"] for m in markers] == ["1", "2", "3"]
    # a click on a marker selects its step's event
    index = page.evaluate("""() => document.getElementById('gantt').layout.annotations
        .findIndex(a => (a.name || '').startsWith('step:') && a.text === '3')""")
    page.click(f"#gantt g.annotation[data-index='{index}']")
    wait_for_detail(page, third.pk)

    # reorder: the first step down; deltas follow the new order (one is negative)
    page.click("#sequence-steps li.step:nth-child(1) button.down")
    page.wait_for_function("document.querySelector('#sequence-steps li.step .step-note')"
                           "?.textContent === 'still refused'")
    assert _step_events(sequence.pk) == [second.pk, first.pk, third.pk]
    assert _texts(page, "#sequence-steps .step-delta") == deltas(second, first, third)
    assert _texts(page, "#sequence-steps .step-delta")[1].startswith("\u2212")

    # remove the last step (asks once more)
    page.click("#sequence-steps li.step:nth-child(3) button.remove")
    page.click("#sequence-steps li.step:nth-child(3) button.remove")
    _wait_count(page, "#sequence-steps li.step", 2)
    assert _step_events(sequence.pk) == [second.pk, first.pk]

    # choose step 1 (selects its event), then insert another event after it
    page.click("#sequence-steps li.step:nth-child(1) .step-time")
    wait_for_detail(page, second.pk)
    _select_row(page, fourth.pk)
    page.select_option("#step-form select[name=where]", "after")
    page.fill("#step-form input[name=note]", "and then")
    page.click("#step-add")
    _wait_count(page, "#sequence-steps li.step", 3)
    assert _step_events(sequence.pk) == [second.pk, fourth.pk, first.pk]

    # edit a note
    page.click("#sequence-steps li.step:nth-child(3) button.edit-note")
    page.fill("#sequence-steps li.step:nth-child(3) input.step-note-input", "the first refusal")
    page.press("#sequence-steps li.step:nth-child(3) input.step-note-input", "Enter")
    page.wait_for_function("document.querySelector('#sequence-steps li.step:nth-child(3) "
                           ".step-note')?.textContent === 'the first refusal'")

    # the Markdown export says the same, in this order
    href = page.get_attribute("#sequence-export-md", "href")
    answer = page.request.get(live_server.url + href)
    assert answer.ok
    lines = answer.text().splitlines()
    assert lines[0] == "# Why bob was refused"
    assert lines[2].startswith(f"1. At {format_time(second.received)}: ") and \
        lines[2].endswith(" — still refused")
    gap = (fourth.received - second.received) / timedelta(milliseconds=1)
    assert lines[3].startswith(f"2. {format_duration(gap)} later: ")
    assert lines[3].endswith(" — and then")
    assert lines[4].startswith("3. ") and lines[4].endswith(" — the first refusal")
    assert page.request.get(live_server.url + page.get_attribute(
        "#sequence-export-json", "href")).json()["title"] == "Why bob was refused"

    # a step's marker, clicked, selects its event
    step = Sequence.objects.get(pk=sequence.pk).steps.get(event_id=first.pk)
    index = page.evaluate("(name) => document.getElementById('gantt').layout.annotations"
                          ".findIndex(a => a.name === name)", f"step:{step.pk}")
    page.click(f"#gantt g.annotation[data-index='{index}'] .annotation-text-g")
    wait_for_detail(page, first.pk)


# --- share links --------------------------------------------------------------------------------

def test_a_share_link_opens_the_view_read_only_until_it_is_revoked(open_page, owner, incident,
                                                                   events, team):
    first, second = _distinct_times(events, 2)
    owner_client = Client()
    owner_client.force_login(owner)
    made = owner_client.post(f"/api/v1/incidents/{incident.pk}/sequences/", {
        "title": "Refusals", "steps": [{"event": first.pk, "note": "one"},
                                       {"event": second.pk, "note": "two"}]},
        content_type="application/json")
    assert made.status_code == 201
    sequence_id = made.json()["id"]
    note = Annotation.objects.create(incident=incident, event_id=first.pk, start=first.received,
                                     note="seen by the vendor", tags=["vendor"], author=owner)
    other = Incident.objects.create(title="another one", team=team, created_by=owner)
    view = f"resource=pods&lanes=actor&event={second.pk}&sequence={sequence_id}"
    page = open_page(owner, f"/incidents/{incident.pk}/?{view}")
    _drawn(page)
    page.wait_for_selector("#sequence-view:not([hidden])")

    page.click("#share summary")
    page.wait_for_function("Number(document.getElementById('share').dataset.loaded || 0) >= 1")
    page.fill("#share-form input[name=label]", "for the vendor")
    page.select_option("#share-form select[name=expires_in]", "86400")
    assert page.is_checked("#share-form input[name=view]")
    page.click("#share-create")
    page.wait_for_selector("#share-created:not([hidden])")
    url = page.input_value("#share-url")
    assert url.startswith(page.url.split("/incidents/")[0] + "/s/")
    link = ShareLink.objects.get(incident=incident)
    assert link.label == "for the vendor"
    assert link.view == {"query": f"resource=pods&lanes=actor&event={second.pk}",
                         "sequence": sequence_id}
    assert abs(link.expires_at - (timezone.now() + timedelta(days=1))) < timedelta(minutes=1)
    page.wait_for_selector(f"#share-links tr[data-link='{link.pk}']")
    assert page.text_content(f"#share-links tr[data-link='{link.pk}'] .state") == "active"

    # a fresh browser, not logged in, opens the link: the saved view, read-only
    holder = open_page(None, url[url.index("/s/"):])
    _drawn(holder)
    assert urlsplit(holder.url).path == f"/incidents/{incident.pk}/"
    # it opens on the timeline, not on the list of uploads above it
    assert 0 <= holder.evaluate(
        "document.getElementById('timeline').getBoundingClientRect().top") < 50
    assert page_query(holder) == {"resource": ["pods"], "lanes": ["actor"],
                                  "event": [str(second.pk)], "sequence": [str(sequence_id)]}
    wait_for_detail(holder, second.pk)
    holder.wait_for_selector("#sequence-view:not([hidden])")
    assert holder.input_value("#sequence-select") == str(sequence_id)
    assert _texts(holder, "#sequence-steps .step-note") == ["one", "two"]
    holder.wait_for_selector(f"#annotation-list li[data-annotation='{note.pk}']")
    assert "Shared link, read-only" in holder.text_content("header.top")
    for control in ("#share", "#share-form", "#annotation-form", "#annotate-event",
                    "#annotate-window", "#sequence-new", "#step-form", "#sequence-delete",
                    "#detail-annotate", "#sequence-steps button", "#annotation-list button.edit",
                    "#annotation-list button.delete", "#annotation-list button.star"):
        assert holder.query_selector(control) is None, control
    assert holder.get_attribute("#notes-side", "data-can-write") == "0"

    # the link reaches that incident only
    assert holder.goto(f"{url.split('/s/')[0]}/incidents/{other.pk}/").status == 404
    holder.go_back()
    _drawn(holder)

    # its uses are counted; revoked by the owner, the holder's next request answers 404
    page.reload()
    _drawn(page)
    page.click("#share summary")
    row = f"#share-links tr[data-link='{link.pk}']"
    page.wait_for_selector(row)
    assert page.text_content(f"{row} .uses") == "1"
    page.click(f"{row} button.revoke")
    page.click(f"{row} button.revoke")
    page.wait_for_function(f"document.querySelector(\"{row} .state\").textContent === 'revoked'")
    link.refresh_from_db()
    assert link.revoked_at is not None and link.revoked_at <= datetime.now(UTC)
    answer = holder.reload()
    assert answer.status == 404
    assert "revoked" in holder.text_content("main")
