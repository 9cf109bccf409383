"""Where the events are counted from: the database (``aggregate``: counts, spans and the data
version of an incident's events in PostgreSQL) and the column index on disk (``columns``, with
the events' text in ``textblocks``), built after an incident's uploads are ready. The rows
themselves are ``timelines.models``; ``timelines.ingest`` is their only writer."""
