"""Fuzzing the bundle unpacker (``timelines.ingest.unpacker.unpack``) with generated tar
(plain, gzip, xz, bzip2) and zip archives: safe and hostile member names, links, devices,
directories, duplicates, nested archives, gzip members, a compression bomb, tight limits, and
archives cut short or with a byte changed. No database.

Whatever the archive: ``unpack`` raises nothing, writes nothing outside its work directory and
leaves no temporary file; every file it extracts holds exactly the bytes the archive gave that
name; and when the archive is intact and no limit was reached, every safe regular member is
extracted. See ``fuzzing``.
"""

from __future__ import annotations

import gzip
import io
import os
import random
import shutil
import tarfile
import tempfile
import warnings
import zipfile
from pathlib import Path

import pytest

from timelines.ingest import unpacker
from timelines.ingest.unpacker import Limits, unpack

from .fuzzing import EXAMPLES, fuzz, odd

LIMIT_WORDS = ("ratio", "size limit", "too many files", "nested too deep")
NAME_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789_-.é中 "
HOSTILE_NAMES = ["../evil", "/tmp/evil-abs", "a/../../evil", "C:/evil", "..\\..\\evil",
                 "./../evil", "a/" * 600 + "deep", "x" * 300, ".", "", "./",
                 unpacker.TMP_PREFIX + "x/y"]


def _safe_name(rng: random.Random, index: int) -> str:
    """A name that stays inside the bundle and never conflicts with a directory of another:
    directories start with ``d``, files with ``f``."""
    parts = ["d" + str(rng.randrange(3)) + "".join(rng.choice(NAME_CHARS)
                                                   for _ in range(rng.randrange(4)))
             for _ in range(rng.randrange(3))]
    stem = "".join(rng.choice(NAME_CHARS) for _ in range(rng.randrange(8))).strip()
    name = "/".join(parts + [f"f{index % 4}{stem}.log"])
    return ("./" + name) if rng.random() < 0.2 else name


def _content(rng: random.Random) -> bytes:
    kind = rng.randrange(3)
    if kind == 0:
        return odd(rng).encode()
    if kind == 1:
        return rng.randbytes(rng.randrange(2000))
    return b'{"kind":"Event","auditID":"a","stage":"ResponseComplete"}\n' * rng.randrange(20)


def _members(rng: random.Random, depth: int = 0) -> list[tuple]:
    """(kind, name, data) entries: "file", "link", "hardlink", "device", "fifo", "dir",
    "archive" (data: its own entries), "gzip", "bomb"."""
    entries = []
    for index in range(rng.randint(0, 5)):
        roll = rng.random()
        if roll < 0.55:
            entries.append(("file", _safe_name(rng, index), _content(rng)))
        elif roll < 0.7:
            entries.append(("file", rng.choice(HOSTILE_NAMES), _content(rng)))
        elif roll < 0.8:
            entries.append((rng.choice(["link", "hardlink", "device", "fifo", "dir"]),
                            _safe_name(rng, index), b""))
        elif roll < 0.88 and depth < 2:
            entries.append(("archive", f"f{index}inner" + rng.choice([".tar.gz", ".zip",
                                                                      ".tgz"]),
                            # an empty tar is no archive (a file kept as is)
                            _members(rng, depth + 1) or [("file", "f0.log", b"x")]))
        elif roll < 0.985:
            entries.append(("gzip", f"f{index}plain.log.gz", _content(rng)))
        else:
            entries.append(("bomb", f"f{index}bomb.log", b""))
    if entries and rng.random() < 0.15:
        entries.append(entries[0])  # a duplicate: the later one wins
    return entries


def _data(entry: tuple, rng: random.Random) -> bytes:
    kind, name, data = entry
    if kind == "archive":
        return _archive(data, rng, "zip" if name.endswith(".zip") else "w:gz")
    if kind == "gzip":
        return gzip.compress(data, mtime=0)
    if kind == "bomb":
        return b"\0" * ((1 << 20) + (1 << 18))  # judged past RATIO_GRACE (1 MiB)
    return data


def _archive(entries: list[tuple], rng: random.Random, mode: str) -> bytes:
    out = io.BytesIO()
    if mode == "zip":
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive, \
                warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # a duplicate name: meant
            for entry in entries:
                kind, name, _ = entry
                info = zipfile.ZipInfo(name or "../empty")
                if kind in ("link", "hardlink"):  # zip has no hard links: a symlink
                    info.external_attr = 0o120777 << 16
                elif kind in ("device", "fifo"):
                    info.external_attr = 0o010644 << 16
                elif kind == "dir":
                    info = zipfile.ZipInfo((name or "d") + "/")
                info.compress_type = zipfile.ZIP_DEFLATED
                archive.writestr(info, b"../../outside" if kind in ("link", "hardlink")
                                else _data(entry, rng))
        return out.getvalue()
    with tarfile.open(fileobj=out, mode=mode, format=rng.choice([tarfile.GNU_FORMAT,
                                                                 tarfile.PAX_FORMAT])) as tar:
        for entry in entries:
            kind, name, _ = entry
            info = tarfile.TarInfo(name)
            info.mtime = rng.randrange(2**31)
            payload = b""
            if kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, rng.choice(["../../outside",
                                                                          "/etc/passwd", "f0"])
            elif kind == "hardlink":
                info.type, info.linkname = tarfile.LNKTYPE, "../../outside"
            elif kind == "device":
                info.type = tarfile.CHRTYPE
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
            elif kind == "dir":
                info.type = tarfile.DIRTYPE
            else:
                payload = _data(entry, rng)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload) if payload or info.isreg() else None)
    return out.getvalue()


def _expected(entries: list[tuple], prefix: str = "") -> dict[str, list[bytes]]:
    """What an intact archive extracts: safe regular files, the files of nested archives under
    the archive's name, gzip files as they are; for each name every content the archive gave it
    (the last one wins, unless a limit stopped the unpacking before it)."""
    found: dict[str, list[bytes]] = {}
    for kind, name, data in entries:
        clean = "/".join(p for p in name.split("/") if p not in ("", "."))
        if kind == "archive":
            for inner, contents in _expected(data, prefix + clean + "/").items():
                found.setdefault(inner, []).extend(contents)
        elif kind in ("file", "gzip", "bomb") and name not in HOSTILE_NAMES:
            found.setdefault(prefix + clean, []).append(_data((kind, name, data),
                                                              random.Random(0)))
    return found


def bundle_case(rng: random.Random) -> tuple:
    entries = _members(rng)
    mode = rng.choice(["w", "w:gz", "w:gz", "w:xz", "w:bz2", "zip", "zip"])
    archive = _archive(entries, rng, mode)
    damage = rng.random()
    if damage < 0.15 and archive:
        archive = archive[: rng.randrange(len(archive))]
    elif damage < 0.3 and archive:
        at = rng.randrange(len(archive))
        archive = archive[:at] + bytes([archive[at] ^ (1 << rng.randrange(8))]) + archive[at + 1:]
    limits = Limits(max_total_bytes=rng.choice([20 * 1024**3, 20_000]),
                    max_files=rng.choice([100_000, 3]), max_ratio=200.0,
                    max_depth=rng.choice([3, 0]))
    return entries, archive, limits, damage >= 0.3


@pytest.fixture
def scratch(tmp_path):
    """A directory in memory (``/dev/shm``) where the machine has one: 10,000 small unpackings
    spend most of their time making and removing directories on disk."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    path = Path(tempfile.mkdtemp(prefix="hindsight-fuzz-", dir=shm))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_generated_archives_unpack_safely_and_lose_no_member(scratch):
    root = scratch / "sandbox"

    def check(case):
        entries, archive, limits, intact = case
        shutil.rmtree(root, ignore_errors=True)
        work = root / "work"
        outside = root / "outside"
        outside.mkdir(parents=True)
        path = root / "bundle.upload"
        path.write_bytes(archive)
        members = list(unpack(path, work, limits))
        # nothing outside the work directory, no temporary directory left in it
        assert sorted(p.name for p in root.iterdir()) == ["bundle.upload", "outside", "work"]
        assert list(outside.iterdir()) == []
        assert not [p for p in work.iterdir() if p.name.startswith(unpacker.TMP_PREFIX)]
        on_disk = {str(p.relative_to(work)) for p in work.rglob("*") if p.is_file()}
        extracted = {m.name: m.path.read_bytes() for m in members if m.path is not None}
        assert set(extracted) == on_disk
        for member in members:
            assert (member.path is None) == bool(member.refused), member
            if member.path is not None:
                assert os.path.realpath(member.path).startswith(str(work.resolve()) + os.sep)
        if not intact:
            return  # a changed byte may change a member's bytes: only safety is judged
        expected = _expected(entries)
        for name, content in extracted.items():
            assert content in expected.get(name, []), name
        if not any(word in m.refused for m in members for word in LIMIT_WORDS) and \
                not any(m.refused.startswith("corrupt archive") for m in members):
            assert set(extracted) == set(expected)
            assert all(expected[name][-1] == content for name, content in extracted.items())

    fuzz(check, bundle_case)


def test_a_plain_tar_cut_inside_a_member_keeps_the_members_before_it(tmp_path):
    """Found by the fuzzing above: tarfile's "unexpected end of data" escaped ``unpack``."""
    entries = [("file", "f0.log", b"first\n"), ("file", "f1.log", b"x" * 5000)]
    archive = _archive(entries, random.Random(1), "w")
    path = tmp_path / "cut.tar"
    path.write_bytes(archive[: archive.index(b"x" * 100) + 1000])
    members = list(unpack(path, tmp_path / "work"))
    assert {m.name: m.path.read_bytes() for m in members if m.path} == {"f0.log": b"first\n"}
    assert [m.refused for m in members if m.refused] == ["corrupt archive: unexpected end of data"]


@pytest.mark.django_db
def test_generated_bundles_become_one_child_upload_per_member(incident, tmp_path, settings):
    """``timelines.ingest.bundle.unpack_upload`` over generated archives (fewer: each writes
    rows): a child upload per member, pending with its file in the bundle's work directory or
    failed naming the member and why; never an exception."""
    from incidents.models import Upload
    from timelines.ingest.bundle import SKIPPED_REFUSALS, unpack_upload, work_dir

    settings.UPLOAD_DIR = str(tmp_path / "uploads")
    path = tmp_path / "bundle.upload"

    def check(case):
        entries, archive, limits, intact = case
        path.write_bytes(archive)
        upload = Upload.objects.create(incident=incident, name="b.tar", path=str(path),
                                       path_is_copy=False, status=Upload.Status.RUNNING)
        settings.BUNDLE_MAX_BYTES, settings.BUNDLE_MAX_FILES = (limits.max_total_bytes,
                                                                limits.max_files)
        members = list(unpack(path, tmp_path / "reference", Limits(
            max_total_bytes=limits.max_total_bytes, max_files=limits.max_files,
            max_ratio=settings.BUNDLE_MAX_RATIO)))
        pending = unpack_upload(upload)
        children = list(upload.files.order_by("pk"))
        assert [c.name for c in children] == [m.name[:1000] for m in members]
        assert sorted(pending) == [c.pk for c in children if c.status == "pending"]
        root = str(work_dir(upload).resolve()) + os.sep
        for child, member in zip(children, members, strict=True):
            if member.refused in SKIPPED_REFUSALS:  # a link or a device: no evidence lost
                assert child.status == "skipped" and member.refused in child.message
            elif member.refused:
                assert child.status == "failed" and member.refused in child.message
            else:
                assert child.status == "pending" and child.path.startswith(root)
                assert Path(child.path).read_bytes() == member.path.read_bytes()
        shutil.rmtree(work_dir(upload), ignore_errors=True)
        shutil.rmtree(tmp_path / "reference")

    fuzz(check, bundle_case, examples=max(EXAMPLES // 50, 20))
