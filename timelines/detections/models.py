"""Tables of the detections app: rules files added to the shipped ones, and the events each
rule matched (the ``detection=`` filter of the events API reads them)."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from incidents.models import Incident, Team


class RulesFile(models.Model):
    """A Falco rules file added by an admin, read after the shipped rules and the files added
    before it: instance-wide (no team) or for the incidents of one team."""

    name = models.CharField(max_length=200)
    text = models.TextField()
    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.CASCADE,
                             related_name="+")
    added_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL,
                                 related_name="+")
    added_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.name


class DetectionMatch(models.Model):
    """One request that a rule matched in an incident's current data version."""

    # By event first: every reader asks for the matches of given events (the events filter
    # probes each event, the page and the figure's stars read theirs, a stream's round replaces
    # its requests'); by rule first, each of those scanned every match of the incident (a
    # round's 8,000 ids against 709,940 matches: 228 s). The key is the readers' index: a
    # serial id beside it cost a COPY of 355,000 matches half its time (1.77 s against 0.88 s).
    pk = models.CompositePrimaryKey("incident", "event_id", "rule")
    incident = models.ForeignKey(Incident, on_delete=models.DO_NOTHING, db_constraint=False,
                                 db_index=False, related_name="+")
    event_id = models.BigIntegerField()
    rule = models.TextField()

    def __str__(self) -> str:
        return f"{self.rule}: event {self.event_id}"
