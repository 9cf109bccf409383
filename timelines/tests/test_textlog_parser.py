"""``timelines.parsers.textlog``: pure parsing of journal text and pod logs, no database.

Expected values are derived in the test from the input (lines counted and times read with the
test's own regular expressions), never copied from what the parser produced.
"""

from __future__ import annotations

import gzip
import io
import re
import tarfile
from collections import Counter
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import orjson
import pytest

from timelines.parsers import klog
from timelines.parsers.base import InputError, ParseHints, Report
from timelines.parsers.redact import Redactor
from timelines.parsers.textlog import FORMAT, parse, sniff

_FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures"
MUST_GATHER = _FIXTURES / "bundles" / "openshift-must-gather-aws.tar.xz"
SONOBUOY = _FIXTURES / "bundles" / "sonobuoy-results-0.10.tar.gz"

# The test's own reading of the shapes.
JOURNAL = re.compile(r"([A-Z][a-z]{2}) (\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{6}))? (\S+) "
                     r"([^\s\[]+?)(?:\[(\d+)\])?: ")
STAMPED = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z(?: |$)")
MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]


# --- helpers -----------------------------------------------------------------------------------

def run(data: bytes, name: str = "node.log", **kwargs) -> tuple[list, Report]:
    report = Report(name)
    rows = list(parse(io.BytesIO(data), report, **kwargs))
    return rows, report


def journal_line(moment: datetime, message: str, host: str = "node-1",
                 program: str = "kubelet", pid: int | None = 1234, precise: bool = False) -> str:
    clock = f"{moment:%H:%M:%S}" + (f".{moment.microsecond:06d}" if precise else "")
    tag = f"{program}[{pid}]" if pid is not None else program
    return f"{moment:%b %d} {clock} {host} {tag}: {message}"


def rfc3339(moment: datetime) -> str:
    return f"{moment.astimezone(UTC):%Y-%m-%dT%H:%M:%S}.{moment.microsecond:06d}789Z"


def extract(archive_path: Path, pattern: str) -> dict[str, bytes]:
    found = {}
    with tarfile.open(archive_path) as archive:
        for member in archive:
            if member.isfile() and re.search(pattern, member.name):
                handle = archive.extractfile(member)
                assert handle is not None
                found[member.name] = handle.read()
    return found


@pytest.fixture(scope="module")
def host_service_logs() -> dict[str, bytes]:
    found = extract(MUST_GATHER, r"/host_service_logs/masters/(kubelet|crio)_service\.log$")
    return {name.rsplit("/", 1)[1]: data for name, data in found.items()}


@pytest.fixture(scope="module")
def pod_logs() -> dict[str, bytes]:
    found = extract(MUST_GATHER, r"/namespaces/[^/]+/pods/[^/]+/[^/]+/[^/]+/logs/current\.log$")
    return {name.split("/namespaces/", 1)[1]: data for name, data in found.items() if data}


# --- journal text ------------------------------------------------------------------------------

def test_journal_short_lines_give_program_host_pid_and_the_year_from_hints():
    first = datetime(2021, 7, 14, 6, 27, 8, tzinfo=UTC)
    lines = [journal_line(first, "Started Kubernetes Kubelet."),
             journal_line(first + timedelta(seconds=1), "E0714 06:27:09.000001 1234 a.go:1] boom"),
             "                                      continued on an indented line",
             journal_line(first + timedelta(seconds=2), "hello", host="node-2", program="crio",
                          pid=None)]
    reason = "the upload's dates"
    rows, report = run("\n".join(lines).encode(), "kubelet.log",
                       hints=ParseHints(year=2021, year_reason=reason, component="x"))
    assert [row.received for row in rows] == [first + timedelta(seconds=i) for i in range(3)]
    assert [(row.component, row.node) for row in rows] == [
        ("kubelet", "node-1"), ("kubelet", "node-1"), ("crio", "node-2")]
    assert rows[0].annotations == {"pid": "1234"} and rows[2].annotations == {}
    assert rows[0].message == "Started Kubernetes Kubelet."
    assert rows[1].message == ("E0714 06:27:09.000001 1234 a.go:1] boom\n" + lines[2])
    assert [row.severity for row in rows] == ["", "error", ""]
    assert [row.line for row in rows] == [1, 2, 4]
    assert {row.kind for row in rows} == {"log"}
    assert all(row.completed == row.received and row.duration_ms == 0.0 for row in rows)
    assert any("2021" in note and reason in note for note in report.notes)


def test_journal_short_precise_keeps_microseconds():
    moment = datetime(2021, 7, 14, 6, 27, 8, 262884, tzinfo=UTC)
    rows, _ = run(journal_line(moment, "precise", precise=True).encode(),
                  hints=ParseHints(year=2021))
    assert rows[0].received == moment


@pytest.mark.parametrize("offset", ["+0000", "-0700", "+05:30"])
def test_journal_short_iso_is_converted_to_utc_and_needs_no_year(offset):
    sign = -1 if offset[0] == "-" else 1
    digits = offset[1:].replace(":", "")
    zone = timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))
    local = datetime(2021, 7, 14, 6, 27, 8, tzinfo=zone)
    lines = [f"{local:%Y-%m-%dT%H:%M:%S}{offset} node-1 containerd[99]: level=warning msg=x",
             f"{local:%Y-%m-%dT%H:%M:%S}.123456{offset} node-1 containerd[99]: precise"]
    rows, report = run("\n".join(lines).encode())
    assert [row.received for row in rows] == [local.astimezone(UTC),
                                              (local + timedelta(microseconds=123456))
                                              .astimezone(UTC)]
    assert [(row.component, row.node, row.severity) for row in rows] == [
        ("containerd", "node-1", "warning"), ("containerd", "node-1", "")]
    assert not any("year" in note for note in report.notes)


def test_journal_json_export_gives_each_entry_with_its_host_program_and_priority():
    entries = [
        {"__REALTIME_TIMESTAMP": "1513184447204209", "_HOSTNAME": "node-1",
         "SYSLOG_IDENTIFIER": "kubelet", "_PID": "812", "PRIORITY": "3",
         "MESSAGE": "E1213 17:00:47.204209 812 pod_workers.go:186] Error syncing pod"},
        {"__REALTIME_TIMESTAMP": "1513184448000001", "_HOSTNAME": "node-1", "_COMM": "dockerd",
         "PRIORITY": "6", "MESSAGE": list(b"not utf-8 \xff here")},
        {"__REALTIME_TIMESTAMP": "1513184449000000", "_HOSTNAME": "node-1",
         "SYSLOG_IDENTIFIER": "kernel", "PRIORITY": "4", "MESSAGE": "oom-kill"},
    ]
    rows, report = run(b"\n".join(orjson.dumps(e) for e in entries) + b"\n")
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    assert [row.received for row in rows] == [
        epoch + timedelta(microseconds=int(e["__REALTIME_TIMESTAMP"])) for e in entries]
    assert [(row.component, row.node, row.severity) for row in rows] == [
        ("kubelet", "node-1", "error"), ("dockerd", "node-1", "info"),
        ("kernel", "node-1", "warning")]
    assert rows[0].message.endswith("Error syncing pod")
    assert rows[1].message.startswith("not utf-8 ")
    assert not report.skipped


def test_sonobuoy_journals_are_read_whole():
    """The systemd_logs plugin's journals (``journalctl -o json``): every entry a row, at its
    time (the test's own reading of the export)."""
    with tarfile.open(SONOBUOY) as archive:
        journals = {m.name: archive.extractfile(m).read() for m in archive.getmembers()
                    if "/systemd_logs/results/" in m.name and m.isfile()}
    assert len(journals) == 3
    for name, data in journals.items():
        assert sniff(data[:65536], name)
        entries = [orjson.loads(line) for line in data.splitlines() if line.strip()]
        rows, report = run(data, name)
        assert len(rows) == len(entries) > 1000
        epoch = datetime(1970, 1, 1, tzinfo=UTC)
        assert sorted(row.received for row in rows) == sorted(
            epoch + timedelta(microseconds=int(e["__REALTIME_TIMESTAMP"])) for e in entries)
        assert {row.node for row in rows} == {e["_HOSTNAME"] for e in entries}
        assert not report.skipped


def test_structured_loggers_json_lines_are_entries_with_their_level_and_fields():
    """zap (epoch seconds in ``ts``), logrus (``time``), slog: a row per line at its time, the
    level as the severity, the other keys after the message; a Kubernetes object or an audit
    event on one line is no log line."""
    lines = [
        {"level": "error", "ts": 1627980000.25, "logger": "controller", "msg": "Reconciler error",
         "error": "boom", "attempt": 3},
        {"level": "info", "msg": "Starting server", "time": "2017-12-13T17:05:25Z"},
        {"time": "2024-03-01T12:00:00.5+01:00", "level": "WARN", "msg": "slow", "took": "2s"},
        {"time": "2024-03-01T12:00:01Z", "level": "info", "msg": "rotated", "file": "log"},
    ]
    rows, report = run(b"\n".join(orjson.dumps(line) for line in lines) + b"\n", "op.log")
    assert [row.received for row in rows] == [
        datetime(2021, 8, 3, 8, 40, 0, 250000, tzinfo=UTC),
        datetime(2017, 12, 13, 17, 5, 25, tzinfo=UTC),
        datetime(2024, 3, 1, 11, 0, 0, 500000, tzinfo=UTC),
        datetime(2024, 3, 1, 12, 0, 1, tzinfo=UTC)]
    assert [row.severity for row in rows] == ["error", "info", "warning", "info"]
    assert rows[0].message == "Reconciler error logger=controller error=boom attempt=3"
    assert rows[2].message == "slow took=2s"
    assert not report.skipped
    for other in ({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "x"},
                   "time": "2024-03-01T12:00:00Z", "message": "m", "level": "info"},
                  {"auditID": "a", "level": "Metadata", "msg": "m", "time": "2024-03-01T12:00:00Z"},
                  {"msg": "no time", "level": "info"}):
        assert not sniff(orjson.dumps(other) + b"\n", "other.json")


def test_sonobuoys_own_log_and_the_e2e_frameworks_are_read():
    """``meta/run.log`` (logrus JSON) and the e2e framework's ``e2e.log`` (a timed line among
    the suite's own: specs, steps, the "S" of skipped specs): every timed line an entry, the
    lines after it part of it, at the run's times (2017-12-13, the year from the collection)."""
    with tarfile.open(SONOBUOY) as archive:
        files = {m.name.lstrip("./"): archive.extractfile(m).read() for m in archive.getmembers()
                 if m.name.endswith(("meta/run.log", "plugins/e2e/results/e2e.log"))}
    run_log, e2e = files["meta/run.log"], files["plugins/e2e/results/e2e.log"]
    assert sniff(run_log[:65536], "meta/run.log") and sniff(e2e[:65536], "e2e.log")
    rows, report = run(run_log, "meta/run.log")
    entries = [orjson.loads(line) for line in run_log.splitlines() if line.strip()]
    assert [row.received for row in rows] == [
        datetime.fromisoformat(e["time"].replace("Z", "+00:00")) for e in entries]
    assert [row.message.split(" ")[0] for row in rows] == [e["msg"].split(" ")[0]
                                                         for e in entries]
    timed = re.compile(rb"^Dec 13 (\d\d):(\d\d):(\d\d)\.(\d{3}): ", re.M)
    rows, report = run(e2e, "e2e.log", hints=ParseHints(
        collected=datetime(2017, 12, 13, 17, 8, tzinfo=UTC)))
    stamps = [datetime(2017, 12, 13, *map(int, m.groups()[:3]), int(m.group(4)) * 1000,
                       tzinfo=UTC) for m in timed.finditer(e2e)]
    assert len(rows) == len(stamps) > 10
    assert sorted(row.received for row in rows) == sorted(stamps)
    assert any("STEP: " in row.message for row in rows)  # the steps go with their entry


def test_go_time_strings_keep_their_zone():
    """Go's time.String(), as a must-gather's timestamp file holds it: the offset after a space,
    then the zone's name (read as UTC, the must-gather's end moved two hours later)."""
    rows, report = run(b"2021-08-03 12:14:13.632016778 +0200 CEST m=+138.368642668\n"
                       b"2021-08-03 08:00:00 -0500 CDT done\n")
    assert [row.received for row in rows] == [
        datetime(2021, 8, 3, 10, 14, 13, 632016, tzinfo=UTC),
        datetime(2021, 8, 3, 13, 0, 0, tzinfo=UTC)]
    assert not any("zone" in note for note in report.notes)
    # a number after the time that is not followed by a zone's name stays in the message
    rows, report = run(b"2021-08-03 12:14:13 +0200 bytes copied\n")
    assert rows[0].received == datetime(2021, 8, 3, 12, 14, 13, tzinfo=UTC)
    assert "+0200 bytes copied" in rows[0].message


def test_journal_year_boundary_advances_the_year():
    lines = [journal_line(datetime(2020, 12, 31, 23, 59, 59, tzinfo=UTC), "old year"),
             journal_line(datetime(2021, 1, 1, 0, 0, 1, tzinfo=UTC), "new year")]
    rows, report = run("\n".join(lines).encode(), hints=ParseHints(year=2020))
    assert [row.received.year for row in rows] == [2020, 2021]
    assert any("2021" in note and "line 2" in note for note in report.notes)


def test_journal_header_gives_the_year_before_hints():
    header = ("-- Logs begin at Tue 2018-12-30 09:10:29 UTC, end at Wed 2019-01-02 10:13:48 "
              "UTC. --")
    lines = [header, journal_line(datetime(2018, 12, 31, 10, 0, tzinfo=UTC), "december"),
             journal_line(datetime(2019, 1, 2, 10, 0, tzinfo=UTC), "january"), "-- Reboot --"]
    rows, report = run("\n".join(lines).encode(), hints=ParseHints(year=2030))
    assert [row.received for row in rows] == [datetime(2018, 12, 31, 10, 0, tzinfo=UTC),
                                              datetime(2019, 1, 2, 10, 0, tzinfo=UTC)]
    assert any("journal header on line 1" in note for note in report.notes)
    assert report.skipped == 0


def test_journal_year_defaults_to_the_current_one_with_a_note():
    now = datetime.now(UTC)
    moment = (now - timedelta(days=2)).replace(microsecond=0)
    rows, report = run(journal_line(moment, "recent").encode())
    assert rows[0].received == moment
    assert any(f"year {now.year if moment.year == now.year else moment.year}" in note
               and "assumed" in note for note in report.notes)


def test_must_gather_journals_sniff_and_parse(host_service_logs):
    assert set(host_service_logs) == {"kubelet_service.log", "crio_service.log"}
    for name, data in host_service_logs.items():
        text = data.decode()
        assert sniff(data[:65536], name) and not klog.sniff(data[:65536], name)
        matches = [JOURNAL.match(line) for line in text.split("\n")]
        entries = [m for m in matches if m]
        ends = re.findall(r"end at \w+ (\d{4})-", text)
        rows, report = run(data, name)
        assert len(rows) == len(entries), name
        assert [row.node for row in rows] == [m.group(7) for m in entries]
        assert [row.component for row in rows] == [m.group(8) for m in entries]
        first = entries[0]
        assert rows[0].received == datetime(
            int(ends[0]), MONTHS.index(first.group(1)) + 1, int(first.group(2)),
            int(first.group(3)), int(first.group(4)), int(first.group(5)), int(first.group(6)),
            tzinfo=UTC)
        assert {row.received.year for row in rows} == {int(year) for year in ends}
        assert report.skipped == 0
        assert any("journal header" in note for note in report.notes)
        errors = sum(1 for line in text.split("\n")
                     if re.search(r"\]: (E\d{4} |.*level=error)", line))
        assert Counter(row.severity for row in rows)["error"] == errors


# --- pod logs ----------------------------------------------------------------------------------

def test_kubectl_timestamps_pod_log():
    first = datetime(2021, 7, 14, 6, 27, 8, 262884, tzinfo=UTC)
    lines = [f"{rfc3339(first)} starting server on :8080",
             f"{rfc3339(first + timedelta(seconds=1))} ERROR could not reach the database",
             "    at db.connect (db.js:12)",
             f"{rfc3339(first + timedelta(seconds=2))} "
             '{"level":"warn","msg":"slow"}']
    rows, report = run("\n".join(lines).encode(), "current.log",
                       hints=ParseHints(component="web", node="node-3"))
    assert [row.received for row in rows] == [first + timedelta(seconds=i) for i in range(3)]
    assert [row.message for row in rows] == [
        "starting server on :8080", "ERROR could not reach the database\n" + lines[2],
        '{"level":"warn","msg":"slow"}']
    assert [row.severity for row in rows] == ["", "error", "warning"]
    assert {(row.component, row.node) for row in rows} == {("web", "node-3")}
    assert orjson.loads(rows[1].raw)["message"] == rows[1].message
    assert report.notes == []


def test_cri_pod_log_joins_partial_lines_and_keeps_the_stream():
    moment = datetime(2021, 7, 14, 6, 27, 8, 1, tzinfo=UTC)
    lines = [f"{rfc3339(moment)} stdout P first half, ",
             f"{rfc3339(moment)} stdout F second half",
             f"{rfc3339(moment + timedelta(seconds=1))} stderr F warn: disk almost full"]
    rows, _ = run("\n".join(lines).encode(), "0.log")
    assert [(row.message, row.annotations.get("stream"), row.line) for row in rows] == [
        ("first half, second half", "stdout", 1), ("warn: disk almost full", "stderr", 3)]


def test_docker_json_pod_log():
    moment = datetime(2021, 7, 14, 6, 27, 8, 262884, tzinfo=UTC)
    events = [{"log": "listening\n", "stream": "stdout", "time": rfc3339(moment)},
              {"log": "level=error msg=failed\n", "stream": "stderr",
               "time": rfc3339(moment + timedelta(seconds=1))}]
    data = b"\n".join(orjson.dumps(event) for event in events)
    assert sniff(data, "container-json.log")
    rows, _ = run(data)
    assert [(row.received, row.message, row.severity) for row in rows] == [
        (moment, "listening", ""), (moment + timedelta(seconds=1), "level=error msg=failed",
                                    "error")]


def test_same_line_with_or_without_a_runtime_prefix_has_the_same_key():
    moment = datetime(2021, 7, 14, 6, 27, 8, 262884, tzinfo=UTC)
    kubectl, _ = run(f"{rfc3339(moment)} hello\n{rfc3339(moment)} hello\n".encode(), "a.log")
    runtime, _ = run(f"{rfc3339(moment)} stdout F hello\n{rfc3339(moment)} stdout F hello\n"
                     .encode(), "b.log")
    assert [row.audit_id for row in kubectl] == [row.audit_id for row in runtime]
    assert kubectl[0].audit_id != kubectl[1].audit_id
    assert kubectl[0].audit_id.startswith("log:") and kubectl[1].audit_id.endswith(":1")


def test_must_gather_pod_logs_that_are_not_klog(pod_logs):
    checked = 0
    for name, data in sorted(pod_logs.items()):
        if klog.sniff(data[:65536], name):
            continue
        assert sniff(data[:65536], name), name
        lines = data.decode("utf-8", "replace").split("\n")
        stamped = [number for number, line in enumerate(lines, start=1) if STAMPED.match(line)]
        rows, report = run(data, name, hints=ParseHints(component="c", node="n"))
        assert [row.line for row in rows] == stamped, name
        assert report.skipped == 0, name
        checked += 1
    assert checked > 100


def test_klog_pod_logs_are_left_to_the_klog_parser(pod_logs):
    claimed = [name for name, data in pod_logs.items() if klog.sniff(data[:65536], name)]
    assert claimed
    assert not any(sniff(pod_logs[name][:65536], name) for name in claimed)


def test_sonobuoy_pod_logs_in_logrus_text(tmp_path):
    found = extract(SONOBUOY, r"podlogs/.*\.txt$")
    checked = 0
    for name, data in sorted(found.items()):
        lines = [line for line in data.decode().split("\n") if line.strip()]
        if not lines or not lines[0].startswith('time="'):
            continue  # e2e.txt: test-runner output, mostly without times
        assert sniff(data, name), name
        stamps = [re.match(r'time="([^"]+)" level=(\w+)', line) for line in lines]
        rows, report = run(data, name)
        assert len(rows) == len(stamps), name
        assert [row.received for row in rows] == [
            datetime.fromisoformat(m.group(1).replace("Z", "+00:00")) for m in stamps]
        assert [row.severity for row in rows] == [
            {"info": "info", "error": "error", "warning": "warning"}[m.group(2)] for m in stamps]
        assert report.notes == []
        checked += 1
    assert checked >= 4


# --- sniffing ----------------------------------------------------------------------------------

@pytest.mark.parametrize("path", [
    "audit/audit2rbac-demo.log", "audit/openshift-requestresponse.log",
    "events/cribl-event-watch-stream.json", "events/insights-openshift-machine-api.json",
    "events/kspan-deployment-2-pods.yaml",
    "klog/kind-kube-apiserver.txt", "klog/kind-kube-controller-manager.txt",
])
def test_sniff_rejects_audit_events_and_klog(fixtures_dir, path):
    assert not sniff((fixtures_dir / path).read_bytes()[:65536], path)


def test_sniff_rejects_klog_behind_a_cri_prefix_and_plain_text():
    moment = datetime(2021, 7, 14, 6, 27, 8, tzinfo=UTC)
    line = f"{rfc3339(moment)} stderr F I0714 06:27:08.000000       1 main.go:1] up\n"
    assert klog.sniff((line * 5).encode(), "x.log")
    assert not sniff((line * 5).encode(), "x.log")
    assert not sniff(b"just\nsome\nnotes\n", "notes.txt")
    assert not sniff(b"-- No entries --\n", "kubelet_service.log")


def test_format_is_registered_under_its_name():
    assert FORMAT.name == "text-log" and FORMAT.sniff is sniff and FORMAT.parse is parse


# --- input handling ----------------------------------------------------------------------------

def test_lines_without_time_before_the_first_entry_are_skipped_with_a_reason():
    moment = datetime(2021, 7, 14, 6, 27, 8, tzinfo=UTC)
    data = f"no time here\n{rfc3339(moment)} dated\n".encode()
    rows, report = run(data, "pod.log")
    assert [row.line for row in rows] == [2]
    assert report.skipped == 1 and report.errors[0].startswith("pod.log:1: ")


def test_file_without_entries_is_an_input_error_naming_it():
    with pytest.raises(InputError, match=r"^notes\.txt: "):
        run(b"just\ntext\n", "notes.txt")
    with pytest.raises(InputError, match=r"^kubelet_service\.log: "):
        run(b"-- No entries --\n", "kubelet_service.log")


def test_gzip_input_gives_the_same_rows(host_service_logs, tmp_path):
    data = host_service_logs["crio_service.log"]
    zipped = tmp_path / "crio_service.log.gz"
    zipped.write_bytes(gzip.compress(data))
    with zipped.open("rb") as handle:
        from_gzip = list(parse(handle, Report("crio_service.log.gz")))
    plain, _ = run(data, "crio_service.log.gz")
    assert from_gzip == plain


def test_bearer_tokens_in_messages_are_redacted():
    moment = datetime(2021, 7, 14, 6, 27, 8, tzinfo=UTC)
    data = (f"{rfc3339(moment)} GET /api?access_token=s3cr3t-value&x=1 "
            f"Authorization: Bearer abcdefghijklmnopqrstuvwxyz\n").encode()
    rows, report = run(data)
    assert "s3cr3t-value" not in rows[0].message
    assert "abcdefghijklmnopqrstuvwxyz" not in rows[0].message
    assert b"s3cr3t-value" not in rows[0].raw
    assert report.redacted == 2
    kept, report = run(data, redactor=Redactor(enabled=False))
    assert "s3cr3t-value" in kept[0].message and report.redacted == 0


def test_progress_is_reported_while_reading():
    moment = datetime(2021, 7, 14, 6, 27, 8, tzinfo=UTC)
    count = 9000
    data = "\n".join(f"{rfc3339(moment + timedelta(milliseconds=i))} line {i}"
                     for i in range(count)).encode()
    calls: list[tuple[int, int]] = []
    rows, _ = run(data, progress=lambda done, rows: calls.append((done, rows)))
    assert len(rows) == count
    assert len(calls) >= 3 and calls == sorted(calls) and calls[-1] == (len(data), count)
