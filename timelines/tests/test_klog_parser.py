"""``timelines.parsers.klog``: pure parsing of Kubernetes component logs (klog), no database.

Expected values are derived in the test from the input (header lines counted with the test's own
regular expressions, times read from the lines here), never copied from what the parser produced.
"""

from __future__ import annotations

import gzip
import io
import re
import tarfile
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest

from timelines.parsers.base import InputError, ParseHints, Report
from timelines.parsers.klog import FORMAT, parse, sniff
from timelines.parsers.redact import Redactor

_FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures"
KIND_FILES = ["kind-kube-apiserver.txt", "kind-kube-controller-manager.txt"]
MUST_GATHER = _FIXTURES / "bundles" / "openshift-must-gather-aws.tar.xz"

# The test's own reading of a klog header: Lmmdd hh:mm:ss.uuuuuu thread file:line]
HEADER = re.compile(r"([IWEF])(\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{6}) +(\d+) (\S+?):(\d+)\] ")
PREFIX = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.(\d+)Z ")
LEVELS = {"I": "info", "W": "warning", "E": "error", "F": "fatal"}


# --- helpers -----------------------------------------------------------------------------------

def run(data: bytes, name: str = "component.log", **kwargs) -> tuple[list, Report]:
    report = Report(name)
    rows = list(parse(io.BytesIO(data), report, **kwargs))
    return rows, report


def logs(rows: list) -> list:
    return [row for row in rows if row.kind == "log"]


def header_lines(text: str) -> list[tuple[int, re.Match[str]]]:
    """(line number, header match) of every line that starts with a klog header."""
    found = []
    for number, line in enumerate(text.split("\n"), start=1):
        match = HEADER.match(line)
        if match:
            found.append((number, match))
    return found


def header_time(match: re.Match[str], year: int) -> datetime:
    month, day, hour, minute, second, micro = (int(match.group(i)) for i in range(2, 8))
    return datetime(year, month, day, hour, minute, second, micro, tzinfo=UTC)


def klog_line(moment: datetime, message: str, level: str = "I", location: str = "server.go:632",
              thread: int = 1) -> str:
    return (f"{level}{moment:%m%d %H:%M:%S}.{moment.microsecond:06d} {thread:>7} {location}] "
            f"{message}")


def cri(moment: datetime, text: str, stream: str = "stderr", tag: str = "F") -> str:
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{moment.microsecond:06d}123Z {stream} {tag} {text}"


@pytest.fixture(scope="module")
def must_gather_logs() -> dict[str, bytes]:
    """Every pod log (``.../logs/current.log``) and the apiserver logs of the must-gather."""
    members = {}
    with tarfile.open(MUST_GATHER) as archive:
        for member in archive:
            if member.isfile() and re.search(
                    r"/namespaces/[^/]+/pods/[^/]+/[^/]+/[^/]+/logs/current\.log$", member.name):
                handle = archive.extractfile(member)
                assert handle is not None
                members[member.name.split("/namespaces/", 1)[1]] = handle.read()
    return members


# --- the kind fixtures -------------------------------------------------------------------------

@pytest.mark.parametrize("name", KIND_FILES)
def test_kind_log_gives_one_row_per_header_line_with_its_severity(fixtures_dir, name):
    text = (fixtures_dir / "klog" / name).read_text()
    headers = header_lines(text)
    rows, report = run(text.encode(), name, hints=ParseHints(year=2021))
    assert [row.kind for row in rows] == ["log"] * len(headers)
    assert [row.line for row in rows] == [number for number, _ in headers]
    assert Counter(row.severity for row in rows) == Counter(
        LEVELS[match.group(1)] for _, match in headers)
    assert [row.received for row in rows] == [header_time(m, 2021) for _, m in headers]
    first_number, first = headers[0]
    assert rows[0].message == text.split("\n")[first_number - 1][first.end():]


@pytest.mark.parametrize("name", KIND_FILES)
def test_kind_log_skips_the_undated_flag_line_before_the_first_entry(fixtures_dir, name):
    text = (fixtures_dir / "klog" / name).read_text()
    first_line = text.split("\n")[0]
    assert not HEADER.match(first_line) and first_line.startswith("Flag --")
    rows, report = run(text.encode(), name)
    assert report.skipped == 1
    assert report.errors[0].startswith(f"{name}:1: ")
    assert "no klog header" in report.errors[0]
    assert all("Flag --" not in row.message for row in rows)


def test_kind_log_fields_of_the_first_entry(fixtures_dir):
    name = "kind-kube-apiserver.txt"
    text = (fixtures_dir / "klog" / name).read_text()
    _, first = header_lines(text)[0]
    rows, _ = run(text.encode(), name, hints=ParseHints(node="kind-control-plane", year=2021))
    row = rows[0]
    expected = header_time(first, 2021)
    assert row.received == row.completed == expected and row.received.tzinfo is not None
    assert row.duration_ms == 0.0
    assert row.annotations == {"location": f"{first.group(9)}:{first.group(10)}",
                               "thread": first.group(8)}
    assert row.component == "kube-apiserver" and row.node == "kind-control-plane"
    assert row.source == name
    stored = orjson.loads(row.raw)
    assert stored["message"] == row.message and stored["severity"] == "info"
    assert row.audit_id.startswith("log:") and row.audit_id.endswith(":0")


@pytest.mark.parametrize(("name", "component"), [
    ("kind-kube-apiserver.txt", "kube-apiserver"),
    ("kind-kube-controller-manager.txt", "kube-controller-manager"),
    ("kube-scheduler-master-0.log.gz", "kube-scheduler"),
    ("kubelet.log", "kubelet"),
    ("openshift-apiserver-operator.log", ""),
    ("current.log", ""),
])
def test_component_comes_from_the_file_name(name, component):
    line = klog_line(datetime(2021, 7, 14, 6, 27, 8, 262884, tzinfo=UTC), "hello")
    rows, _ = run(f"{line}\n".encode(), name)
    assert rows[0].component == component


def test_component_from_hints_wins_over_the_file_name():
    line = klog_line(datetime(2021, 7, 14, 6, 27, 8, tzinfo=UTC), "hello")
    rows, _ = run(f"{line}\n".encode(), "kube-apiserver.log",
                  hints=ParseHints(component="etcd", node="n1"))
    assert (rows[0].component, rows[0].node) == ("etcd", "n1")


# --- the year ----------------------------------------------------------------------------------

def test_year_comes_from_hints_and_the_reason_is_noted(fixtures_dir):
    text = (fixtures_dir / "klog" / "kind-kube-controller-manager.txt").read_text()
    reason = "taken from the bundle's file times"
    rows, report = run(text.encode(), "kcm.txt", hints=ParseHints(year=2019, year_reason=reason))
    assert {row.received.year for row in rows} == {2019}
    assert any("2019" in note and reason in note for note in report.notes)


def test_year_defaults_to_the_current_one_unless_that_is_in_the_future(fixtures_dir):
    text = (fixtures_dir / "klog" / "kind-kube-apiserver.txt").read_text()
    _, first = header_lines(text)[0]
    now = datetime.now(UTC)
    expected = now.year
    if header_time(first, now.year) > now + timedelta(days=1):
        expected -= 1
    rows, report = run(text.encode(), "apiserver.txt")
    assert rows[0].received == header_time(first, expected)
    year_notes = [note for note in report.notes if f"year {expected}" in note]
    assert year_notes and "assumed" in year_notes[0]


@dataclass(frozen=True)
class HintsWithCollection(ParseHints):
    """ParseHints with the collection time proposed for base.py (an upper bound for dates)."""

    collected: datetime | None = None


def test_collection_time_in_january_puts_december_lines_in_the_year_before():
    lines = [klog_line(datetime(2021, 12, 30, 8, 0, 0, 1, tzinfo=UTC), "december"),
             klog_line(datetime(2022, 1, 2, 9, 0, 0, 2, tzinfo=UTC), "january")]
    collected = datetime(2022, 1, 3, 12, 0, tzinfo=UTC)
    hints = HintsWithCollection(year=2022, year_reason="collection time 2022-01-03",
                                collected=collected)
    rows, report = run("\n".join(lines).encode(), hints=hints)
    assert [row.received for row in rows] == [datetime(2021, 12, 30, 8, 0, 0, 1, tzinfo=UTC),
                                              datetime(2022, 1, 2, 9, 0, 0, 2, tzinfo=UTC)]
    assert any("2021" in note and "collection time 2022-01-03" in note for note in report.notes)


def test_december_to_january_advances_the_year_and_says_where():
    lines = [
        klog_line(datetime(2020, 12, 31, 23, 59, 58, 1, tzinfo=UTC), "before midnight"),
        klog_line(datetime(2021, 1, 1, 0, 0, 1, 2, tzinfo=UTC), "after midnight"),
        klog_line(datetime(2021, 1, 1, 0, 0, 2, 3, tzinfo=UTC), "later"),
    ]
    rows, report = run("\n".join(lines).encode(), hints=ParseHints(year=2020))
    assert [row.received for row in rows] == [
        datetime(2020, 12, 31, 23, 59, 58, 1, tzinfo=UTC),
        datetime(2021, 1, 1, 0, 0, 1, 2, tzinfo=UTC),
        datetime(2021, 1, 1, 0, 0, 2, 3, tzinfo=UTC),
    ]
    assert any("2021" in note and "line 2" in note for note in report.notes)


def test_impossible_date_is_skipped_and_the_other_lines_kept():
    good = klog_line(datetime(2021, 2, 27, 10, 0, 0, tzinfo=UTC), "fine")
    bad = "I0230 10:00:01.000000       1 server.go:1] thirtieth of February"
    rows, report = run(f"{good}\n{bad}\n{good}\n".encode(), hints=ParseHints(year=2021))
    assert [row.line for row in rows] == [1, 3]
    assert report.skipped == 1 and report.errors[0].startswith("component.log:2: ")


# --- multi-line entries ------------------------------------------------------------------------

def test_lines_without_a_header_continue_the_entry_before_them():
    start = datetime(2021, 7, 14, 6, 27, 8, 262884, tzinfo=UTC)
    panic = ["panic: runtime error: invalid memory address", "", "goroutine 1 [running]:",
             "main.main()", "\t/go/src/main.go:12 +0x1d"]
    lines = [klog_line(start, "about to fail", "F", "main.go:11"), *panic,
             klog_line(start + timedelta(seconds=1), "restarted")]
    rows, _ = run("\n".join(lines).encode(), hints=ParseHints(year=2021))
    assert len(rows) == 2
    assert rows[0].message == "\n".join(["about to fail", *panic])
    assert rows[0].severity == "fatal" and rows[0].line == 1
    assert rows[1].line == len(lines)


# --- identity ----------------------------------------------------------------------------------

def test_keys_are_stable_across_names_and_distinct_for_repeated_lines():
    moment = datetime(2021, 7, 14, 6, 27, 8, 1, tzinfo=UTC)
    line = klog_line(moment, "same text")
    data = "\n".join([line, line, klog_line(moment, "other text")]).encode()
    hints = ParseHints(component="kube-apiserver", node="n1", year=2021)
    first, _ = run(data, "a.log", hints=hints)
    again, _ = run(data, "renamed.log", hints=hints)
    other_node, _ = run(data, "a.log", hints=ParseHints(component="kube-apiserver", node="n2",
                                                          year=2021))
    keys = [row.audit_id for row in first]
    assert keys == [row.audit_id for row in again]
    assert len(set(keys)) == 3
    assert keys[0].rsplit(":", 1)[0] == keys[1].rsplit(":", 1)[0]
    assert (keys[0][-2:], keys[1][-2:]) == (":0", ":1")
    assert not set(keys) & {row.audit_id for row in other_node}


def test_the_same_entries_behind_a_runtime_prefix_keep_their_keys():
    moment = datetime(2021, 7, 14, 6, 27, 8, 262884, tzinfo=UTC)
    lines = [klog_line(moment, "one"), klog_line(moment + timedelta(seconds=1), "two")]
    bare, _ = run("\n".join(lines).encode(), hints=ParseHints(year=2021))
    wrapped, _ = run("\n".join(cri(moment, line) for line in lines).encode())
    assert [(r.audit_id, r.received) for r in bare] == [(r.audit_id, r.received) for r in wrapped]


# --- runtime prefixes --------------------------------------------------------------------------

def test_cri_prefixed_lines_take_the_year_from_the_runtime_timestamp():
    moment = datetime(2019, 3, 5, 10, 11, 12, 131415, tzinfo=UTC)
    lines = [cri(moment, klog_line(moment, "serving", "W")),
             cri(moment, "  a continuation written in the same write"),
             cri(moment + timedelta(seconds=2), klog_line(moment + timedelta(seconds=2), "next"))]
    data = "\n".join(lines).encode()
    assert sniff(data, "current.log")
    rows, report = run(data, hints=ParseHints(year=2030))  # the line's own year wins
    assert [row.received for row in rows] == [moment, moment + timedelta(seconds=2)]
    assert rows[0].message == "serving\n  a continuation written in the same write"
    assert rows[0].severity == "warning"
    assert any("runtime" in note for note in report.notes)


def test_cri_timestamp_just_after_new_year_keeps_the_klog_time_in_the_old_year():
    logged = datetime(2021, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)
    stamped = datetime(2022, 1, 1, 0, 0, 0, 100, tzinfo=UTC)
    rows, _ = run(cri(stamped, klog_line(logged, "midnight")).encode())
    assert rows[0].received == logged


def test_klog_in_a_local_time_zone_is_moved_to_the_runtime_utc_time():
    stamped = datetime(2021, 7, 14, 6, 27, 8, 262884, tzinfo=UTC)
    local = stamped + timedelta(hours=2)  # the process logs in UTC+2
    rows, report = run(cri(stamped, klog_line(local, "in local time")).encode())
    assert rows[0].received == stamped
    assert any("2.00 h ahead" in note and "-2.00 h" in note for note in report.notes)


def test_cri_partial_lines_are_joined_without_a_newline():
    moment = datetime(2021, 7, 14, 6, 27, 8, 5, tzinfo=UTC)
    line = klog_line(moment, "a long message that the runtime split in two")
    cut = len(line) - 10
    data = f"{cri(moment, line[:cut], tag='P')}\n{cri(moment, line[cut:])}\n".encode()
    rows, _ = run(data)
    assert len(rows) == 1 and rows[0].message == "a long message that the runtime split in two"
    assert rows[0].line == 1


def test_docker_json_lines_are_read_through_their_envelope():
    moment = datetime(2021, 7, 14, 6, 27, 8, 262884, tzinfo=UTC)
    stamp = f"{moment:%Y-%m-%dT%H:%M:%S}.{moment.microsecond:06d}123Z"
    events = [
        {"log": klog_line(moment, "from docker", "E") + "\n", "stream": "stderr", "time": stamp},
        {"log": klog_line(moment, "split ") , "stream": "stderr", "time": stamp},
        {"log": "across two lines\n", "stream": "stderr", "time": stamp},
    ]
    data = b"\n".join(orjson.dumps(event) for event in events) + b"\n"
    assert sniff(data, "container-json.log")
    rows, _ = run(data)
    assert [(row.received, row.severity, row.message) for row in rows] == [
        (moment, "error", "from docker"), (moment, "info", "split across two lines")]


def test_non_klog_output_behind_a_prefix_becomes_its_own_undated_severity_entry():
    moment = datetime(2021, 8, 3, 9, 18, 31, 642941, tzinfo=UTC)
    later = moment + timedelta(minutes=1)
    lines = [f"{moment:%Y-%m-%dT%H:%M:%S}.{moment.microsecond:06d}703Z waiting for certs",
             f"{later:%Y-%m-%dT%H:%M:%S}.{later.microsecond:06d}469Z certs mounted",
             f"{later:%Y-%m-%dT%H:%M:%S}.{later.microsecond:06d}469Z "
             + klog_line(later, "Reading certificate files")]
    rows, report = run("\n".join(lines).encode())
    assert [(row.received, row.severity, row.message) for row in rows] == [
        (moment, "", "waiting for certs"), (later, "", "certs mounted"),
        (later, "info", "Reading certificate files")]
    assert report.skipped == 0


# --- traces ------------------------------------------------------------------------------------

TRACE_URL = "/apis/kopf.dev/v1/namespaces/default/kopfexamples/kopf-example-1"
TRACE_START = (f'Trace[662526312]: "Patch" url:{TRACE_URL},user-agent:kopf/1.32.1,'
               f"client:172.17.0.3 (14-Jul-2021 06:27:06.063) (total time: 2199ms):")
TRACE_STEPS = ['Trace[662526312]: ---"About to apply patch" 3ms (06:27:00.066)',
               'Trace[662526312]: ---"Recorded the audit event" 2183ms (06:27:00.247)']
TRACE_END = "Trace[662526312]: [2.199755066s] [2.199755066s] END"


def _expected_trace_start() -> datetime:
    return datetime(2021, 7, 14, 6, 27, 6, 63000, tzinfo=UTC)


@pytest.mark.parametrize("own_headers", [True, False], ids=["header-per-line", "continuation"])
def test_trace_block_gives_one_trace_row(own_headers):
    logged = datetime(2021, 7, 14, 6, 27, 8, 262884, tzinfo=UTC)
    block = [TRACE_START, *TRACE_STEPS, TRACE_END]
    if own_headers:
        lines = [klog_line(logged, text, location="trace.go:205") for text in block]
    else:
        lines = [klog_line(logged, block[0], location="trace.go:205"), *block[1:]]
    lines.append(klog_line(logged + timedelta(seconds=1), "after the trace"))
    rows, report = run("\n".join(lines).encode(), "kube-apiserver.log")
    traces = [row for row in rows if row.kind == "trace"]
    assert len(traces) == 1
    trace = traces[0]
    start = _expected_trace_start()
    assert trace.received == start
    assert trace.duration_ms == 2199.0
    assert trace.completed == start + timedelta(milliseconds=2199)
    assert trace.verb == "patch"
    assert trace.request_uri == TRACE_URL
    assert trace.user_agent == "kopf/1.32.1"
    assert trace.source_ip == "172.17.0.3"
    assert trace.message == f'"Patch" url:{TRACE_URL},user-agent:kopf/1.32.1,client:172.17.0.3'
    assert trace.annotations["steps"] == "\n".join(
        step.split(": ", 1)[1] for step in TRACE_STEPS)
    assert trace.line == 1 and trace.component == "kube-apiserver"
    assert trace.audit_id.startswith("trace:")
    # The trace's own lines still give log rows.
    headers = sum(1 for line in lines if HEADER.match(line))
    assert len(logs(rows)) == headers
    # No hints: the year of the log rows comes from the trace's full date.
    assert {row.received.year for row in rows} == {2021}
    assert any("trace" in note and "2021" in note for note in report.notes)


def test_trace_start_with_seconds_stuck_at_zero_is_taken_from_the_log_time():
    logged = datetime(2021, 7, 14, 6, 27, 8, 262884, tzinfo=UTC)
    start = TRACE_START.replace("06:27:06.063", "06:27:00.063")
    lines = [klog_line(logged, start, location="trace.go:205"), TRACE_END]
    rows, report = run("\n".join(lines).encode())
    trace = next(row for row in rows if row.kind == "trace")
    assert trace.received == logged - timedelta(milliseconds=2199)
    assert any("seconds" in note for note in report.notes)


def test_trace_without_end_line_is_still_emitted():
    logged = datetime(2021, 7, 14, 6, 27, 8, 262884, tzinfo=UTC)
    rows, _ = run(klog_line(logged, TRACE_START, location="trace.go:205").encode())
    traces = [row for row in rows if row.kind == "trace"]
    assert len(traces) == 1 and traces[0].duration_ms == 2199.0
    assert traces[0].annotations["steps"] == ""


def test_real_apiserver_traces_in_the_must_gather(must_gather_logs):
    name, data = next(
        (name, data) for name, data in sorted(must_gather_logs.items())
        if "/kube-apiserver-ip-" in name and "/kube-apiserver/kube-apiserver/" in name)
    text = data.decode()
    starts = re.findall(r"Trace\[(\d+)\]: (.*) \((\d\d)-Aug-2021 (\d\d:\d\d:\d\d)\.(\d{3})\) "
                        r"\(total time: (\d+)ms\):", text)
    assert starts, "the fixture has traces"
    rows, _ = run(data, name)
    traces = sorted((row for row in rows if row.kind == "trace"), key=lambda row: row.line)
    assert len(traces) == len(starts)
    for trace, (trace_id, description, day, clock, millis, total) in zip(traces, starts,
                                                                          strict=True):
        hour, minute, second = (int(part) for part in clock.split(":"))
        begun = datetime(2021, 8, int(day), hour, minute, second, int(millis) * 1000, tzinfo=UTC)
        assert trace.annotations["trace"] == trace_id
        assert trace.message == description
        assert trace.received == begun
        assert trace.duration_ms == float(total)
        assert trace.completed == begun + timedelta(milliseconds=int(total))
        steps = re.findall(rf"Trace\[{trace_id}\]: (---.*)", text)
        assert trace.annotations["steps"] == "\n".join(steps)


# --- bundles: real pod logs --------------------------------------------------------------------

def _expected_entries(text: str) -> tuple[int, Counter]:
    """Entries of a ``kubectl logs --timestamps`` klog file by the documented rule: a klog header
    starts one; a line without one continues the entry before it when stamped within a second of
    the previous line, else starts an entry with no severity."""
    entries = 0
    severities: Counter = Counter()
    previous: datetime | None = None
    for line in text.split("\n"):
        prefix = PREFIX.match(line)
        if not prefix:
            continue
        stamp = datetime.fromisoformat(prefix.group(1)).replace(
            microsecond=int(prefix.group(2)[:6].ljust(6, "0")), tzinfo=UTC)
        content = line[prefix.end():]
        header = HEADER.match(content)
        if header:
            entries += 1
            severities[LEVELS[header.group(1)]] += 1
        elif previous is not None and abs(stamp - previous) <= timedelta(seconds=1):
            pass  # continues the entry
        elif not content.strip():
            continue  # a blank line on its own
        else:
            entries += 1
            severities[""] += 1
        previous = stamp
    return entries, severities


def test_must_gather_klog_pod_logs_sniff_and_parse(must_gather_logs):
    checked = 0
    for name, data in sorted(must_gather_logs.items()):
        text = data.decode("utf-8", "replace")
        lines = [line for line in text.split("\n") if line.strip()][:40]
        klog_lines = sum(1 for line in lines
                         if HEADER.match(PREFIX.sub("", line, count=1)))
        if not lines or klog_lines * 2 <= len(lines):
            continue
        assert sniff(data[:65536], name), name
        rows, report = run(data, name, hints=ParseHints(component="c", node="n"))
        entries, severities = _expected_entries(text)
        found = logs(rows)
        assert len(found) == entries, name
        assert Counter(row.severity for row in found) == severities, name
        assert report.skipped == 0, name
        assert {row.received.year for row in found} == {2021}, name
        checked += 1
    assert checked > 100


# --- sniffing ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", KIND_FILES)
def test_sniff_accepts_the_kind_logs(fixtures_dir, name):
    assert sniff((fixtures_dir / "klog" / name).read_bytes()[:65536], name)


@pytest.mark.parametrize("path", [
    "audit/audit2rbac-demo.log", "audit/openshift-requestresponse.log",
    "events/cribl-event-watch-stream.json", "events/insights-openshift-machine-api.json",
    "events/kspan-deployment-2-pods.yaml",
])
def test_sniff_rejects_audit_logs_and_events(fixtures_dir, path):
    assert not sniff((fixtures_dir / path).read_bytes()[:65536], path)


def test_sniff_rejects_plain_text_and_journal_text():
    assert not sniff(b"hello\nworld\nnothing here\n", "notes.txt")
    journal = b"Jul 14 06:27:08 node-1 kubelet[1234]: I0714 06:27:08.262884 1 a.go:1] x\n" * 5
    assert not sniff(journal, "kubelet.log")
    assert not sniff(b"", "empty.log")


def test_format_is_registered_under_its_name():
    assert FORMAT.name == "klog" and FORMAT.sniff is sniff and FORMAT.parse is parse


# --- input handling ----------------------------------------------------------------------------

def test_gzip_input_gives_the_same_rows(fixtures_dir, tmp_path):
    source = fixtures_dir / "klog" / "kind-kube-apiserver.txt"
    zipped = tmp_path / "kube-apiserver.log.gz"
    zipped.write_bytes(gzip.compress(source.read_bytes()))
    hints = ParseHints(year=2021)
    with zipped.open("rb") as handle:
        report = Report("kube-apiserver.log.gz")
        from_gzip = list(parse(handle, report, hints=hints))
    plain, _ = run(source.read_bytes(), "kube-apiserver.log.gz", hints=hints)
    assert from_gzip == plain


def test_file_without_entries_is_an_input_error_naming_it():
    with pytest.raises(InputError, match=r"^notes\.txt: .*no klog"):
        run(b"Flag --port has been deprecated\njust text\n", "notes.txt")
    with pytest.raises(InputError, match=r"^empty\.log: "):
        run(b"", "empty.log")


def test_bearer_tokens_and_jwts_in_messages_are_redacted():
    moment = datetime(2021, 7, 14, 6, 27, 8, tzinfo=UTC)
    jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW0ifQ.c2lnbmF0dXJlLXZhbHVl"
    secret = "Authorization: Bearer abcdefghijklmnopqrstuvwxyz0123"
    data = "\n".join([klog_line(moment, f"header {secret}"), klog_line(moment, f"token {jwt}"),
                      klog_line(moment, "nothing secret")]).encode()
    rows, report = run(data, hints=ParseHints(year=2021))
    assert report.redacted == 2
    assert "abcdefghijklmnop" not in rows[0].message and "[REDACTED]" in rows[0].message
    assert jwt not in rows[1].message and jwt.encode() not in rows[1].raw
    unredacted, report = run(data, hints=ParseHints(year=2021),
                             redactor=Redactor(enabled=False))
    assert jwt in unredacted[1].message and report.redacted == 0


def test_progress_is_reported_while_reading():
    moment = datetime(2021, 7, 14, 6, 27, 8, tzinfo=UTC)
    count = 10_000
    data = "\n".join(klog_line(moment + timedelta(milliseconds=i), f"line {i}")
                     for i in range(count)).encode()
    calls: list[tuple[int, int]] = []
    rows, _ = run(data, hints=ParseHints(year=2021),
                  progress=lambda done, rows: calls.append((done, rows)))
    assert len(rows) == count
    assert len(calls) >= 3
    assert calls == sorted(calls) and calls[-1] == (len(data), count)
