"""Fuzzing the parser registry as a whole: any bytes (real fixture files cut, edited and spliced,
or noise), given to every format's ``sniff`` and ``parse`` and to ``detect`` and
``describe_unknown``, give an answer: a bool, rows, or ``InputError`` (the documented refusal),
never another exception. No database. See ``fuzzing``.
"""

from __future__ import annotations

import gzip
import random

from timelines.parsers import FORMATS, InputError, describe_unknown, detect
from timelines.parsers.base import ParseHints, TimesEvidence

from .fuzzing import FIXTURES, fuzz, moment, parse_all

SAMPLES = [path.read_bytes()[:6000] for path in sorted(FIXTURES.rglob("*"))
           if path.is_file() and path.suffix in (".log", ".json", ".yaml", ".txt")]
EDITS = [b"", b"\n", b"\r\n", b"\x00", b"\xff", b'"', b"{", b"}", b"[", b"]", b"---\n", b"- ",
         b": ", b"\\", b"\t", b"I0714 06:27:08.262884 1 a.go:1] ", b"Trace[1]: ", b"\xef\xbb\xbf",
         b'{"log":"x\\n","time":"2021-07-14T06:27:08Z"}', b"2021-07-14T06:27:08Z stdout P ",
         b"Jul 14 06:27:08 n kubelet[1]: ", b"-- Logs begin at Mon 2021-07-12 end at x --\n"]


def junk(rng: random.Random) -> bytes:
    if rng.random() < 0.15:
        return rng.randbytes(rng.randrange(300))
    data = bytearray(rng.choice(SAMPLES))
    data = data[rng.randrange(len(data) // 2 + 1):][: rng.randrange(1, 3000)]
    for _ in range(rng.randint(0, 6)):
        at = rng.randrange(len(data) + 1)
        data[at:at + rng.randint(0, 3)] = rng.choice(EDITS)
    if rng.random() < 0.2:
        data += rng.choice(SAMPLES)[: rng.randrange(800)]
    if rng.random() < 0.1:
        packed = gzip.compress(bytes(data), mtime=0)
        return packed[: rng.randrange(10, len(packed) + 1)]  # maybe a cut gzip
    return bytes(data)


def test_any_bytes_get_an_answer_from_every_parser(tmp_path):
    path = tmp_path / "upload.bin"
    evidence = TimesEvidence([moment(random.Random(1))])

    def check(data: bytes) -> None:
        head = data[:65536]
        for fmt in FORMATS:
            assert isinstance(fmt.sniff(head, "upload.log"), bool)
            hints = ParseHints(year=None, evidence=evidence) if fmt.name in (
                "klog", "text-log") else None
            rows, _report, error = parse_all(fmt, data, hints=hints)
            assert rows or error, fmt.name  # nothing found is an InputError
        detect(head, "upload.log")
        path.write_bytes(data)
        assert describe_unknown(path)

    fuzz(check, junk)


def test_input_error_is_the_only_refusal():
    """The registry's parsers know ``InputError``: it is what ``parse_all`` lets through."""
    assert issubclass(InputError, Exception)
    assert {fmt.name for fmt in FORMATS} >= {"audit", "k8s-events", "klog", "text-log",
                                             "gke-audit", "gke-log", "eks-cloudwatch",
                                             "aks-diagnostics", "otlp-audit", "legacy-audit"}
