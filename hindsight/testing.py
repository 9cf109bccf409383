"""Helpers shared by the test modules (fixtures live in the root conftest.py)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import parse_qs, urlsplit


def requests_in(path: Path) -> set[tuple[str, str]]:
    """The request identities (auditID, received) in a JSON-lines audit log, read with the
    standard library: expectations derived independently of the parser under test."""
    keys = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            event = json.loads(line)
            keys.add((event["auditID"],
                      event.get("requestReceivedTimestamp") or event["timestamp"]))
    return keys


def page_query(page) -> dict[str, list[str]]:
    """The query of a Playwright page's URL, every value of each parameter."""
    return parse_qs(urlsplit(page.url).query)


def wait_for_detail(page, event_id: int) -> None:
    """Wait until the incident page's detail panel shows the event."""
    page.wait_for_function(
        f"!document.getElementById('detail').hidden && "
        f"document.getElementById('detail-title').textContent === 'Event {event_id}'")


def write_audit_log(path: Path, start: datetime, offsets: list[timedelta], *,
                    user: str = "kubelet", code: int = 200) -> None:
    """A synthetic JSON-lines audit log at ``path``: one GET per offset from ``start``, on thirty
    pods in turn (``pods/shop/web-<n % 30>``), by ``user``, answered ``code``; auditIDs from the
    file's name."""
    lines = []
    for n, offset in enumerate(offsets):
        stamp = (start + offset).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        lines.append(json.dumps({
            "kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
            "auditID": f"{path.stem}-{n:08d}", "stage": "ResponseComplete", "verb": "get",
            "requestURI": f"/api/v1/namespaces/shop/pods/web-{n % 30}",
            "user": {"username": user}, "responseStatus": {"code": code},
            "objectRef": {"resource": "pods", "namespace": "shop", "name": f"web-{n % 30}"},
            "requestReceivedTimestamp": stamp, "stageTimestamp": stamp}))
    path.write_text("\n".join(lines) + "\n")


# --- detection stars on a timeline (timelines.figures.build) ----------------------------------

def detection_star(page, box: str, event_id: int) -> dict | None:
    """The star of a detected event on the plot in element ``box``: its trace's index and
    colour, and its point in the viewport (None when the event has none)."""
    return page.evaluate("""([box, id]) => {
        const gd = document.getElementById(box);
        gd.scrollIntoView({block: 'start'});
        const full = gd._fullLayout, rect = gd.getBoundingClientRect();
        for (let t = 0; t < gd.data.length; t++) {
            const trace = gd.data[t];
            if (trace.legendgroup !== 'detected') continue;
            const i = trace.customdata.indexOf(id);
            if (i < 0) continue;
            return {trace: t, colour: trace.marker.color,
                    x: rect.left + full._size.l + full.xaxis.d2p(trace.x[i]),
                    y: rect.top + full._size.t + full.yaxis.l2p(trace.y[i])};
        }
        return null; }""", [box, event_id])


def star_pixels(page, star: dict) -> int:
    """How many pixels of the star's colour the screen shows within 10 px of it."""
    import io

    from PIL import Image

    shot = page.screenshot(clip={"x": star["x"] - 10, "y": star["y"] - 10, "width": 20,
                                 "height": 20})
    want = tuple(int(star["colour"][i:i + 2], 16) for i in (1, 3, 5))
    image = Image.open(io.BytesIO(shot)).convert("RGB")
    pixels = image.load()
    return sum(1 for x in range(image.width) for y in range(image.height)
               if max(abs(a - b) for a, b in zip(pixels[x, y], want, strict=True)) < 40)


def assert_star_drawn(page, box: str, star: dict) -> None:
    """The star's pixels are on the plot, go when its trace is hidden and come back with it
    (so they are the star's, not a bar's of a like colour)."""
    assert star_pixels(page, star) >= 12
    for visible, pixels in ((False, lambda n: n == 0), (True, lambda n: n >= 12)):
        page.evaluate("([box, t, visible]) => Plotly.restyle(box, {visible}, [t])",
                      [box, star["trace"], visible])
        assert pixels(star_pixels(page, star))


def star_hover_text(page, box: str, star: dict, rule: str) -> str:
    """The hover label shown with the pointer on the star, once it names ``rule``."""
    page.mouse.move(star["x"], star["y"])
    page.wait_for_function("""([box, rule]) => [...document.querySelectorAll(
        '#' + box + ' .hoverlayer .hovertext')].some(h => h.textContent.includes(rule))""",
                           arg=[box, rule])
    return page.text_content(f"#{box} .hoverlayer .hovertext")
