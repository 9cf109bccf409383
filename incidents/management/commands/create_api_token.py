"""``manage.py create_api_token USERNAME [--team TEAM]``: prints a new full-scope API token
on its last line."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from incidents.models import ApiToken, Membership, Team


class Command(BaseCommand):
    help = ("Create the user (and the team, with the user as an editor) if missing, and print a "
            "new full-scope API token on the last line.")

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")
        parser.add_argument("--team", help="team to create or join (role: editor)")
        parser.add_argument("--name", default="", help="a label for the token")

    def handle(self, *args, **options) -> None:
        user, created = get_user_model().objects.get_or_create(username=options["username"])
        if created:
            user.set_unusable_password()
            user.save(update_fields=["password"])
            self.stderr.write(f"Created user {user.username}")
        if options["team"]:
            team, team_created = Team.objects.get_or_create(name=options["team"])
            if team_created:
                self.stderr.write(f"Created team {team.name}")
            membership, _ = Membership.objects.get_or_create(
                team=team, user=user, defaults={"role": Membership.Role.EDITOR})
            if membership.role == Membership.Role.VIEWER:
                membership.role = Membership.Role.EDITOR
                membership.save(update_fields=["role"])
        _, key = ApiToken.issue(user, name=options["name"])
        self.stdout.write(key)
