"""The reads that answer queries: the one filter definition (``filters``, with ``related``), the
timeline figure's data (``queries``), facets and the overview strip (``facets``, ``overview``),
and what changed between two versions of an object (``diff``). Each reads from ``store``."""
