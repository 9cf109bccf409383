"""HTTP side of ``timelines.analysis.insights``: not built yet."""

from __future__ import annotations

from django.http import HttpResponse
from rest_framework.decorators import api_view


@api_view(["GET"])
def insights_api(request, incident_pk: int):
    return HttpResponse(status=501)
