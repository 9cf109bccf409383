"""Detections on the incident timeline in a real browser (Debian Chromium through Playwright):
the star of a request a Falco rule matched is drawn (its pixels are there, and gone when its
trace is hidden), its hover text names the rule and its priority as ``figures.build.hover_texts``
says, and a click on it opens the event."""

from __future__ import annotations

import pytest

from conftest import SCREENSHOTS
from hindsight.testing import (
    assert_star_drawn,
    detection_star,
    star_hover_text,
    wait_for_detail,
)
from timelines.detections import rules
from timelines.detections.incident import evaluate, ruleset_for, store_matches
from timelines.detections.models import DetectionMatch
from timelines.figures.build import hover_texts

pytestmark = pytest.mark.django_db(transaction=True)

RULE = "Create/Modify Configmap With Private Credentials"


def test_a_detected_request_is_starred_on_the_timeline_and_its_hover_names_the_rule(
        open_page, owner, incident, falco):
    store_matches(incident.pk, evaluate(incident.pk, ruleset_for(incident.pk)))
    target = min(DetectionMatch.objects.filter(incident_id=incident.pk, rule=RULE)
                 .values_list("event_id", flat=True))
    priority = rules.load(rules.default_files()).rule(RULE).priority
    page = open_page(owner, f"/incidents/{incident.pk}/")
    page.wait_for_function("Number(document.getElementById('gantt').dataset.drawn || 0) >= 1")
    detected = DetectionMatch.objects.filter(incident_id=incident.pk).values(
        "event_id").distinct().count()
    assert f"{detected} detected" in page.text_content("#gantt-status")

    star = detection_star(page, "gantt", target)
    assert star is not None
    assert_star_drawn(page, "gantt", star)
    page.locator("#gantt").screenshot(path=str(SCREENSHOTS / "detection-star.png"))
    text = star_hover_text(page, "gantt", star, RULE)
    assert text.startswith("⚑ ") and f"{RULE} ({priority})" in text
    assert "configmaps" in text
    page.locator("#gantt").screenshot(path=str(SCREENSHOTS / "detection-star-hover.png"))
    # the page joined the texts as figures.hover_texts says
    figure, drawn = page.evaluate("""async () => {
        const gd = document.getElementById('gantt');
        const answer = await fetch(gd.dataset.figureUrl + '?lanes=object&colour=verb');
        return [await answer.json(), gd.data.map(t => t.text)];
    }""")
    assert any(t.get("labels", {}).get("form") == "detection" for t in figure["data"])
    assert drawn[:len(figure["data"])] == hover_texts(figure)

    page.mouse.click(star["x"], star["y"])  # opens the event, as a click on its bar does
    wait_for_detail(page, target)
