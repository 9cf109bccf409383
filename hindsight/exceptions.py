"""The API's exception handler (``REST_FRAMEWORK["EXCEPTION_HANDLER"]``)."""

from __future__ import annotations

from rest_framework.exceptions import NotFound
from rest_framework.views import exception_handler as drf_exception_handler

from incidents.models import IncidentGone


def exception_handler(exc, context):
    """DRF's, but an incident deleted while a request wrote to it (``IncidentGone``, see
    ``incidents.models.writing``) answers 404 like any incident one cannot see."""
    if isinstance(exc, IncidentGone):
        exc = NotFound("No such incident: it has been deleted.")
    return drf_exception_handler(exc, context)
