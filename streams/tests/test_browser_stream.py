"""A stream's live view in a real browser (Debian Chromium through Playwright): the requests its
rules matched are starred on its timeline as on an incident's, with the same hover texts (one
script, static/js/hover.js, joins them on both pages)."""

from __future__ import annotations

import pytest

from conftest import SCREENSHOTS
from hindsight.testing import assert_star_drawn, detection_star, star_hover_text
from streams import store
from streams.rounds import detect_batch
from timelines.detections import rules
from timelines.detections.models import DetectionMatch

from .helpers import event_list
from .test_detections import day_traces

pytestmark = pytest.mark.django_db(transaction=True)

# a rule matching a request of the day's last five minutes, which the live view draws
STREAM_RULE = "ClusterRole With Pod Exec Created"


def test_a_stream_s_live_view_stars_its_detected_requests(
        open_page, owner, stream_of, post_batch, fixtures_dir):
    stream, token = stream_of()
    _, lines = day_traces(fixtures_dir)
    assert post_batch(stream.pk, event_list(lines), token).status_code == 200
    detect_batch({slot: [(r.isoformat(), a) for r, a in store.events(stream).filter(
        incident_id=slot).values_list("received", "audit_id")] for slot in
        store.incident_ids(stream)})
    target = DetectionMatch.objects.get(
        incident_id__in=store.incident_ids(stream), rule=STREAM_RULE).event_id
    priority = rules.load(rules.default_files()).rule(STREAM_RULE).priority

    page = open_page(owner, f"/streams/{stream.pk}/")
    page.wait_for_function("""() => {
        const gd = document.getElementById('stream-figure');
        return gd.data && gd.data.some(t => t.legendgroup === 'detected'); }""")
    page.uncheck("#follow")  # no redraw under the pointer
    star = detection_star(page, "stream-figure", target)
    assert star is not None
    assert_star_drawn(page, "stream-figure", star)
    page.locator("#stream-figure").screenshot(path=str(SCREENSHOTS / "detection-star-stream.png"))
    text = star_hover_text(page, "stream-figure", star, STREAM_RULE)
    assert f"{STREAM_RULE} ({priority})" in text and "clusterroles" in text
    page.locator("#stream-figure").screenshot(
        path=str(SCREENSHOTS / "detection-star-stream-hover.png"))
