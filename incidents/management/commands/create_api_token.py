"""``manage.py create_api_token USERNAME [--team TEAM] [--scope upload|full] [--expires-in DAYS]
[--name LABEL]``: prints a new API token on its last line."""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from incidents.models import ApiToken, Membership, Team


class Command(BaseCommand):
    help = ("Create the user (and the team, with the user as an editor) if missing, and print a "
            "new API token on the last line (full scope and no expiry unless told otherwise).")

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")
        parser.add_argument("--team", help="team to create or join (role: editor)")
        parser.add_argument("--scope", default=ApiToken.Scope.FULL,
                            help="full (everything the user may do; default) or upload (create "
                                 "uploads and read their status, nothing else)")
        parser.add_argument("--expires-in", metavar="DAYS",
                            help="the token stops working this many days from now (a whole "
                                 "number from 1 to 3650; default: never)")
        parser.add_argument("--name", default="", help="a label for the token")

    def handle(self, *args, **options) -> None:
        # Every value is checked before anything is created.
        if not options["username"].strip():
            raise CommandError("give the user's name")
        scope = options["scope"]
        if scope not in ApiToken.Scope.values:
            raise CommandError(f"--scope must be one of {', '.join(ApiToken.Scope.values)}, "
                               f"not {scope!r}")
        expires_at = None
        if options["expires_in"] is not None:
            days = options["expires_in"].strip()
            if not days.isdigit() or not 1 <= int(days) <= 3650:
                raise CommandError(f"--expires-in must be a whole number of days from 1 to "
                                   f"3650, not {options['expires_in']!r}")
            expires_at = timezone.now() + timedelta(days=int(days))
        if options["team"] is not None and not options["team"].strip():
            raise CommandError("--team must name a team")
        if len(options["name"]) > ApiToken._meta.get_field("name").max_length:
            raise CommandError("--name is at most 100 characters")

        user, created = get_user_model().objects.get_or_create(username=options["username"])
        if created:
            user.set_unusable_password()
            user.save(update_fields=["password"])
            self.stderr.write(f"Created user {user.username}")
        if options["team"]:
            team, team_created = Team.objects.get_or_create(name=options["team"].strip())
            if team_created:
                self.stderr.write(f"Created team {team.name}")
            membership, _ = Membership.objects.get_or_create(
                team=team, user=user, defaults={"role": Membership.Role.EDITOR})
            if membership.role == Membership.Role.VIEWER:
                membership.role = Membership.Role.EDITOR
                membership.save(update_fields=["role"])
        token, key = ApiToken.issue(user, name=options["name"], scope=scope,
                                    expires_at=expires_at)
        self.stderr.write(f"Token {token.prefix}… for {user.username}: scope {token.scope}, "
                          + (f"expires {expires_at:%Y-%m-%d %H:%M} UTC" if expires_at
                             else "no expiry"))
        self.stdout.write(key)
