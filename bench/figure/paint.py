"""First paint of the incident page's timeline in Debian Chromium (Playwright).

A ``manage.py runserver --noreload`` of the bench database is started on a free port; each
measurement opens the incident page in a fresh browser context (nothing cached in the browser:
plotly.js is fetched every time, as on a first visit: the 1.5 MB bundle of scripts/assets.sh, or
without it the plotly package's 4.8 MB plotly.min.js) signed in with a session made in the bench
process. First paint is ``performance.now()`` (milliseconds since navigation start) in
the first animation frame after the page's script has finished drawing the figure
(``#gantt[data-drawn]`` set after ``Plotly.react`` resolved; with an older page script, the
status line leaving "drawing…").
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--enable-unsafe-swiftshader", "--use-angle=swiftshader", "--no-sandbox"]

# Runs in the page before its scripts: polls every frame until the figure is drawn, then notes
# the time in the next frame (by then the browser has painted it).
_WATCH = """
window.__firstPaint = null;
(function watch() {
  const box = document.getElementById("gantt");
  const status = document.getElementById("gantt-status");
  const drawn = box && (Number(box.dataset.drawn || 0) > 0 ||
    (box.querySelector(".main-svg") && status && !/drawing/.test(status.textContent)));
  if (drawn) {
    requestAnimationFrame(() => { window.__firstPaint = performance.now(); });
    return;
  }
  requestAnimationFrame(watch);
})();
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def running_server(root: Path, env: dict[str, str], log: Path):
    """``manage.py runserver --noreload`` on a free port until the block ends; yields its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
            cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    urllib.request.urlopen(url + "/accounts/login/", timeout=2).read()
                    break
                except OSError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit(f"runserver did not start, see {log}") from None
                    time.sleep(0.3)
            yield url
        finally:
            server.terminate()
            server.wait(timeout=30)


def first_paints(url: str, path: str, session: tuple[str, str], runs: int,
                 before_each: Callable[[], None], screenshot: Path | None = None) -> list[dict]:
    """``runs`` page loads of ``url + path``, ``before_each()`` called before each one; per load
    the first paint and what led to it (ms since navigation start)."""
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's loop, ORM around it
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        raise SystemExit(f"{CHROMIUM} is missing: run scripts/browser.sh")
    results = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            for run in range(runs):
                before_each()
                context = browser.new_context(viewport={"width": 1400, "height": 900})
                context.add_cookies([{"name": session[0], "value": session[1], "url": url}])
                page = context.new_page()
                page.set_default_timeout(120_000)
                page.add_init_script(_WATCH)
                page.goto(url + path)
                page.wait_for_function("window.__firstPaint !== null")
                results.append(page.evaluate("""() => {
                    const nav = performance.getEntriesByType("navigation")[0];
                    const figure = performance.getEntriesByType("resource")
                        .filter(r => r.name.includes("/figure/")).pop();
                    const plotly = performance.getEntriesByType("resource")
                        .filter(r => r.name.includes("plotly")).pop();
                    const span = r => r ? {start: Math.round(r.startTime),
                                           end: Math.round(r.responseEnd),
                                           bytes: r.encodedBodySize} : null;
                    return {first_paint_ms: Math.round(window.__firstPaint),
                            dom_content_loaded_ms: Math.round(nav.domContentLoadedEventEnd),
                            figure_request: span(figure), plotly_js: span(plotly),
                            status: document.getElementById("gantt-status").textContent};
                }"""))
                if screenshot is not None and run == 0:
                    page.screenshot(path=str(screenshot), full_page=False)
                context.close()
        finally:
            browser.close()
    return results
