"""``manage.py replay_audit FILE… --url URL --token T [--rate N] [--batch 400]``: post audit logs
to a stream as kube-apiserver's webhook would (``streams.sender``), and say what was
acknowledged."""

from __future__ import annotations

import time
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from ...sender import Refused, replay


class Command(BaseCommand):
    help = ("Post audit logs (JSON lines, gzipped or not) to a stream's receiver in EventList "
            "batches, retrying each with back-off until it is acknowledged.")

    def add_arguments(self, parser) -> None:
        parser.add_argument("files", nargs="+")
        parser.add_argument("--url", required=True,
                            help="the receiver: https://host/api/v1/streams/ID/audit/")
        parser.add_argument("--token", required=True, help="the stream's token")
        parser.add_argument("--rate", type=float, default=None, help="events per second at most")
        parser.add_argument("--batch", type=int, default=400, help="events per batch (400)")

    def handle(self, *args, **options) -> None:
        for name in options["files"]:
            if not Path(name).is_file():
                raise CommandError(f"{name}: no such file")
        if not 1 <= options["batch"] <= 100_000:
            raise CommandError("--batch must be 1 to 100000")
        if options["rate"] is not None and options["rate"] <= 0:
            raise CommandError("--rate must be positive")
        started = time.monotonic()
        try:
            tally = replay(options["files"], options["url"], options["token"],
                           batch=options["batch"], rate=options["rate"],
                           on_retry=lambda why: self.stderr.write(f"retrying a batch: {why}"))
        except Refused as exc:
            raise CommandError(f"the receiver refused a batch: {exc}") from None
        seconds = time.monotonic() - started
        self.stdout.write(f"acknowledged {tally.events} events in {tally.batches} batches "
                          f"({tally.new} new, {tally.retries} retries) in {seconds:.1f} s")
