"""What the fuzz tests (``test_fuzz_*.py``) share: the hypothesis profile, the runner that counts
generated inputs, and the makers of odd text, broken lines and framings.

Each input is made by a plain function of a ``random.Random`` whose seed hypothesis draws: a
richer hypothesis strategy costs one engine choice per value drawn, and at tens of choices an
input the engine, not the parser, took nine tenths of a run (10,000 inputs per parser must fit
in CI). A failure prints the seed and the input; ``fuzz(…, seeds=[seed])`` replays it.

Deterministic in CI: ``derandomize`` makes every run generate the same inputs, and no example
database is written. ``HINDSIGHT_FUZZ_EXAMPLES`` sets the number of inputs per parser (10,000;
more for a long local run); ``HINDSIGHT_FUZZ_SEED`` set to a number generates other inputs than
CI's, repeatably.
"""

from __future__ import annotations

import gzip
import io
import os
import random
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, example, given, seed, settings
from hypothesis import strategies as st

from timelines.parsers import InputError, Report
from timelines.parsers.redact import redact_strings

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures"
EXAMPLES = int(os.environ.get("HINDSIGHT_FUZZ_EXAMPLES", "10000"))
_SEED = os.environ.get("HINDSIGHT_FUZZ_SEED")

settings.register_profile(
    "hindsight-fuzz",
    max_examples=EXAMPLES,
    derandomize=_SEED is None,
    database=None,
    deadline=None,
    # No shrinking: the input is a function of one seed, which has nothing to shrink.
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=list(HealthCheck),
    print_blob=True,
)
PROFILE = settings.get_profile("hindsight-fuzz")
SEEDS = st.integers(0, 2**64 - 1)


def fuzz(check: Callable[[Any], None], make: Callable[[random.Random], Any],
         examples: int = EXAMPLES, seeds: Iterable[int] = ()) -> int:
    """``check(make(Random(seed)))`` for ``examples`` seeds drawn by hypothesis (plus the
    ``seeds`` given, inputs that once failed), failing unless that many inputs were run.
    Returns the number of inputs."""
    calls = 0

    @settings(PROFILE, max_examples=examples)
    @given(SEEDS)
    def body(value):
        nonlocal calls
        calls += 1
        case = make(random.Random(value))
        try:
            check(case)
        except BaseException as exc:
            exc.add_note(f"seed {value}, input {case!r}"[:4000])
            raise

    for value in seeds:
        body = example(value)(body)
    if _SEED is not None:
        body = seed(int(_SEED))(body)
    body()
    assert calls >= examples, f"only {calls} inputs were generated, {examples} wanted"
    return calls


# --- text ----------------------------------------------------------------------------------------

# Text as logs hold it: anything printable, control characters, quotes, backslashes and the
# characters of the formats themselves (never surrogates: they cannot be UTF-8).
SPECIAL = ["", " ", "\t", "\r", "\x00", "\\", '"', "'", "a\rb", "a\nb", "\\N", "\u2028",
           "\U0001f600", "é", "null", "-- x --", "Trace[1]:", "<none>", "<self>", "]", "}",
           "?access_token=abc", "Bearer abcdefghijklm", "eyJhbGciOiJI.eyJzdWIiOiIx.sig",
           "\\u0000", "%2F", "../..", "x" * 300, "10.0.0.1",
           "system:serviceaccount:kube-system:x", "\x1b[31m", "---", "- a", "key: value", "#"]
ALPHABETS = [
    "abcdefghijklmnopqrstuvwxyz0123456789-._:/",
    "".join(chr(c) for c in range(128)),
    "éß€☃中文ü\u0301\u200b\ufeff\U0001f600\u2028\u2029\x85\xa0",
    '"\\\t\r{}[],:= ',
]


def odd(rng: random.Random) -> str:
    """A short text of the kind that breaks parsers and stores."""
    if rng.random() < 0.4:
        return rng.choice(SPECIAL)
    alphabet = rng.choice(ALPHABETS) + rng.choice(ALPHABETS)
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24)))


def ident(rng: random.Random, number: int) -> str:
    """An identity (auditID, uid, insertId) unique by ``number``, with odd text in it, but not
    text the redactor replaces (a bearer token or JWT in an ID is redacted like any string)."""
    while True:
        text = f"{number}-{odd(rng)}"
        if redact_strings([text]) == 0:
            return text


def moment(rng: random.Random, start: int = 31_536_000, end: int = 4_102_444_800) -> datetime:
    """A time between 1971 and 2100 (by default), with microseconds."""
    return datetime.fromtimestamp(rng.randint(start, end), UTC).replace(
        microsecond=rng.randrange(1_000_000))


def rfc3339(when: datetime, rng: random.Random) -> str:
    """``when`` as RFC 3339 text the way some writer writes it: 0 to 9 fraction digits, Z or an
    offset."""
    offset = rng.choice([0, 0, 0, 60, -330, 840, -720])
    local = when + timedelta(minutes=offset)
    text = local.strftime("%Y-%m-%dT%H:%M:%S")
    digits = rng.randint(0, 9)
    if digits:
        text += "." + f"{local.microsecond:06d}{rng.randrange(1000):03d}"[:digits]
    if offset == 0:
        return text + "Z"
    hours, minutes = divmod(abs(offset), 60)
    return f"{text}{'+' if offset > 0 else '-'}{hours:02d}:{minutes:02d}"


# --- broken lines --------------------------------------------------------------------------------

def broken_line(rng: random.Random, samples: list[bytes]) -> bytes:
    """A line that holds no evidence of any format and cannot join the lines around it into a
    value: a real line cut short, junk starting with a letter (never ``{ [ ] } , :``), invalid
    UTF-8, JSON that is not an object."""
    kind = rng.randrange(4)
    if kind == 0:
        line = rng.choice(samples)
        return line[: rng.randint(1, max(1, len(line) - 1))].rstrip().rstrip(b",:") or b"{"
    if kind == 1:
        return ("x" + odd(rng)).replace("\n", " ").encode()
    if kind == 2:
        return b"\xff" + rng.randbytes(rng.randint(0, 30)).replace(b"\n", b"\xfe")
    return rng.choice([b"42", b'"a string"', b"null", b"true", b"-", b"#", b"\t \x0b",
                       b"\x00\x00", b"\xef\xbb\xbf", b"x" * 3000])


def interleave(valid: list[bytes], broken: list[bytes], rng: random.Random,
               separator: bytes | None = None) -> tuple[bytes, set[int]]:
    """The ``valid`` blocks (a line each, or several: YAML documents, log entries) in order with
    the ``broken`` ones put anywhere between them, each preceded by ``separator`` as a line of
    its own if given. Returns the text and the line numbers of the broken blocks (with their
    separators)."""
    slots = sorted(rng.randint(0, len(valid)) for _ in broken)
    pending = list(zip(slots, broken, strict=True))
    out: list[bytes] = []
    broken_at: set[int] = set()

    def put(block: bytes, is_broken: bool) -> None:
        lines = ([separator] if separator is not None else []) + block.split(b"\n")
        for line in lines:
            out.append(line)
            if is_broken:
                broken_at.add(len(out))

    for index in range(len(valid) + 1):
        while pending and pending[0][0] == index:
            put(pending.pop(0)[1], True)
        if index < len(valid):
            put(valid[index], False)
    return b"\n".join(out) + b"\n", broken_at


def framed(data: bytes, rng: random.Random) -> bytes:
    """``data`` as files arrive: as is, CRLF line ends, a BOM, or gzipped."""
    choice = rng.randrange(5)
    if choice == 1:
        return data.replace(b"\n", b"\r\n")
    if choice == 2:
        return b"\xef\xbb\xbf" + data
    if choice == 3:
        return gzip.compress(data, compresslevel=1, mtime=0)
    return data


# --- running parsers -----------------------------------------------------------------------------

def parse_all(fmt, data: bytes, name: str = "fuzz.log", **kwargs) -> tuple[list, Report, str]:
    """All rows of ``fmt.parse`` on ``data``, its report, and the InputError's text ("" if
    none). Any other exception is a crash and propagates."""
    report = Report(name)
    rows: list = []
    try:
        for row in fmt.parse(io.BytesIO(data), report, **kwargs):
            rows.append(row)
    except InputError as exc:
        return rows, report, str(exc)
    return rows, report, ""


def error_lines(report: Report) -> set[int]:
    """The line numbers in ``report.errors`` (``source:line: reason``)."""
    numbers = set()
    for error in report.errors:
        rest = error[len(report.source) + 1:]
        numbers.add(int(rest.split(":", 1)[0]))
    return numbers
