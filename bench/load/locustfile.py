"""The load of ``bench/load``: readers of one incident and uploaders of audit logs, against a
running Hindsight. ``bench/load`` starts locust with this file; the plan (host, token, incident,
filters, files to upload) comes from the JSON file named by ``HINDSIGHT_LOAD_PLAN``, and every
upload made is appended to ``plan["uploads_log"]`` (one JSON line each) so that the bench can
check afterwards that each one ended ``done`` with the events expected."""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from pathlib import Path

from locust import HttpUser, between, events, task

PLAN = json.loads(Path(os.environ["HINDSIGHT_LOAD_PLAN"]).read_text())
FINISHED = {"done", "failed", "skipped"}


class _Client(HttpUser):
    abstract = True

    def on_start(self) -> None:
        self.client.headers["Authorization"] = f"Token {PLAN['token']}"

    def get(self, url: str, name: str, params: dict | None = None) -> dict | None:
        """GET that counts as failed unless it answers 200 with JSON."""
        with self.client.get(url, params=params, name=name, catch_response=True) as answer:
            if answer.status_code != 200:
                answer.failure(f"HTTP {answer.status_code}: {answer.text[:200]}")
                return None
            try:
                return answer.json()
            except ValueError:
                answer.failure("not JSON")
                return None


class Reader(_Client):
    """Someone on the incident page and its API: events (filtered, paged by cursor), the
    figure, facets and the overview."""

    wait_time = between(0.1, 0.5)

    def incident(self, path: str) -> str:
        return f"/api/v1/incidents/{PLAN['incident']}/{path}"

    def filters(self) -> dict:
        return random.choice(PLAN["filters"])

    @task(4)
    def events_pages(self) -> None:
        page = self.get(self.incident("events/"), "events, first page", self.filters())
        for _ in range(2):  # the next pages, by the cursor the API gives
            if not page or not page.get("next"):
                return
            page = self.get(page["next"], "events, next page (cursor)")

    @task(2)
    def figure(self) -> None:
        params = {**self.filters(), "lanes": random.choice(["object", "actor"])}
        self.get(self.incident("figure/"), "figure", params)

    @task(2)
    def facets(self) -> None:
        params = {**self.filters(), "field": random.choice(["user", "verb", "resource", "code"])}
        self.get(self.incident("facets/"), "facets", params)

    @task(1)
    def overview(self) -> None:
        self.get(self.incident("overview/"), "overview", self.filters())


class Uploader(_Client):
    """A CI job sending an audit log to a new incident, then polling until it is ingested."""

    fixed_count = PLAN["uploaders"]
    wait_time = between(0.5, 2)

    @task
    def upload(self) -> None:
        source = random.choice(PLAN["upload_files"])
        started = time.perf_counter()
        with Path(source["path"]).open("rb") as handle, self.client.post(
                "/api/v1/uploads/", name="upload (POST)", catch_response=True,
                files={"file": (Path(source["path"]).name, handle)},
                data={"incident": f"load {uuid.uuid4().hex[:8]}"}) as answer:
            if answer.status_code != 202:
                answer.failure(f"HTTP {answer.status_code}: {answer.text[:200]}")
                return
            upload_id = answer.json()["id"]
        with open(PLAN["uploads_log"], "a") as log:  # before waiting: a stopped run counts it
            log.write(json.dumps({"id": upload_id, **source}) + "\n")
        ready = False
        while True:
            time.sleep(0.5)  # gevent's, under locust
            state = self.get(f"/api/v1/uploads/{upload_id}/", "upload status (GET)")
            if state is not None and not ready and state.get("stage") in ("ready", "complete"):
                ready = True  # the first answer: its events readable, the analyses behind it
                events.request.fire(request_type="UPLOAD", name="upload, until ready",
                                    response_time=(time.perf_counter() - started) * 1000,
                                    response_length=0, exception=None, context={})
            if state is not None and state["status"] in FINISHED:
                break
        problem = None
        if state["status"] != "done" or state["events"] != source["events"]:
            problem = AssertionError(f"upload {upload_id}: {state['status']}, "
                                     f"{state['events']} events of {source['events']}: "
                                     f"{state.get('message')}")
        events.request.fire(request_type="UPLOAD", name="upload, until done",
                            response_time=(time.perf_counter() - started) * 1000,
                            response_length=0, exception=problem, context={})
