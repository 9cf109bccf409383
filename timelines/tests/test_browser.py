"""The incident page in a real browser (Debian Chromium through Playwright)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_gantt_draws_the_fixture_incident(open_page, owner, incident, ingest_file, demo_log):
    upload = ingest_file(incident, demo_log)
    assert upload.status == "done"
    page = open_page(owner, f"/incidents/{incident.pk}/")
    page.wait_for_selector("#gantt .main-svg")
    page.wait_for_function(
        "document.getElementById('gantt-status').textContent.includes('events on')")
    status = page.text_content("#gantt-status")
    assert f"{upload.events} events on" in status
    # WebGL drew the bars: the gl canvas exists and has a non-zero size
    size = page.evaluate("""() => { const c = document.querySelector('#gantt canvas');
                                    return c ? c.width * c.height : 0; }""")
    assert size > 0
