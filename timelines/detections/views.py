"""``/api/v1/rules/``: the loaded Falco rules files and rules; admins add a rules file."""

from __future__ import annotations

from django.db.models import Q
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.decorators import api_view
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.response import Response

from incidents.access import is_person
from incidents.models import Membership, Team

from . import rules
from .models import RulesFile

MAX_RULES_BYTES = 1 << 20


def _files_of(team: Team | None) -> list[RulesFile]:
    added = RulesFile.objects.filter(Q(team__isnull=True) | Q(team=team) if team else Q(
        team__isnull=True))
    return list(added.select_related("team").order_by("id"))


def _listing(team: Team | None) -> dict:
    added = _files_of(team)
    ruleset = rules.load(rules.default_files() + [(f.name, f.text) for f in added])
    return {
        "files": [{"name": path.name, "builtin": True, "team": None, "added_at": None}
                  for path in rules.DEFAULT_FILES]
        + [{"name": f.name, "builtin": False, "team": f.team.name if f.team else None,
            "added_at": f.added_at.isoformat()} for f in added],
        "rules": [{"name": r.name, "priority": r.priority, "source": r.file,
                   "enabled": r.enabled, "evaluated": r.enabled and r.source == rules.SOURCE,
                   "tags": r.tags} for r in ruleset.rules],
        "notes": ruleset.notes,
    }


def _team(request) -> Team | None:
    name = request.query_params.get("team") or request.data.get("team") \
        if request.method == "POST" else request.query_params.get("team")
    if not name:
        return None
    team = Team.objects.filter(name=name).first()
    user = request.user
    if team is None or not is_person(user) or not (user.is_superuser or Membership.objects
                                                   .filter(user=user, team=team).exists()):
        # a team's rules are its members' business: never a hint that another team exists
        raise ValidationError({"team": [f"You are in no team named {name!r}."]})
    return team


@extend_schema(
    summary="Falco rules",
    description=(
        "`GET`: the rules files the detections load (the shipped k8saudit 0.18.0 rules, then "
        "the added files, instance-wide and, with `team`, that team's) and their rules: "
        "`{\"files\": [{\"name\", \"builtin\", \"team\", \"added_at\"}], \"rules\": "
        "[{\"name\", \"priority\", \"source\", \"enabled\", \"evaluated\", \"tags\"}], "
        "\"notes\"}`. `POST` (superusers; a team's admins with `team`): multipart `file` (or "
        "`name` and `text`) adds a Falco rules file, read after the others; 400 with "
        "`file:line: reason` when it (with the files before it) does not load, and nothing of "
        "it is kept."),
    request=inline_serializer("RulesFileUpload", {
        "file": serializers.FileField(required=False), "name": serializers.CharField(
            required=False), "text": serializers.CharField(required=False),
        "team": serializers.CharField(required=False)}),
    responses={200: OpenApiResponse(OpenApiTypes.OBJECT), 201: OpenApiResponse(
        OpenApiTypes.OBJECT)},
)
@api_view(["GET", "POST"])
def rules_api(request):
    team = _team(request)
    if request.method == "GET":
        return Response(_listing(team))
    user = request.user
    allowed = is_person(user) and (user.is_superuser or (team is not None and Membership.objects
                                   .filter(user=user, team=team,
                                           role=Membership.Role.ADMIN).exists()))
    if not allowed:
        raise PermissionDenied("Only administrators add rules files.")
    upload = request.FILES.get("file")
    if upload is not None:
        if upload.size > MAX_RULES_BYTES:
            raise ValidationError({"file": ["A rules file is at most 1 MiB."]})
        name = request.data.get("name") or upload.name
        try:
            text = upload.read().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValidationError({"detail": f"{name}:1: not UTF-8 ({exc.reason})"}) from None
    else:
        name, text = request.data.get("name"), request.data.get("text")
        if not name or not isinstance(text, str):
            raise ValidationError({"file": ["Send a rules file (or name and text)."]})
    name = str(name)[:200]
    if "\0" in text:
        raise ValidationError({"detail": f"{name}:1: holds a NUL character"})
    before = [(f.name, f.text) for f in _files_of(team)]
    try:
        loaded = rules.load(rules.default_files() + before + [(name, text)])
    except rules.RulesError as exc:
        raise ValidationError({"detail": str(exc)}) from None
    added = RulesFile.objects.create(name=name, text=text, team=team, added_by=user)
    defined = sorted({r.name for r in loaded.rules if r.file == name})
    return Response({"name": added.name, "team": team.name if team else None,
                     "added_at": added.added_at.isoformat(), "rules": defined},
                    status=status.HTTP_201_CREATED)
