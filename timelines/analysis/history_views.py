"""HTTP side of ``timelines.analysis.history``: not built yet."""

from __future__ import annotations

from django.http import HttpResponse
from rest_framework.decorators import api_view


@api_view(["GET"])
def history_api(request, incident_pk: int):
    return HttpResponse(status=501)


def history_page(request, pk: int):
    return HttpResponse(status=501)
