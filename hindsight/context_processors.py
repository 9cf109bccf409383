"""Template context shared by every page."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest


def plotly_js(request: HttpRequest) -> dict[str, str]:
    """``plotly_js``: the static path of the plotly.js pages load (``settings.PLOTLY_JS``: the
    bundle built by scripts/assets.sh, or the plotly package's full one without it)."""
    return {"plotly_js": settings.PLOTLY_JS}
