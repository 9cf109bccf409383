"""``timelines.ingest.unpacker``: unpacking diagnose bundles safely, and what their layouts say.

No database. Expected values are derived in the test from the archives themselves (the real
bundles read with the stdlib ``tarfile``, or the archives and directories the test builds),
never from what the code under test produced. Hostile archives are built here, in tmp_path;
their "absolute" and symlink targets point into tmp_path, so that a regression shows up in the
listing of tmp_path instead of overwriting a file of the machine running the tests.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import io
import json
import os
import posixpath
import re
import stat
import tarfile
import zipfile
from datetime import UTC, datetime
from pathlib import Path

import pytest

from timelines.ingest import unpacker
from timelines.ingest.unpacker import Limits, Member, classify, is_bundle, unpack

_BUNDLES = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "bundles"
MUST_GATHER = _BUNDLES / "openshift-must-gather-aws.tar.xz"
SONOBUOY = _BUNDLES / "sonobuoy-results-0.10.tar.gz"
TROUBLESHOOT = _BUNDLES / "troubleshoot-supportbundle-baseline.tar.gz"
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC).timestamp()
MIB = 1024 * 1024


# --- helpers -----------------------------------------------------------------------------------

def entry(name: str, data: bytes = b"", *, kind: bytes = tarfile.REGTYPE, linkname: str = "",
          mtime: float = T0) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.mtime = mtime
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    if kind == tarfile.CHRTYPE:
        info.devmajor, info.devminor = 1, 3
    return info, data


def make_tar(path: Path, entries: list[tuple[tarfile.TarInfo, bytes]], mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


def make_zip(path: Path, files: dict[str, bytes], compression: int = zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", compression) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return path


def run(bundle: Path, workdir: Path, **limits) -> list[Member]:
    return list(unpack(bundle, workdir, Limits(**limits)))


def extracted(members: list[Member]) -> dict[str, bytes]:
    return {m.name: m.path.read_bytes() for m in members if m.path is not None}


def refused(members: list[Member]) -> dict[str, str]:
    return {m.name: m.refused for m in members if m.refused}


def files_on_disk(workdir: Path) -> dict[str, int]:
    """Every file under ``workdir`` (the temporary directory included, should one be left)."""
    return {str(p.relative_to(workdir)): p.lstat().st_size
            for p in workdir.rglob("*") if not p.is_dir() or p.is_symlink()}


def listing(root: Path, workdir: Path) -> list[str]:
    """Everything under ``root`` except ``workdir`` and what is inside it."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p != workdir and workdir not in p.parents)


def assert_contained(workdir: Path) -> None:
    """No link of any kind and no leftover temporary directory inside ``workdir``."""
    for path in workdir.rglob("*"):
        assert not path.is_symlink(), path
        assert not path.name.startswith(unpacker.TMP_PREFIX), path
        if path.is_file():
            assert path.stat().st_nlink == 1, path


def tar_regular_files(path: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(path) as tar:
        return {posixpath.normpath(m.name): m for m in tar.getmembers() if m.isreg()}


# --- the real bundles --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def must_gather(tmp_path_factory) -> tuple[list[Member], Path]:
    workdir = tmp_path_factory.mktemp("must-gather") / "work"
    return list(unpack(MUST_GATHER, workdir)), workdir


@pytest.fixture(scope="module")
def must_gather_tar() -> dict[str, tuple[int, bytes, bytes]]:
    """The must-gather as tarfile reads it, in one pass (xz is slow): for every regular file,
    its size, SHA-256 and, for the collector's ``timestamp`` files, the text."""
    files = {}
    with tarfile.open(MUST_GATHER) as tar:
        for info in tar:
            if info.isreg():
                data = tar.extractfile(info).read()
                text = data if info.name.endswith("/timestamp") else b""
                files[posixpath.normpath(info.name)] = (info.size, hashlib.sha256(data).digest(),
                                                        text)
    return files


def test_must_gather_yields_one_member_per_regular_file(must_gather, must_gather_tar):
    members, workdir = must_gather
    sizes = {name: size for name, (size, _, _) in must_gather_tar.items()}

    assert len(members) == len(must_gather_tar) > 3000
    assert {m.name: m.size for m in members} == sizes
    assert not refused(members)
    assert all(m.path == workdir / m.name for m in members)
    assert files_on_disk(workdir) == sizes
    assert_contained(workdir)


def test_must_gather_files_are_extracted_byte_for_byte(must_gather, must_gather_tar):
    members, _ = must_gather
    for member in members:
        digest = hashlib.sha256(member.path.read_bytes()).digest()
        assert digest == must_gather_tar[member.name][1], member.name


def test_must_gather_layout_gives_components_of_pod_logs_and_host_services(must_gather,
                                                                            must_gather_tar):
    members, _ = must_gather
    assert {m.layout for m in members} == {"must-gather"}

    events = [m for m in members if m.name.endswith("/core/events.yaml")]
    assert len(events) == sum(n.endswith("/core/events.yaml") for n in must_gather_tar) > 50
    assert all(m.hints.component == "" and m.hints.node == "" for m in events)

    pod_logs = [m for m in members
                if re.search(r"/namespaces/[^/]+/pods/[^/]+/([^/]+)/\1/logs/current\.log$", m.name)]
    assert len(pod_logs) > 400
    for member in pod_logs:
        assert member.hints.component == member.name.split("/")[-3]
        parts = member.name.split("/")
        at = parts.index("pods")
        assert parts[at - 2] == "namespaces"
        assert member.hints.pod == f"{parts[at - 1]}/{parts[at + 1]}"
    assert all(bool(m.hints.pod) == bool(re.search(
        r"/namespaces/[^/]+/pods/[^/]+/([^/]+)/\1/logs/[^/]+$", m.name)) for m in members)

    services = {m.name.rsplit("/", 1)[-1]: m.hints.component
                for m in members if "/host_service_logs/masters/" in m.name}
    assert services["kubelet_service.log"] == "kubelet"
    assert services["crio_service.log"] == "crio"


def test_must_gather_year_comes_from_its_timestamp_file(must_gather, must_gather_tar):
    members, _ = must_gather
    # Lines like "2021-08-03 12:14:13.632016778 +0200 CEST m=+138.368642668".
    stamps = [datetime.strptime(f"{day} {clock}.{fraction[:6]} {zone}", "%Y-%m-%d %H:%M:%S.%f %z")
              for _, _, text in must_gather_tar.values()
              for day, clock, fraction, zone in re.findall(
                  r"(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d)\.(\d+) ([+-]\d{4})", text.decode())]
    latest = max(stamps).astimezone(UTC)

    assert {m.hints.year for m in members} == {latest.year}
    assert {m.hints.year_reason for m in members} == {
        f"collection time {latest:%Y-%m-%d} from the must-gather timestamp file"}
    assert {getattr(m.hints, "collected", latest) for m in members} == {latest}


def test_sonobuoy_results_unpack_with_pod_log_components_and_node_hints(tmp_path):
    members = run(SONOBUOY, tmp_path / "work")
    expected = tar_regular_files(SONOBUOY)

    assert {m.name: m.size for m in members} == {name: m.size for name, m in expected.items()}
    assert {m.layout for m in members} == {"sonobuoy"}
    for member in members:
        if re.fullmatch(r"podlogs/[^/]+/[^/]+/logs/[^/]+\.txt", member.name):
            assert member.hints.component == member.name.rsplit("/", 1)[-1].removesuffix(".txt")
            assert member.hints.pod == "/".join(member.name.split("/")[1:3])
        else:
            assert not member.hints.pod
        if member.name.startswith("plugins/systemd_logs/results/"):
            assert member.hints.node == member.name.rsplit("/", 1)[-1]
        if member.name.startswith("hosts/"):
            assert member.hints.node == member.name.split("/")[1]
    assert sum(bool(m.hints.node) for m in members) == sum(
        n.startswith(("hosts/", "plugins/systemd_logs/results/")) for n in expected)


def test_sonobuoy_year_comes_from_meta_run_log(tmp_path):
    members = run(SONOBUOY, tmp_path / "work")
    with tarfile.open(SONOBUOY) as tar:
        lines = tar.extractfile("./meta/run.log").read().splitlines()
    latest = max(datetime.fromisoformat(json.loads(line)["time"]) for line in lines if line)

    assert {m.hints.year for m in members} == {latest.year}
    assert {m.hints.year_reason for m in members} == {
        f"collection time {latest:%Y-%m-%d} from sonobuoy's meta/run.log"}


def test_troubleshoot_bundle_refuses_its_two_symlinks_and_extracts_the_rest(tmp_path):
    workdir = tmp_path / "work"
    members = run(TROUBLESHOOT, workdir)
    with tarfile.open(TROUBLESHOOT) as tar:
        links = {m.name for m in tar.getmembers() if m.issym()}
    regular = tar_regular_files(TROUBLESHOOT)

    assert {n: len(d) for n, d in extracted(members).items()} == {
        name: m.size for name, m in regular.items()}
    assert refused(members) == dict.fromkeys(links, "symlink")
    assert len(links) == 2
    assert {m.layout for m in members} == {"troubleshoot"}
    assert_contained(workdir)


def test_troubleshoot_hints_and_year_from_file_times(tmp_path):
    members = run(TROUBLESHOOT, tmp_path / "work")
    regular = tar_regular_files(TROUBLESHOOT)
    latest = datetime.fromtimestamp(max(m.mtime for m in regular.values()), UTC)

    for member in members:
        match = re.search(r"cluster-resources/pods/logs/[^/]+/[^/]+/([^/]+)\.log$", member.name)
        assert member.hints.component == (match[1] if match else "")
    assert any(m.name.endswith("cluster-resources/events/default.json") for m in members)
    assert {m.hints.year for m in members} == {latest.year}
    assert {m.hints.year_reason for m in members} == {
        f"collection time {latest:%Y-%m-%d} from the bundle's file times"}


# --- directories, zips, nesting ------------------------------------------------------------------

def test_a_directory_is_copied_and_its_symlinks_and_fifos_refused(tmp_path):
    source = tmp_path / "bundle"
    (source / "sub").mkdir(parents=True)
    (source / "a.log").write_bytes(b"one\n")
    (source / "sub" / "b.json").write_bytes(b'{"b": 2}\n')
    (source / "to-etc").symlink_to("/etc")
    (source / "to-file").symlink_to(source / "a.log")
    os.mkfifo(source / "pipe")
    workdir = tmp_path / "work"
    before = listing(tmp_path, workdir)

    members = run(source, workdir)

    assert extracted(members) == {"a.log": b"one\n", "sub/b.json": b'{"b": 2}\n'}
    assert refused(members) == {"to-etc": "symlink", "to-file": "symlink", "pipe": "device file"}
    assert listing(tmp_path, workdir) == before
    assert all(m.hints.year is None for m in members)  # a copy's file times prove nothing
    assert_contained(workdir)


def test_a_zip_is_unpacked_with_year_from_its_entry_times(tmp_path):
    bundle = tmp_path / "bundle.zip"
    with zipfile.ZipFile(bundle, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(zipfile.ZipInfo("logs/", (2022, 3, 4, 5, 6, 8)), b"")
        archive.writestr(zipfile.ZipInfo("logs/a.log", (2022, 3, 4, 5, 6, 8)), b"a\n" * 100)
        archive.writestr(zipfile.ZipInfo("b.txt", (2021, 1, 2, 3, 4, 6)), b"b")

    members = run(bundle, tmp_path / "work")

    assert extracted(members) == {"logs/a.log": b"a\n" * 100, "b.txt": b"b"}
    assert {m.hints.year_reason for m in members} == {
        "collection time 2022-03-04 from the bundle's file times"}


def test_archives_inside_are_unpacked_under_the_outer_name_and_gzip_files_kept(tmp_path):
    inner = make_tar(tmp_path / "inner.tar.gz", [entry("a.log", b"a\n"), entry("sub/b.log", b"b")])
    inner_zip = make_zip(tmp_path / "inner.zip", {"c.txt": b"c", "d/e.txt": b"e"})
    single_gzip = gzip.compress(b'{"auditID": "1"}\n')
    bundle = make_tar(tmp_path / "bundle.tar", [
        entry("logs/inner.tar.gz", inner.read_bytes()),
        entry("x.zip", inner_zip.read_bytes()),
        entry("audit_logs/kube-apiserver/node-audit.log.gz", single_gzip),
        entry("top.txt", b"top"),
    ], mode="w")

    members = run(bundle, tmp_path / "work")

    assert extracted(members) == {
        "logs/inner.tar.gz/a.log": b"a\n", "logs/inner.tar.gz/sub/b.log": b"b",
        "x.zip/c.txt": b"c", "x.zip/d/e.txt": b"e",
        "audit_logs/kube-apiserver/node-audit.log.gz": single_gzip, "top.txt": b"top",
    }
    assert not refused(members)


def test_archives_nested_deeper_than_max_depth_are_refused(tmp_path):
    c = make_tar(tmp_path / "c.tar", [entry("d.txt", b"deep")], mode="w")
    b = make_tar(tmp_path / "b.tar", [entry("c.tar", c.read_bytes())], mode="w")
    bundle = make_tar(tmp_path / "a.tar.gz", [entry("b.tar", b.read_bytes()),
                                              entry("top.txt", b"top")])

    shallow = run(bundle, tmp_path / "shallow", max_depth=1)
    deep = run(bundle, tmp_path / "deep", max_depth=2)

    assert extracted(shallow) == {"top.txt": b"top"}
    assert refused(shallow) == {"b.tar/c.tar": "nested too deep"}
    assert extracted(deep) == {"b.tar/c.tar/d.txt": b"deep", "top.txt": b"top"}
    assert files_on_disk(tmp_path / "shallow") == {"top.txt": 3}


def test_a_later_entry_of_the_same_name_replaces_the_earlier_one(tmp_path):
    bundle = make_tar(tmp_path / "b.tar.gz", [entry("a.txt", b"old"), entry("a.txt", b"new")])
    members = run(bundle, tmp_path / "work")
    assert [(m.name, m.path.read_bytes()) for m in members] == [("a.txt", b"new")]


def test_a_file_where_a_directory_is_needed_is_refused(tmp_path):
    bundle = make_tar(tmp_path / "b.tar.gz", [entry("a", b"file"), entry("a/b", b"under")])
    members = run(bundle, tmp_path / "work")
    assert extracted(members) == {"a": b"file"}
    assert refused(members) == {"a/b": "path conflicts with another file in the bundle"}


# --- hostile archives ----------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["w", "w:gz", "w:xz", "w:bz2"])
def test_hostile_tar_entries_are_refused_and_the_rest_extracted(tmp_path, mode):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_bytes(b"untouched")
    bundle = make_tar(tmp_path / "bundle.tar", [
        entry("good/first.txt", b"first"),
        entry("../evil", b"escaped"),
        entry("a/../../evil2", b"escaped"),
        entry(str(outside / "victim"), b"overwritten"),  # an absolute path
        entry("to-etc", kind=tarfile.SYMTYPE, linkname="/etc"),
        entry("to-outside", kind=tarfile.SYMTYPE, linkname=str(outside)),
        entry("to-outside/victim", b"through the link"),
        entry("hard", kind=tarfile.LNKTYPE, linkname=str(outside / "victim")),
        entry("hard-inside", kind=tarfile.LNKTYPE, linkname="good/first.txt"),
        entry("null", kind=tarfile.CHRTYPE),
        entry("pipe", kind=tarfile.FIFOTYPE),
        entry("x" * 300, b"too long for a file system"),
        entry("good/last.txt", b"last"),
    ], mode=mode)
    workdir = tmp_path / "work"
    before = listing(tmp_path, workdir)

    members = run(bundle, workdir)

    assert refused(members) == {
        "../evil": "path escapes the bundle", "a/../../evil2": "path escapes the bundle",
        str(outside / "victim"): "absolute path", "to-etc": "symlink", "to-outside": "symlink",
        "hard": "hardlink", "hard-inside": "hardlink", "null": "device file",
        "pipe": "device file", "x" * 300: "name too long",
    }
    # The file "through the link" lands in a real directory inside workdir, not in outside/.
    assert extracted(members) == {"good/first.txt": b"first", "good/last.txt": b"last",
                                  "to-outside/victim": b"through the link"}
    assert listing(tmp_path, workdir) == before
    assert (outside / "victim").read_bytes() == b"untouched"
    assert_contained(workdir)


def test_hostile_zip_names_are_refused_and_the_rest_extracted(tmp_path):
    bundle = tmp_path / "bundle.zip"
    with zipfile.ZipFile(bundle, "w") as archive:
        archive.writestr("good.txt", b"good")
        archive.writestr("../evil.txt", b"escaped")
        archive.writestr("sub/../../up.txt", b"escaped")
        archive.writestr("..\\windows.txt", b"escaped")
        archive.writestr(str(tmp_path / "abs.txt"), b"absolute")
        link = zipfile.ZipInfo("link")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(link, "/etc")
        archive.writestr("sub/good2.txt", b"good2")
    workdir = tmp_path / "work"
    before = listing(tmp_path, workdir)

    members = run(bundle, workdir)

    assert refused(members) == {
        "../evil.txt": "path escapes the bundle", "sub/../../up.txt": "path escapes the bundle",
        "..\\windows.txt": "path escapes the bundle", str(tmp_path / "abs.txt"): "absolute path",
        "link": "symlink",
    }
    assert extracted(members) == {"good.txt": b"good", "sub/good2.txt": b"good2"}
    assert listing(tmp_path, workdir) == before
    assert_contained(workdir)


def test_a_gzip_bomb_member_is_stopped_while_writing_and_the_rest_extracted(tmp_path):
    first, last = os.urandom(2 * MIB), b"last"
    bundle = make_tar(tmp_path / "bomb.tar.gz", [
        entry("first.bin", first), entry("bomb.bin", bytes(16 * MIB)), entry("last.txt", last)])
    assert bundle.stat().st_size < 3 * MIB  # 16 MiB of zeros compress to almost nothing
    workdir = tmp_path / "work"

    members = run(bundle, workdir, max_ratio=20)

    assert re.fullmatch(r"compression ratio \d+ over 20", refused(members)["bomb.bin"])
    assert extracted(members) == {"first.bin": first, "last.txt": last}
    assert files_on_disk(workdir) == {"first.bin": len(first), "last.txt": len(last)}


def test_a_zip_bomb_member_is_refused_and_the_rest_extracted(tmp_path):
    padding = os.urandom(2 * MIB)
    bundle = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bundle, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("padding.bin", padding, compress_type=zipfile.ZIP_STORED)
        archive.writestr("bomb.bin", bytes(16 * MIB))
        archive.writestr("after.txt", b"after")
    workdir = tmp_path / "work"

    members = run(bundle, workdir, max_ratio=50)

    assert re.fullmatch(r"compression ratio \d+ over 50", refused(members)["bomb.bin"])
    assert extracted(members) == {"padding.bin": padding, "after.txt": b"after"}
    assert set(files_on_disk(workdir)) == {"padding.bin", "after.txt"}


def test_the_byte_budget_stops_unpacking_and_leaves_no_partial_file(tmp_path):
    small = os.urandom(300 * 1024)
    bundle = make_tar(tmp_path / "big.tar", [
        entry("a.bin", small), entry("big.bin", os.urandom(2 * MIB)), entry("c.bin", small)],
        mode="w")
    workdir = tmp_path / "work"

    members = run(bundle, workdir, max_total_bytes=MIB)

    assert refused(members) == {"big.bin": "over the size limit"}
    assert extracted(members) == {"a.bin": small}  # c.bin is never reached
    assert files_on_disk(workdir) == {"a.bin": len(small)}


def test_many_small_bombs_in_a_nested_archive_are_refused_by_the_overall_ratio(tmp_path):
    # Each file stays under the size where a member's own ratio is judged: only the ratio of
    # the whole bundle, nested archive included, catches them, each one alone.
    size = 768 * 1024
    names = [f"z{i}.bin" for i in range(8)]
    inner = make_tar(tmp_path / "inner.tar.gz", [entry(name, bytes(size)) for name in names])
    bundle = make_tar(tmp_path / "outer.tar.gz", [entry("inner.tar.gz", inner.read_bytes()),
                                                  entry("after.txt", b"after")])
    workdir = tmp_path / "work"

    members = run(bundle, workdir)

    reasons = refused(members)
    assert reasons and all(re.fullmatch(r"compression ratio \d+ over 200 for the bundle", reason)
                           for reason in reasons.values())
    kept = files_on_disk(workdir)
    seen = {name.removeprefix("inner.tar.gz/") for name in [*reasons, *kept]}
    assert seen == {*names, "after.txt"}
    assert kept["after.txt"] == len(b"after")  # what follows the bombs is read
    assert set(kept.values()) <= {size, len(b"after")}  # whole files only


def test_too_many_files_stops_after_the_limit(tmp_path):
    names = [f"f{i}.txt" for i in range(10)]
    bundle = make_tar(tmp_path / "many.tar.gz", [entry(name, name.encode()) for name in names])
    workdir = tmp_path / "work"

    members = run(bundle, workdir, max_files=4)

    assert extracted(members) == {name: name.encode() for name in names[:4]}
    assert refused(members) == {names[4]: "too many files"}
    assert len(members) == 5
    assert set(files_on_disk(workdir)) == set(names[:4])


def test_a_truncated_tar_gz_keeps_what_was_read(tmp_path):
    tail = os.urandom(MIB)  # incompressible: cutting the archive in half cuts into this file
    whole = make_tar(tmp_path / "whole.tar.gz", [
        entry("first.txt", b"first"), entry("second.txt", b"second"), entry("tail.bin", tail)])
    data = whole.read_bytes()
    bundle = tmp_path / "cut.tar.gz"
    bundle.write_bytes(data[: len(data) // 2])
    workdir = tmp_path / "work"

    members = run(bundle, workdir)

    assert extracted(members) == {"first.txt": b"first", "second.txt": b"second"}
    assert list(refused(members)) == ["tail.bin"]
    assert refused(members)["tail.bin"].startswith("corrupt archive: ")
    assert set(files_on_disk(workdir)) == {"first.txt", "second.txt"}


def test_an_oversized_pax_header_ends_the_archive_before_it_is_read(tmp_path):
    # tarfile would read a 2 MiB pax header into memory whole; a forged one could be gigabytes.
    bundle = tmp_path / "pax.tar.gz"
    with tarfile.open(bundle, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for info, data in [entry("first.txt", b"first"), entry("long/" + "a/" * MIB, b"x")]:
            tar.addfile(info, io.BytesIO(data))

    members = run(bundle, tmp_path / "work")

    assert extracted(members) == {"first.txt": b"first"}
    assert list(refused(members)) == ["pax.tar.gz"]  # broke between entries: the archive's name
    size = re.fullmatch(r"corrupt archive: extended header of (\d+) bytes",
                        refused(members)["pax.tar.gz"])
    assert size and int(size[1]) > 2 * MIB


def test_a_file_that_is_no_archive_is_one_refused_member(tmp_path):
    bundle = tmp_path / "bundle.tar.gz"
    bundle.write_bytes(b"\x1f\x8b" + os.urandom(1000))
    members = run(bundle, tmp_path / "work")
    assert [(m.name, m.path, m.refused) for m in members] == [
        ("bundle.tar.gz", None, "corrupt archive: not a tar or zip archive")]


def test_temporary_files_are_removed_when_writing_fails(tmp_path, monkeypatch):
    bundle = make_tar(tmp_path / "b.tar.gz", [entry("a.txt", b"a" * 1000)])

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(unpacker.os, "replace", disk_full)
    workdir = tmp_path / "work"
    with pytest.raises(OSError, match="No space left"):
        run(bundle, workdir)
    assert files_on_disk(workdir) == {}
    assert list(workdir.iterdir()) == []


# --- layouts and year ----------------------------------------------------------------------------

def write_tree(root: Path, files: list[str]) -> None:
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(f"{name}\n".encode())


def test_kind_export_logs_give_node_and_component(tmp_path):
    uid, cid = "0b9f4e7a-1c2d-4e5f-8a9b-0c1d2e3f4a5b", "ab" * 32
    node = "kind-logs/kind-control-plane"
    write_tree(tmp_path / "bundle", [
        "kind-logs/kind-version.txt", f"{node}/kubelet.log", f"{node}/containerd.log",
        f"{node}/journal.log", f"{node}/serial.log",
        f"{node}/pods/kube-system_kube-apiserver-kind-control-plane_{uid}/kube-apiserver/0.log",
        f"{node}/containers/etcd-kind-control-plane_kube-system_etcd-{cid}.log",
        "kind-logs/kind-worker/kubelet.log",
    ])

    members = run(tmp_path / "bundle", tmp_path / "work")

    assert {m.name: (m.layout, m.hints.node, m.hints.component) for m in members} == {
        "kind-logs/kind-version.txt": ("kind", "", ""),
        f"{node}/kubelet.log": ("kind", "kind-control-plane", "kubelet"),
        f"{node}/containerd.log": ("kind", "kind-control-plane", "containerd"),
        f"{node}/journal.log": ("kind", "kind-control-plane", ""),
        f"{node}/serial.log": ("kind", "kind-control-plane", ""),
        f"{node}/pods/kube-system_kube-apiserver-kind-control-plane_{uid}/kube-apiserver/0.log":
            ("kind", "kind-control-plane", "kube-apiserver"),
        f"{node}/containers/etcd-kind-control-plane_kube-system_etcd-{cid}.log":
            ("kind", "kind-control-plane", "etcd"),
        "kind-logs/kind-worker/kubelet.log": ("kind", "kind-worker", "kubelet"),
    }


def test_konvoy_diagnose_directories_give_node_and_component(tmp_path):
    audit = "var/log/kubernetes/audit"
    write_tree(tmp_path / "bundle", [
        f"diag/10.0.0.1/{audit}/kube-apiserver-audit.log",
        f"diag/10.0.0.1/{audit}/kube-apiserver-audit-2021-07-14T06-27-08.000.log.gz",
        "diag/10.0.0.1/kubelet.service.log", "diag/10.0.0.2/containerd.service.log",
        "diag/10.0.0.2/journalctl.log", "diag/10.0.0.2/dmesg.txt", "notes.txt",
    ])

    members = run(tmp_path / "bundle", tmp_path / "work")

    assert {m.name: (m.layout, m.hints.node, m.hints.component) for m in members} == {
        f"diag/10.0.0.1/{audit}/kube-apiserver-audit.log":
            ("konvoy", "10.0.0.1", "kube-apiserver"),
        f"diag/10.0.0.1/{audit}/kube-apiserver-audit-2021-07-14T06-27-08.000.log.gz":
            ("konvoy", "10.0.0.1", "kube-apiserver"),
        "diag/10.0.0.1/kubelet.service.log": ("konvoy", "10.0.0.1", "kubelet"),
        "diag/10.0.0.2/containerd.service.log": ("konvoy", "10.0.0.2", "containerd"),
        "diag/10.0.0.2/journalctl.log": ("konvoy", "10.0.0.2", ""),
        "diag/10.0.0.2/dmesg.txt": ("konvoy", "10.0.0.2", ""),
        "notes.txt": ("", "", ""),  # outside the layout's root
    }


def test_konvoy_per_node_archives_name_the_node(tmp_path):
    node = make_tar(tmp_path / "node.tar.gz", [entry("kubelet.service.log", b"k"),
                                               entry("journalctl.log", b"j")])
    bundle = make_tar(tmp_path / "20190705T114114.tar.gz",
                      [entry("bundles/172.17.0.3.tar.gz", node.read_bytes())])

    members = run(bundle, tmp_path / "work")

    assert {m.name: (m.layout, m.hints.node, m.hints.component) for m in members} == {
        "bundles/172.17.0.3.tar.gz/kubelet.service.log": ("konvoy", "172.17.0.3", "kubelet"),
        "bundles/172.17.0.3.tar.gz/journalctl.log": ("konvoy", "172.17.0.3", ""),
    }


def test_must_gather_audit_logs_give_apiserver_and_node(tmp_path):
    image = "must-gather.local.42/quay-io-openshift-release-dev-ocp-v4-0-art-dev-sha256-1"
    rotated = "ip-10-0-1-2.ec2.internal-audit-2021-08-03T10-00-00.000.log.gz"
    write_tree(tmp_path / "bundle", [
        "must-gather.local.42/timestamp",
        f"{image}/audit_logs/kube-apiserver/ip-10-0-1-1.ec2.internal-audit.log.gz",
        f"{image}/audit_logs/openshift-apiserver/{rotated}",
        f"{image}/audit_logs/kube-apiserver.audit_logs_listing",
        f"{image}/namespaces/ns/core/events.yaml",
        f"{image}/namespaces/ns/pods/p-1/c/c/logs/previous.log",
    ])

    members = run(tmp_path / "bundle", tmp_path / "work")

    assert {m.name: (m.layout, m.hints.component, m.hints.node) for m in members} == {
        "must-gather.local.42/timestamp": ("must-gather", "", ""),
        f"{image}/audit_logs/kube-apiserver/ip-10-0-1-1.ec2.internal-audit.log.gz":
            ("must-gather", "kube-apiserver", "ip-10-0-1-1.ec2.internal"),
        f"{image}/audit_logs/openshift-apiserver/{rotated}":
            ("must-gather", "openshift-apiserver", "ip-10-0-1-2.ec2.internal"),
        f"{image}/audit_logs/kube-apiserver.audit_logs_listing": ("must-gather", "", ""),
        f"{image}/namespaces/ns/core/events.yaml": ("must-gather", "", ""),
        f"{image}/namespaces/ns/pods/p-1/c/c/logs/previous.log": ("must-gather", "c", ""),
    }


def test_files_of_no_known_layout_get_no_hints(tmp_path):
    bundle = make_tar(tmp_path / "b.tar.gz", [entry("x/y.log", b"y"), entry("z.json", b"{}")])
    members = run(bundle, tmp_path / "work")
    assert {(m.layout, m.hints.component, m.hints.node) for m in members} == {("", "", "")}


def test_year_is_inferred_from_the_latest_plausible_member_time(tmp_path):
    collected = datetime(2021, 7, 14, 6, 27, 8, tzinfo=UTC)
    bundle = make_tar(tmp_path / "b.tar.gz", [
        entry("old.log", b"o", mtime=datetime(2020, 12, 31, tzinfo=UTC).timestamp()),
        entry("new.log", b"n", mtime=collected.timestamp()),
        entry("epoch.log", b"e", mtime=0),  # an unset time is no evidence
    ])

    members = run(bundle, tmp_path / "work")

    assert {(m.hints.year, m.hints.year_reason) for m in members} == {
        (2021, "collection time 2021-07-14 from the bundle's file times")}
    assert {getattr(m.hints, "collected", collected) for m in members} == {collected}


def test_no_year_when_member_times_are_unset(tmp_path):
    bundle = make_tar(tmp_path / "b.tar.gz", [entry("a.log", b"a", mtime=0)])
    members = run(bundle, tmp_path / "work")
    assert [(m.hints.year, m.hints.year_reason) for m in members] == [(None, "")]


# --- is_bundle and classify ----------------------------------------------------------------------

def test_is_bundle_goes_by_content_not_name(tmp_path):
    tar_named_log = make_tar(tmp_path / "evidence.log", [entry("a", b"a")])
    gzip_named_tar = tmp_path / "audit.tar.gz"
    gzip_named_tar.write_bytes(gzip.compress(b'{"auditID": "x"}\n' * 50))
    text = tmp_path / "bundle.tar"
    text.write_bytes(b"just text\n" * 100)
    empty_tar = make_tar(tmp_path / "empty.tar", [], mode="w")

    assert is_bundle(tar_named_log)
    assert is_bundle(make_tar(tmp_path / "x.tar.xz", [entry("a", b"a")], mode="w:xz"))
    assert is_bundle(make_tar(tmp_path / "x.tar.bz2", [entry("a", b"a")], mode="w:bz2"))
    assert is_bundle(make_zip(tmp_path / "x.zip", {"a": b"a"}))
    assert is_bundle(tmp_path)
    assert is_bundle(MUST_GATHER)
    assert not is_bundle(gzip_named_tar)
    assert not is_bundle(text)
    assert not is_bundle(empty_tar)
    assert not is_bundle(tmp_path / "missing.tar.gz")


def test_classify_names_the_format_or_says_why_not(tmp_path, fixtures_dir):
    audit = (fixtures_dir / "audit" / "audit2rbac-demo.log").read_bytes()
    bundle = make_tar(tmp_path / "b.tar.gz", [
        entry("audit/kube-apiserver.log", audit),
        entry("audit/kube-apiserver.log.gz", gzip.compress(audit)),
        entry("empty.txt"),
        entry("blob.bin", bytes(range(256)) * 8),
        entry("link", kind=tarfile.SYMTYPE, linkname="/etc"),
    ])

    found = {m.name: classify(m) for m in run(bundle, tmp_path / "work")}

    assert found["audit/kube-apiserver.log"][0] == "audit"
    assert found["audit/kube-apiserver.log.gz"][0] == "audit"
    assert found["empty.txt"] == (None, "not recognised as evidence (empty file)")
    assert found["blob.bin"] == (None, "not recognised as evidence (binary)")
    assert found["link"] == (None, "not extracted: symlink")


@pytest.mark.parametrize(("content", "looks"), [
    (b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n", "YAML, kind ConfigMap"),
    (b"---\nfoo: bar\n", "YAML"),
    (b'{"apiVersion": "v1", "kind": "SecretList", "items": []}', "JSON, kind SecretList"),
    (b"<!DOCTYPE html>\n<html></html>\n", "HTML"),
    (b"\x1b[32mINFO\x1b[0m started\n", "text"),
    (gzip.compress(b"plain words\n", mtime=0)[:12], "gzip that cannot be read"),
])
def test_an_unrecognised_file_is_described_for_the_list_of_unused_files(tmp_path, content,
                                                                          looks):
    # What classify says when no parser claims a file; tested directly, because parsers for
    # more formats are being added to the registry and may claim some of these.
    path = tmp_path / "file"
    path.write_bytes(content)
    assert unpacker._describe(path) == looks


@pytest.mark.django_db
def test_a_node_has_one_name_across_its_journal_events_and_state(fixtures_dir):
    """The sonobuoy run's journals name the nodes by host name, its objects and Events by the
    Node's (fully qualified) name: after the ingest each node is one value, every row of the
    host under it; a host that no Node names keeps its name."""
    from io import StringIO

    from django.core.management import call_command

    from incidents.models import Incident
    from timelines.ingest.nodes import aliases
    from timelines.models import Event

    call_command("ingest", str(fixtures_dir / "bundles" / "sonobuoy-results-0.10.tar.gz"),
                 incident="nodes", stdout=StringIO(), stderr=StringIO())
    events = Event.objects.filter(incident=Incident.objects.get(title="nodes"))
    names = set(events.exclude(node="").values_list("node", flat=True).distinct())
    assert not aliases(names)  # no short name left whose long one is known
    long = {n for n in names if n.endswith(".us-west-2.compute.internal")}
    assert len(long) == 3
    for name in long:  # each holds its journal, its Events and its state
        assert set(events.filter(node=name).values_list("kind", flat=True).distinct()) >= {
            "log", "event", "state"}, name
    assert events.filter(node="ip-172-31-13-168", kind="log").exists()  # named by no Node


def test_node_aliases_need_exactly_one_long_name():
    from timelines.ingest.nodes import aliases

    assert aliases(["n1", "n1.ec2.internal", "n2", "n2.a.example", "n2.b.example", "localhost",
                    "n3.x", ""]) == {"n1": "n1.ec2.internal"}
