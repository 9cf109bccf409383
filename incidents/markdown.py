"""Safe rendering of what people write (annotation notes) from Markdown to HTML.

Two layers, because either alone has failed somewhere before: markdown-it-py in strict CommonMark
with raw HTML disabled (``<script>`` stays text, and its link validator drops ``javascript:``
targets), then nh3 (ammonia) with an allow-list of the tags CommonMark produces and of URL
schemes, which also adds ``rel`` to every link. The result may go straight into a page.
"""

from __future__ import annotations

import nh3
from markdown_it import MarkdownIt

_parser = MarkdownIt("commonmark", {"html": False})

TAGS = {"a", "blockquote", "br", "code", "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "img",
        "li", "ol", "p", "pre", "strong", "ul"}
ATTRIBUTES = {"a": {"href", "title"}, "img": {"src", "alt", "title"}, "ol": {"start"}}
URL_SCHEMES = {"http", "https", "mailto"}
# noopener: the linked page gets no handle on ours; noreferrer: it does not learn our URL (which
# for a share-link holder carries the link's key).
LINK_REL = "noopener noreferrer"


def render_markdown(source: str) -> str:
    """HTML for a Markdown note, safe to insert into a page as is."""
    if not source:
        return ""
    html = _parser.render(source)
    return nh3.clean(html, tags=TAGS, attributes=ATTRIBUTES, url_schemes=URL_SCHEMES,
                     link_rel=LINK_REL, strip_comments=True)
