"""The free text of an incident's events in its column index, so that the text filter ``q`` is
answered like the other filters: a term that no event holds without reading the events, and a
page of a rare one by the ids of its matches.

``q`` matches an event when its ``request_uri``, ``message`` or ``name`` contains the term, in
any case (``filters.AllTextOf``: Django's ``icontains``). The database reads every event's text
to find a term that no event holds (7.6–8.8 s for 10M events, bench/README.md "Scale
benchmark"), and walks in time order past every event between two rare matches. Here the text is
kept beside the column index's arrays, in the same order (``received``, then ``id``):

- **blocks** of ``BLOCK`` consecutive events, each the events' texts joined (fields by ``\\x02``,
  events by ``\\x01``) and compressed on its own with LZ4 (``text.bin``, ``text-offsets.npy``);
- a **trigram filter** per block: one bit per hashed trigram of its texts (``BITS`` bits per
  block, stored one row per bit over the blocks, ``text-bloom.npy``), so that the blocks that
  may hold a term of three or more bytes are an AND of a few rows of bits. A block whose bits
  say no cannot hold the term; one whose bits say yes is opened and searched.

The build reads the texts from the database in the index's order (``read_postgres``, or
``read_rows`` through the ORM) into a ``Writer``; a reader maps them (``TextBlocks``).

The texts are stored as the database compares them: ``icontains`` compares ``UPPER(column)``
with ``UPPER(term)`` on PostgreSQL, and on SQLite uses ``LIKE``, which folds ASCII letters
only. The build takes the upper case from the database itself (PostgreSQL: ASCII text is
folded here when the database's ``upper`` folds it so, ``read_postgres``) or folds ASCII
(SQLite), and a term is folded the same way when it is looked for (``fold``), so a match here is
a match there, character for character; tests compare both on every term kind. The separators
and ``\\x03``, which stands for them inside a value, are never part of a term that the index
serves (``servable``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path

import lz4.block
import numpy as np
from django.db import connection

from ..figures.build import moment

BLOCK = 4096  # events per block
BITS = 1 << 16  # bits of a block's trigram filter
_SHIFT = 32 - 16  # a trigram's hash keeps its top 16 bits
_HASH = np.uint32(0x9E3779B1)  # Fibonacci hashing
EVENT, FIELD, STAND_IN = b"\x01", b"\x02", b"\x03"
_RESERVED = (EVENT, FIELD, STAND_IN)
_OPEN_BLOCKS = 32  # decompressed blocks kept per index
# the columns the text filter ``q`` searches (``filters.EventFilterSet.q``), in stored order
TEXT_COLUMNS = ("request_uri", "message", "name")
_TEXT_CHUNK = 65_536  # events per query while the text is read from PostgreSQL
_FETCH_ROWS = 50_000  # rows per fetch while it is read through the ORM


def fold_ascii(text: str) -> bytes:
    """A value as SQLite's LIKE compares it: ASCII letters in upper case, the rest as it is."""
    return text.encode("utf-8").upper()  # bytes.upper() changes ASCII letters only


def fold(terms: list[str], case: str) -> list[bytes] | None:
    """The text filter's terms as an index of this ``case`` holds text: "upper", PostgreSQL's
    ``upper()`` of each (asked of PostgreSQL), or "ascii", its ASCII letters in upper case
    (SQLite). None when one cannot be looked for (it holds a separator)."""
    if case == "upper":
        with connection.cursor() as cursor:
            cursor.execute("SELECT " + ", ".join(["upper(%s)"] * len(terms)), terms)
            folded = [t.encode("utf-8") for t in cursor.fetchone()]
    else:
        folded = [fold_ascii(t) for t in terms]
    return folded if all(servable(t) for t in folded) else None


def servable(term: bytes) -> bool:
    """Whether a folded term can be looked for here: not empty, no separator or stand-in."""
    return bool(term) and not any(mark in term for mark in _RESERVED)


def trigram_bits(blob: bytes) -> np.ndarray:
    """The filter bits (0..BITS-1) of the trigrams of ``blob`` that do not cross a separator;
    repeated bits included."""
    data = np.frombuffer(blob, dtype=np.uint8)
    if data.size < 3:
        return np.empty(0, dtype=np.uint32)
    first, second, third = data[:-2], data[1:-1], data[2:]
    keep = (first > 2) & (second > 2) & (third > 2)
    grams = (first.astype(np.uint32) << 16) | (second.astype(np.uint32) << 8) | third
    return (grams[keep] * _HASH) >> _SHIFT


class Writer:
    """Writes the text files of an index from the events' texts in the index's order: each
    ``add`` takes the folded texts of the next events (fields joined by ``FIELD``, a field's
    own separators and stand-ins replaced by ``STAND_IN``), joined by ``EVENT``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._out = (folder / "text.bin").open("wb")
        self._offsets = [0]
        self._bits: list[np.ndarray] = []  # each block's filter, packed (BITS / 8 bytes)
        self._pending: list[bytes] = []  # whole events not yet in a block
        self.events = 0

    def add(self, blob: bytes, events: int) -> None:
        if events == 0:
            return
        if blob.count(EVENT) != events - 1:
            raise ValueError(f"{events} events expected, {blob.count(EVENT) + 1} given")
        self._pending.extend(blob.split(EVENT))
        self.events += events
        while len(self._pending) >= BLOCK:
            self._block(self._pending[:BLOCK])
            del self._pending[:BLOCK]

    def _block(self, texts: list[bytes]) -> None:
        blob = EVENT.join(texts)
        seen = np.zeros(BITS, dtype=bool)
        seen[trigram_bits(blob)] = True
        self._bits.append(np.packbits(seen))
        # LZ4: a block of 360 KB is compressed in 0.4 ms and read back in 0.07 ms (zlib at
        # level 1: 2 ms and 0.7 ms, for two thirds of the size)
        packed = lz4.block.compress(blob, store_size=True)
        self._out.write(packed)
        self._offsets.append(self._offsets[-1] + len(packed))

    def close(self) -> None:
        if self._pending:
            self._block(self._pending)
            self._pending = []
        self._out.close()
        np.save(self.folder / "text-offsets.npy", np.array(self._offsets, dtype=np.int64))
        # one row per bit, one bit per block in each row: a term's blocks are an AND of rows.
        # Turned a slice of bits at a time (at most 16 MB of bools for 10M events).
        blocks = len(self._bits)
        filters = np.stack(self._bits) if blocks else np.zeros((0, BITS // 8), dtype=np.uint8)
        self._bits = []
        rows = np.zeros((BITS, (blocks + 7) // 8), dtype=np.uint8)
        step = 512  # bytes of each block's filter per slice
        for first in range(0, BITS // 8, step):
            bits = np.unpackbits(filters[:, first:first + step], axis=1)  # blocks × bits
            rows[first * 8:(first + step) * 8] = np.packbits(bits, axis=0).T
        np.save(self.folder / "text-bloom.npy", rows)


def join_events(texts: Iterable[tuple[bytes, ...]]) -> tuple[bytes, int]:
    """(blob, events) of events given as their folded fields (the ASCII-folding path)."""
    events = [FIELD.join(_stand_in(f) for f in fields) for fields in texts]
    return EVENT.join(events), len(events)


def _stand_in(value: bytes) -> bytes:
    for mark in (EVENT, FIELD):
        value = value.replace(mark, STAND_IN)
    return value


class TextBlocks:
    """The text files of one index, mapped."""

    def __init__(self, folder: Path) -> None:
        self._data = np.load(folder / "text-offsets.npy")
        self._packed = np.memmap(folder / "text.bin", dtype=np.uint8, mode="r") \
            if self._data[-1] else np.empty(0, dtype=np.uint8)
        self._bloom = np.load(folder / "text-bloom.npy", mmap_mode="r")
        self.blocks = len(self._data) - 1
        self._open: OrderedDict[int, tuple[bytes, np.ndarray]] = OrderedDict()
        self._lock = threading.Lock()  # the index is shared by a process's threads

    def candidates(self, terms: Iterable[bytes]) -> np.ndarray:
        """One bool per block: whether it may hold every term (False: it holds none of the
        events matching them all)."""
        rows: list[np.ndarray] = []
        for term in terms:
            bits = np.unique(trigram_bits(term))  # none for a term under three bytes
            rows.extend(np.asarray(self._bloom[int(bit)]) for bit in bits)
        if not rows:
            return np.ones(self.blocks, dtype=bool)
        both = np.bitwise_and.reduce(np.stack(rows), axis=0)
        return np.unpackbits(both, count=self.blocks).astype(bool)

    def matches(self, terms: list[bytes], begin: int, end: int, candidates: np.ndarray,
                wanted: np.ndarray | None = None) -> np.ndarray:
        """One bool per event ``begin:end`` (positions in the index): whether its text holds
        every term. Only the blocks ``candidates`` allows are opened, and of those only the
        ones holding an event that ``wanted`` (one bool per event ``begin:end``) keeps."""
        found = np.zeros(end - begin, dtype=bool)
        for block in range(begin // BLOCK, (end - 1) // BLOCK + 1 if end > begin else 0):
            if not candidates[block]:
                continue
            first = block * BLOCK
            low, high = max(begin, first), min(end, first + BLOCK)
            if wanted is not None and not wanted[low - begin:high - begin].any():
                continue
            hits = self._block_matches(block, terms)
            high = min(high, first + hits.size)
            found[low - begin:high - begin] = hits[low - first:high - first]
        return found

    def _block_matches(self, block: int, terms: list[bytes]) -> np.ndarray:
        blob, starts = self._read(block)
        every = np.ones(starts.size, dtype=bool)
        for term in terms:
            every &= _events_holding(blob, starts, term)
        return every

    def _read(self, block: int) -> tuple[bytes, np.ndarray]:
        """A block's texts and where each event's starts in them (kept open for the next
        query)."""
        with self._lock:
            if block in self._open:
                self._open.move_to_end(block)
                return self._open[block]
        blob = lz4.block.decompress(self._packed[self._data[block]:self._data[block + 1]])
        separators = np.flatnonzero(np.frombuffer(blob, dtype=np.uint8) == EVENT[0])
        starts = np.concatenate(([0], separators + 1))
        with self._lock:
            self._open[block] = (blob, starts)
            while len(self._open) > _OPEN_BLOCKS:
                self._open.popitem(last=False)
        return blob, starts


def _events_holding(blob: bytes, starts: np.ndarray, term: bytes) -> np.ndarray:
    """One bool per event of a block: whether its text holds ``term`` (which holds no
    separator, so a match never crosses events or fields). Every place where the term's first
    byte is, narrowed byte by byte: a common term costs no more than a rare one (a loop over
    ``bytes.find`` took 3 µs per match)."""
    found = np.zeros(starts.size, dtype=bool)
    data = np.frombuffer(blob, dtype=np.uint8)
    places = data.size - len(term) + 1
    if places <= 0:
        return found
    at = np.flatnonzero(data[:places] == term[0])
    for offset in range(1, len(term)):
        if not at.size:
            break
        at = at[data[at + offset] == term[offset]]
    found[np.searchsorted(starts, at, "right") - 1] = True
    return found


def read_postgres(incident_id: int, received: np.ndarray, writer: Writer) -> None:
    """The events' folded texts, in the index's order, into ``writer``: joined by PostgreSQL
    ``_TEXT_CHUNK`` events at a time, a chunk being a time range (``received`` sorted: ties
    never straddle two chunks), and folded as ``icontains`` compares them (``upper``).

    A chunk is read as it is stored and folded here when that gives what PostgreSQL's
    ``upper`` gives (``_folds_here``: ASCII text, on a database whose ``upper`` changes ASCII
    letters only) and no value holds a separator; else PostgreSQL folds that chunk and puts
    stand-ins for the separators (``upper`` and ``translate`` of every value: 1.5 s of the
    2.6 s that 500,000 events took)."""
    plain = " || E'\\x02' || ".join(TEXT_COLUMNS)
    folded = " || E'\\x02' || ".join(
        f"translate(upper({column}), E'\\x01\\x02', E'\\x03\\x03')" for column in TEXT_COLUMNS)
    sql = ("SELECT count(*), string_agg({}, E'\\x01' ORDER BY received, id) FROM timelines_event"
           " WHERE incident_id = %s AND received >= %s AND received < %s")
    if not received.size:
        return
    here = _folds_here()
    cuts = np.unique(received[_TEXT_CHUNK::_TEXT_CHUNK])
    bounds = [int(received[0]), *cuts.tolist(), int(received[-1]) + 1]
    with connection.cursor() as cursor:
        for low, high in zip(bounds, bounds[1:], strict=False):
            expected = int(np.searchsorted(received, high, "left")
                           - np.searchsorted(received, low, "left"))
            params = [incident_id, moment(low), moment(high)]
            blob = None
            if here:
                cursor.execute(sql.format(plain), params)
                count, text = cursor.fetchone()
                blob = (text or "").encode("utf-8")
                if (blob.isascii() and blob.count(EVENT) == max(count - 1, 0)
                        and blob.count(FIELD) == count * (len(TEXT_COLUMNS) - 1)):
                    blob = blob.upper()
                else:
                    blob = None
            if blob is None:
                cursor.execute(sql.format(folded), params)
                count, text = cursor.fetchone()
                blob = (text or "").encode("utf-8")
            if count != expected:
                raise ValueError(f"incident {incident_id}: {count} events between {low} and"
                                 f" {high} µs, the index holds {expected}")
            writer.add(blob, count)


_ASCII = bytes(range(1, 128))
_folds_here_of: dict[tuple, bool] = {}


def _folds_here() -> bool:
    """Whether this database's ``upper`` folds ASCII text as ``bytes.upper`` does (its letters
    a-z, nothing else): asked once per database. Not so under a Turkish locale, say, where
    ``upper('i')`` is 'İ'."""
    key = (connection.settings_dict.get("HOST"), connection.settings_dict.get("PORT"),
           connection.settings_dict.get("NAME"))
    if key not in _folds_here_of:
        with connection.cursor() as cursor:
            cursor.execute("SELECT upper(%s)", [_ASCII.decode("ascii")])
            _folds_here_of[key] = cursor.fetchone()[0].encode("utf-8") == _ASCII.upper()
    return _folds_here_of[key]


def read_rows(incident_id: int, writer: Writer) -> None:
    """``read_postgres`` through the ORM (the embedded default), folded as SQLite's LIKE
    compares (ASCII letters only)."""
    from ..models import Event

    rows = Event.objects.filter(incident_id=incident_id).order_by("received", "id").values_list(
        *TEXT_COLUMNS).iterator(chunk_size=_FETCH_ROWS)
    chunk: list[tuple[bytes, ...]] = []
    for values in rows:
        chunk.append(tuple(fold_ascii(v) for v in values))
        if len(chunk) == BLOCK:
            writer.add(*join_events(chunk))
            chunk = []
    writer.add(*join_events(chunk))
