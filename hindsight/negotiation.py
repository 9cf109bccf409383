"""Content negotiation of the API: the URL decides the representation, the Accept header only
chooses among what a view can give, and an Accept header that matches none of it never makes a
406.

DRF answers 406 Not Acceptable when no renderer of a view matches the Accept header. That is
wrong for the endpoints whose URL names their representation (``events.csv``, ``events.json``,
``sequences/{id}/export.md`` and ``export.json``): a client asking ``events.csv`` with
``Accept: text/csv`` (curl, a spreadsheet) was refused, because the view's renderers are JSON
ones (its body is a streamed CSV, not rendered), and ``export.md`` refused ``Accept:
application/json``. HTTP lets a server send its one representation whatever the Accept header
says; so this negotiation falls back, where DRF would refuse, to the renderer of the format
suffix (``.md``, ``?format=``) or else the view's first renderer. Every view of the API uses it
(``REST_FRAMEWORK["DEFAULT_CONTENT_NEGOTIATION_CLASS"]``), so a new download endpoint cannot
bring the fault back.
"""

from __future__ import annotations

from rest_framework.exceptions import NotAcceptable
from rest_framework.negotiation import DefaultContentNegotiation


class UrlFormatNegotiation(DefaultContentNegotiation):
    def select_renderer(self, request, renderers, format_suffix=None):
        try:
            return super().select_renderer(request, renderers, format_suffix)
        except NotAcceptable:
            wanted = format_suffix or request.query_params.get(self.settings.URL_FORMAT_OVERRIDE)
            if wanted:
                renderers = self.filter_renderers(renderers, wanted)  # 404 for an unknown one
            return renderers[0], renderers[0].media_type
