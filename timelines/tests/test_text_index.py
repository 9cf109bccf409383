"""The text filter ``q`` answered from the column index (``timelines.store.textblocks``): with the
index and without it every term gives the same pages, steps and exports, whatever its case, its
characters or where it is; a term that no event holds reads no event, and a rare one is read by
the ids of its matches."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from django.db import connection
from django.db.models import Q
from django.test.utils import CaptureQueriesContext

from timelines.models import Event
from timelines.store import aggregate, columns, textblocks

from .test_events_index import STEP_URL, URL, _iso, _neighbours, pages
from .test_figure_api import _row, _store, _synthetic_rows

# Texts where the database's case folding is not ASCII's (ß, dotless and dotted i, the Kelvin
# sign, a ligature, a title-case letter), LIKE's own characters, and the control characters the
# index uses as separators inside values.
ODD_TEXTS = ["Straße in İstanbul", "ıI iİ", "200 \u212a of heat", "ﬁle ǅemo", "50%_off\\path",
             "a\x01b\x02c\x03d", "tab\tnew\nline", "ÉCOLE école", "\u00ff\u0178"]

# Terms with and without a match, of one, two and many bytes, in every case
TERMS = ["obj", "OBJ-1", "obj-7", "healthz", "/HEALTHZ", "middle", "no-such-text", "o", "zz",
         "straße", "STRASSE", "İSTANBUL", "istanbul", "ı", "i", "k of", "\u212a", "FILE", "ﬁle",
         "ǆemo", "50%_", "%", "_off", "\\path", "b\x02c", "\x03", "école", "ÉCOLE", "ÿ", "Ÿ",
         "tab\tnew", "crash", "CrashLoop", "line"]

TERM_PAIRS = [["obj", "obj-1"], ["crash", "no-such-text"], ["middle", "m"]]


def _text_rows() -> list:
    rng = random.Random(11)
    rows = _synthetic_rows(count=900)
    rows += [_row(f"odd-{n}", rng.uniform(0, 600), kind="log", message=text, component="kubelet")
             for n, text in enumerate(ODD_TEXTS)]
    rows += [_row(f"uri-{n}", rng.uniform(0, 600), resource="pods", name=f"crash-{n}",
                  request_uri=f"/api/v1/namespaces/shop/pods/crash-{n}?watch=true")
             for n in range(4)]
    rows += [_row(f"loop-{n}", 597 + n / 10, kind="event", reason="BackOff",
                  message="Back-off restarting failed container (CrashLoopBackOff)")
             for n in range(3)]  # only at the end
    rows += [_row(f"mid-{n}", 300.5, name="middle" if n == 1 else "m") for n in range(3)]
    return rows


@pytest.fixture(params=["blocks of 4096", "blocks of 7"])
def texts(request, incident, client, owner, monkeypatch):
    """Synthetic evidence with odd texts, its column index built with the default sizes, or
    with blocks of 7 events read from PostgreSQL 50 at a time (matches across block and chunk
    edges)."""
    if request.param == "blocks of 7":
        monkeypatch.setattr(textblocks, "BLOCK", 7)
        monkeypatch.setattr(textblocks, "_TEXT_CHUNK", 50)
    _store(incident, _text_rows())
    columns.build(incident.pk, aggregate.data_version(incident.pk))
    client.force_login(owner)
    return incident


def _queries() -> list[dict]:
    return [{"q": term} for term in TERMS] + [{"q": pair} for pair in TERM_PAIRS] + [
        {"q": "obj", "user": "alice"}, {"q": "crash", "verb": "get"},
        {"q": "obj-1", "since": _iso(120), "namespace": "shop"}]


def test_every_term_gives_the_same_pages_with_and_without_the_index(texts, client):
    incident = texts
    assert columns.load(incident.pk, aggregate.data_version(incident.pk)) is not None
    by_index = {}
    for query in _queries():
        total = client.get(URL.format(incident.pk), {**query, "page_size": 1000}).json()
        size = max(2, len(total["results"]) // 5)
        by_index[repr(query)] = pages(client, incident, query, page_size=size)
    matched = {k for k, (forward, _) in by_index.items() if forward}
    assert len(matched) >= 20  # most terms match something
    columns.discard(incident.pk)
    for query in _queries():
        total = client.get(URL.format(incident.pk), {**query, "page_size": 1000}).json()
        size = max(2, len(total["results"]) // 5)
        assert pages(client, incident, query, page_size=size) == by_index[repr(query)], query


def test_the_index_finds_exactly_what_the_database_finds(texts):
    """Each term's matches, as ``ColumnIndex.ids`` gives them over the whole incident, are the
    database's ``icontains`` matches, id for id."""
    incident = texts
    index = columns.load(incident.pk, aggregate.data_version(incident.pk))
    events = Event.objects.filter(incident=incident)
    first, last = int(index.received[0]), int(index.received[-1])
    served = 0
    for term in TERMS:
        folded = textblocks.fold([term], index.text_case)
        wanted = list(_database_matches(events, term).order_by("received", "id")
                      .values_list("id", flat=True))
        if folded is None:  # a separator in the term: the database answers it
            assert any(mark in term.encode() for mark in (b"\x01", b"\x02", b"\x03")), term
            continue
        served += 1
        assert index.ids({"q": folded}, first, last).tolist() == wanted, term
        blocks = index.text.candidates(folded)
        hits = index.text.matches(folded, 0, index.events, np.ones(index.text.blocks, bool))
        held = {int(p) // textblocks.BLOCK for p in np.flatnonzero(hits)}
        assert all(blocks[b] for b in held), term  # the filter never hides a match
    assert served >= len(TERMS) - 3


def _database_matches(events, term: str):
    return events.filter(Q(request_uri__icontains=term) | Q(message__icontains=term)
                         | Q(name__icontains=term))


def _event_queries(client, url: str, query: dict) -> list[str]:
    """The SQL of the queries on events that the answer took (streamed ones read to the end)."""
    with CaptureQueriesContext(connection) as captured:
        answer = client.get(url, query)
        assert answer.status_code == 200, answer.content[:300]
        if answer.streaming:
            b"".join(answer.streaming_content)
    return [q["sql"] for q in captured.captured_queries if "timelines_event" in q["sql"]]


def test_a_term_no_event_holds_reads_no_event(texts, client):
    for url in (URL.format(texts.pk), STEP_URL.format(texts.pk),
                f"/api/v1/incidents/{texts.pk}/events.csv",
                f"/api/v1/incidents/{texts.pk}/events.json"):
        for query in ({"q": "no-such-text"}, {"q": ["obj", "healthz"]},
                      {"q": "middle", "verb": "watch"}):
            assert _event_queries(client, url, query) == [], (url, query)
    assert client.get(URL.format(texts.pk), {"q": "no-such-text"}).json()["results"] == []
    columns.discard(texts.pk)  # without the index the database looks, and finds nothing
    assert len(_event_queries(client, URL.format(texts.pk), {"q": "no-such-text"})) == 1


def test_a_page_of_a_rare_term_is_read_by_the_ids_of_its_matches(texts, client):
    loop = list(Event.objects.filter(incident=texts, message__icontains="crashloop")
                .order_by("received", "id"))
    assert len(loop) == 3
    [sql] = _event_queries(client, URL.format(texts.pk), {"q": "CRASHLOOP"})
    assert '"timelines_event"."id" IN' in sql
    assert f"IN ({', '.join(str(e.pk) for e in loop)})" in sql
    for event in (loop[0], loop[-1]):  # and between the first match's time and the last's
        assert str(event.received.replace(tzinfo=None)) in sql
    # a term holding a separator is left to the database as it is
    [sql] = _event_queries(client, URL.format(texts.pk), {"q": "b\x02c"})
    assert '"timelines_event"."id" IN' not in sql and '"received" <=' not in sql


def test_stepping_through_a_term_finds_the_same_neighbours_with_and_without_the_index(
        texts, client, settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {
        **settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], "api": None}}
    events = list(Event.objects.filter(incident=texts).order_by("received", "id").values())
    anchors = [None, *events[::60], *[e for e in events if e["name"] in ("middle", "m")],
               events[-1]]
    terms = ["crashloop", "obj-1", "middle", "no-such-text", "ß", "healthz"]
    matching = {term: set(_database_matches(Event.objects.filter(incident=texts), term)
                          .values_list("id", flat=True)) for term in terms}
    for indexed_now in (True, False):
        if not indexed_now:
            columns.discard(texts.pk)
        for term in terms:
            for anchor in anchors:
                after, before = _neighbours(events, lambda e, t=term: e["id"] in matching[t],
                                            anchor)
                origin = {} if anchor is None else {"from": anchor["id"]}
                for direction, wanted in (("next", after), ("previous", before)):
                    answer = client.get(STEP_URL.format(texts.pk),
                                        {"q": term, "direction": direction, **origin}).json()
                    got = answer["event"]["id"] if answer["event"] else None
                    assert got == wanted, (term, anchor and anchor["id"], direction, indexed_now)


def test_exports_read_only_from_the_first_match_to_the_last(texts, client):
    base = f"/api/v1/incidents/{texts.pk}/events"
    exports = {}
    for query in ({"q": "crashloop"}, {"namespace": "shop", "q": "obj"}, {"code": "418"},
                  {"user": "alice"}):
        csv_sql = _event_queries(client, f"{base}.csv", query)
        exports[repr(query)] = (b"".join(client.get(f"{base}.csv", query).streaming_content),
                                b"".join(client.get(f"{base}.json", query).streaming_content))
        if query.get("code") == "418":  # no event holds it: nothing is read
            assert csv_sql == []
            continue
        [sql] = csv_sql
        assert '"timelines_event"."received" >=' in sql and '"received" <=' in sql, query
    loop = Event.objects.filter(incident=texts, message__icontains="crashloop")
    assert exports[repr({"q": "crashloop"})][0].count(b"\n") == loop.count() + 1
    columns.discard(texts.pk)
    for query in ({"q": "crashloop"}, {"namespace": "shop", "q": "obj"}, {"code": "418"},
                  {"user": "alice"}):
        assert (b"".join(client.get(f"{base}.csv", query).streaming_content),
                b"".join(client.get(f"{base}.json", query).streaming_content)) \
            == exports[repr(query)], query


def test_a_gantt_is_read_by_what_the_index_found(texts, client):
    """A figure small enough to be a Gantt reads only the events the index selected: none for
    a term no event holds, the ids of a term's matches; the same bytes as the database's."""
    url = f"/api/v1/incidents/{texts.pk}/figure/"
    queries = [{"q": "crashloop"}, {"q": "no-such-text"}, {"q": "obj", "user": "alice"},
               {"name": "middle"}, {"code": "599"}, {"q": "ß", "lanes": "actor"}]
    figures = {}
    for query in queries:
        sql = _event_queries(client, url, query)
        figures[repr(query)] = client.get(url, query).content
        body = json.loads(figures[repr(query)])
        assert body["meta"]["mode"] == "gantt", query
        if body["meta"]["total"] == 0:
            assert sql == [], query
        elif "q" in query:
            assert any('"timelines_event"."id" IN' in s for s in sql), query
    assert json.loads(figures[repr({"q": "crashloop"})])["meta"]["total"] == 3
    columns.discard(texts.pk)
    for query in queries:
        assert client.get(url, query).content == figures[repr(query)], query


def test_the_text_filter_skips_blocks_whose_trigrams_miss_the_term(tmp_path):
    """Writer and reader alone: blocks of 4096 texts; a term is searched only in the blocks
    whose filter holds its trigrams, and found there exactly as ``in`` finds it."""
    rng = random.Random(3)
    words = ["POD", "LEASE", "KUBE-SYSTEM", "WATCH", "GET", "NODE-", "/API/V1/"]
    texts = ["".join(rng.choice(words) for _ in range(rng.randint(1, 6))) + str(n % 977)
             for n in range(3 * textblocks.BLOCK + 5)]
    texts[5000] += "RARE-NEEDLE"
    writer = textblocks.Writer(tmp_path)
    for start in range(0, len(texts), 1000):
        part = [(t.encode(), b"", b"") for t in texts[start:start + 1000]]
        writer.add(*textblocks.join_events(part))
    writer.close()
    blocks = textblocks.TextBlocks(tmp_path)
    assert blocks.blocks == 4
    assert blocks.candidates([b"RARE-NEEDLE"]).tolist() == [False, True, False, False]
    assert not blocks.candidates([b"NO-SUCH-TEXT"]).any()
    for term in (b"RARE-NEEDLE", b"LEASE976", b"E-S", b"9", b"KUBE-SYSTEMPOD"):
        found = blocks.matches([term], 0, len(texts), blocks.candidates([term]))
        assert np.flatnonzero(found).tolist() == \
            [n for n, t in enumerate(texts) if term.decode() in t], term
        # a window of the positions answers the same as the whole, sliced
        assert blocks.matches([term], 4000, 9000, blocks.candidates([term])).tolist() == \
            found[4000:9000].tolist()


# --- the same on SQLite (the embedded default): its LIKE folds ASCII letters only ---------------

@pytest.mark.embedded
def test_sqlite_every_term_gives_the_same_pages_with_and_without_the_index(texts, client):
    test_every_term_gives_the_same_pages_with_and_without_the_index(texts, client)


@pytest.mark.embedded
def test_sqlite_the_index_finds_exactly_what_the_database_finds(texts):
    test_the_index_finds_exactly_what_the_database_finds(texts)


@pytest.mark.embedded
def test_sqlite_a_term_no_event_holds_reads_no_event(texts, client):
    test_a_term_no_event_holds_reads_no_event(texts, client)


def test_the_text_is_folded_here_where_that_folds_it_as_postgresql_does(
        incident, monkeypatch):
    """The build reads ASCII chunks as stored and folds them itself, and has PostgreSQL fold
    the others (non-ASCII letters, separators inside a value): the blocks hold exactly what
    PostgreSQL's ``upper`` of every value, stand-ins for separators, gives."""
    monkeypatch.setattr(textblocks, "_TEXT_CHUNK", 50)
    _store(incident, _text_rows())
    folded = " || E'\\x02' || ".join(
        f"translate(upper({c}), E'\\x01\\x02', E'\\x03\\x03')" for c in textblocks.TEXT_COLUMNS)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT string_agg({folded}, E'\\x01' ORDER BY received, id)"
                       " FROM timelines_event WHERE incident_id = %s", [incident.pk])
        expected = cursor.fetchone()[0].encode("utf-8")
        cursor.execute("SELECT received FROM timelines_event WHERE incident_id = %s"
                       " ORDER BY received, id", [incident.pk])
        received = np.array([columns.microseconds(r) for (r,) in cursor.fetchall()])

    class Collect:
        def __init__(self):
            self.blobs = []

        def add(self, blob, events):
            self.blobs.append(blob)

    for here in (True, False):
        monkeypatch.setattr(textblocks, "_folds_here", lambda here=here: here)
        collect = Collect()
        with CaptureQueriesContext(connection) as queries:
            textblocks.read_postgres(incident.pk, received, collect)
        assert textblocks.EVENT.join(b for b in collect.blobs if b) == expected
        by_postgres = sum("upper(" in q["sql"] for q in queries.captured_queries)
        chunks = len(collect.blobs)
        if here:  # the odd texts' chunks only
            assert 0 < by_postgres < chunks > 10
        else:
            assert by_postgres == chunks
