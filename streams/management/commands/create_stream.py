"""``manage.py create_stream NAME --team T [--retention-hours H] [--retention-gb G]``: makes an
audit webhook stream and prints the kubeconfig for kube-apiserver's
``--audit-webhook-config-file`` (with the stream's token, shown only here) and the flags to add."""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import IntegrityError
from django.urls import reverse

from incidents.models import Team

from ...kubeconfig import apiserver_flags, kubeconfig
from ...store import create_stream


class Command(BaseCommand):
    help = ("Make an audit webhook stream for a team (made if missing) and print the kubeconfig "
            "kube-apiserver needs (server URL and bearer token) and the flags to add.")

    def add_arguments(self, parser) -> None:
        parser.add_argument("name")
        parser.add_argument("--team", required=True)
        parser.add_argument("--retention-hours", type=int, default=24,
                            help="hours kept before the newest event (default 24)")
        parser.add_argument("--retention-gb", type=float, default=None,
                            help="at most this many GB kept (default: no limit by size)")
        parser.add_argument("--url", default=None,
                            help="this site's URL as kube-apiserver reaches it (default SITE_URL)")

    def handle(self, *args, **options) -> None:
        name = options["name"].strip()
        if not name or len(name) > 100:
            raise CommandError("NAME must be 1 to 100 characters")
        if not options["team"].strip():
            raise CommandError("--team must name a team")
        team, _ = Team.objects.get_or_create(name=options["team"].strip())
        try:
            stream, token = create_stream(name, team, retention_hours=options["retention_hours"],
                                          retention_gb=options["retention_gb"])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        except IntegrityError:
            raise CommandError(f"team {team.name} has a stream named {name!r} already") from None
        site = (options["url"] or settings.SITE_URL).rstrip("/")
        server = site + reverse("stream-audit", args=[stream.pk])
        self.stderr.write(f"Made stream {stream.name} (id {stream.pk}) of team {team.name}.")
        self.stderr.write("Save the kubeconfig below as /etc/kubernetes/"
                          "hindsight-audit-webhook.yaml on every control-plane node, and add to"
                          " kube-apiserver:")
        self.stderr.write("  " + " \\\n  ".join(apiserver_flags()))
        self.stdout.write(kubeconfig(stream, server, token), ending="")
