"""HTTP side of ``timelines.analysis.compare``: not built yet."""

from __future__ import annotations

from django.http import HttpResponse
from rest_framework.decorators import api_view


@api_view(["GET"])
def compare_api(request, incident_pk: int):
    return HttpResponse(status=501)


def compare_page(request, pk: int):
    return HttpResponse(status=501)
