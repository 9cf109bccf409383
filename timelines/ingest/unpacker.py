"""Diagnose bundles: unpack one safely into a work directory and say what every file in it is.

A bundle is a tar (plain, gzip, xz or bzip2) or zip archive, or a directory. ``unpack`` writes
its regular files under ``workdir`` and yields one ``Member`` per file: where it is on disk and
what the bundle's layout (OpenShift must-gather, kind, konvoy/DKP, troubleshoot.sh, sonobuoy)
says about it, that is the component and node that wrote it and the year of the collection.
``classify`` then says which parser of the registry, if any, reads it, and if none, why.

Uploads are hostile until shown otherwise. Nothing is ever written outside ``workdir``: entries
that would be (absolute paths, ``..``), links, devices and FIFOs are refused one by one and the
rest of the bundle is still extracted. The limits on bytes, files, compression ratio and nesting
are enforced on the bytes as they come out of the decompressor, never on the sizes an archive
claims. No Django imports: pure code, testable without a database.
"""

from __future__ import annotations

import bz2
import contextlib
import errno
import gzip
import lzma
import os
import re
import shutil
import stat
import tarfile
import tempfile
import zipfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import BinaryIO

from ..parsers import describe_unknown, detect, read_head
from ..parsers.base import GZIP_MAGIC, ParseHints

CHUNK = 1 << 20
# A ratio is judged only past this many bytes: small files compress arbitrarily well, and what
# many small files add up to is bounded by the overall ratio and the byte budget.
RATIO_GRACE = 1 << 20
# Compressed bytes credited to each tar member: the decompressor reads ahead, so the compressed
# bytes consumed while a member is read can be zero for a member inside a block already read.
RATIO_SLACK = 64 << 10
# tarfile reads pax and GNU long-name headers into memory whole; a forged size would allocate
# gigabytes before any of our checks ran.
MAX_META_BYTES = 1 << 20
# Longer names are refused (and shown cut): the real ones are a few hundred characters, and a
# refused member's name is kept in memory.
MAX_NAME = 1024
XZ_MAGIC = b"\xfd7zXZ\x00"
BZ2_MAGIC = b"BZh"
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.xz", ".txz", ".tar.bz2", ".tbz2", ".zip")
TMP_PREFIX = ".hindsight-unpack-"
# File times before Kubernetes existed (zip's 1980 default, tar's 0) say nothing of a collection.
EARLIEST_COLLECTION = datetime(2014, 6, 1, tzinfo=UTC)
# ParseHints.collected (when the bundle was collected) is being added alongside this module;
# set it where the field exists.
_HINTS_COLLECTED = "collected" in {f.name for f in fields(ParseHints)}
_META_TYPES = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE,
               tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)


@dataclass(frozen=True)
class Limits:
    """What one bundle may cost. ``max_total_bytes`` bounds the uncompressed bytes that come out
    of the bundle's archives (written, or read to be skipped) and so the bytes written;
    ``max_files`` counts every entry that becomes a ``Member`` (directories excluded);
    ``max_ratio`` bounds uncompressed/compressed per member and for the whole bundle;
    ``max_depth`` is how many archives deep an archive inside the bundle is still unpacked."""

    max_total_bytes: int = 20 * 1024**3
    max_files: int = 100_000
    max_ratio: float = 200.0
    max_depth: int = 3


@dataclass
class Member:
    """One file of a bundle. ``name`` is its '/'-separated path inside the bundle (a file of a
    nested archive is ``outer.tar.gz/inner/file``, a leading ``./`` is dropped); ``path`` is
    where it was extracted (absolute, always inside ``workdir``), or None when it was refused,
    with the reason in ``refused``; ``size`` is the bytes written, or for a refused entry the
    size its archive declared.

    A refused entry keeps the name the archive gave it (``../evil``). When a limit stops the
    unpacking or an archive breaks between two entries, the refused member is named after the
    archive: the nested archive's name, or the bundle's file name for the bundle itself."""

    name: str
    path: Path | None
    size: int
    hints: ParseHints = field(default_factory=ParseHints)
    layout: str = ""
    refused: str = ""


def is_bundle(path: Path) -> bool:
    """True for a directory, or a file whose content (not its name) is a tar archive (plain,
    gzip, xz or bzip2) or a zip archive. An empty archive is not a bundle."""
    path = Path(path)
    return path.is_dir() or (path.is_file() and _sniff(path) is not None)


DEFAULT_LIMITS = Limits()


def unpack(path: Path, workdir: Path, limits: Limits = DEFAULT_LIMITS) -> Iterator[Member]:
    """Extract the bundle at ``path`` under ``workdir`` and yield a ``Member`` per file in it.

    Extraction streams (memory does not grow with file sizes), but members are yielded once the
    whole bundle is on disk: a file's layout and the collection year can depend on files later
    in the archive. A hostile entry is refused alone, and so is a member over the ratio (its
    own, or the bundle's overall ratio): it is skipped and what follows it is read. Over the
    byte budget or the file count, limits of the whole bundle, the member at hand is refused
    and unpacking stops: what was extracted before stays. A corrupt or truncated
    archive keeps what was read before the damage and adds one refused ``corrupt archive: …``
    member (a zip member with a bad CRC fails alone). Nested archives are unpacked in place of
    the archive file, up to ``limits.max_depth``; single gzip files are left as they are.

    Temporary files live in one directory inside ``workdir`` (``TMP_PREFIX``…) that is removed
    before this returns or raises; no partial file is ever left. Errors writing to ``workdir``
    (disk full) propagate; the caller removes ``workdir``. A missing ``path`` raises
    FileNotFoundError; a file that is no archive gives one refused member.
    """
    path, workdir = Path(path), Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    tmpdir = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=workdir))
    unpacker = _Unpacker(limits, workdir.resolve(), tmpdir)
    try:
        unpacker.run(path)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    yield from unpacker.result()


def classify(member: Member) -> tuple[str | None, str]:
    """The format that reads ``member`` (a registry name such as "audit") or None, and why."""
    if member.path is None:
        return None, f"not extracted: {member.refused}"
    fmt = detect(read_head(member.path), member.name)
    if fmt is not None:
        return fmt.name, f"recognised as {fmt.name} from its first bytes"
    return None, f"not recognised as evidence ({_describe(member.path)})"


# --- reading ------------------------------------------------------------------------------------

class _Halt(Exception):
    """Reading stops; ``reported`` once a refused Member says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.reported = False


class _Stop(_Halt):
    """A limit of the whole bundle was reached: nothing more is read."""


class _Broken(_Halt):
    """The archive being read is corrupt or truncated: nothing more is read from it."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"corrupt archive: {reason}")


def _why(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


class _Raw:
    """A file that counts the bytes read from it: the compressed side of a ratio. Bytes read from
    the upload itself (``state`` given) also count for the bundle's overall ratio."""

    def __init__(self, handle: BinaryIO, state: _Unpacker | None) -> None:
        self.handle = handle
        self.count = 0
        self.state = state

    def read(self, size: int = -1) -> bytes:
        data = self.handle.read(size)
        self.count += len(data)
        if self.state is not None:
            self.state.consumed += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.handle.seek(offset, whence)

    def tell(self) -> int:
        return self.handle.tell()

    def seekable(self) -> bool:
        return True


class _Produced:
    """Uncompressed bytes as they come out of an archive. Every read, including the reads that
    skip a refused member, counts against the byte budget and the overall ratio, so that
    decompression work is bounded too; any failure to read becomes ``_Broken``."""

    def __init__(self, inner: BinaryIO | _Raw, state: _Unpacker) -> None:
        self.inner = inner
        self.state = state

    def read(self, size: int = -1) -> bytes:
        try:
            data = self.inner.read(CHUNK if size is None or size < 0 else size)
        except _Halt:
            raise
        except Exception as exc:  # noqa: BLE001 - gzip, lzma, bz2, zlib, zipfile, OSError: all "corrupt"
            raise _Broken(_why(exc)) from exc
        self.state.produce(len(data))
        return data

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.inner.close()  # type: ignore[union-attr]


class _TarData:
    """A tar member's data: the archive ending inside it (tarfile's ReadError, "unexpected end
    of data", met on a plain tar cut short) is a broken archive, not an error of ``unpack``."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def read(self, size: int = -1) -> bytes:
        try:
            return self.inner.read(size)
        except tarfile.TarError as exc:
            raise _Broken(_why(exc)) from exc


class _GuardedTarInfo(tarfile.TarInfo):
    """A TarInfo that refuses an extended (pax, GNU long name) header over MAX_META_BYTES."""

    @classmethod
    def fromtarfile(cls, tar):  # type: ignore[override]
        # TarInfo.fromtarfile of CPython 3.11-3.13, plus the size check before _proc_member.
        buf = tar.fileobj.read(tarfile.BLOCKSIZE)
        obj = cls.frombuf(buf, tar.encoding, tar.errors)
        if obj.type in _META_TYPES and obj.size > MAX_META_BYTES:
            raise tarfile.SubsequentHeaderError(f"extended header of {obj.size} bytes")
        obj.offset = tar.fileobj.tell() - tarfile.BLOCKSIZE
        return obj._proc_member(tar)


def _decompressing(raw: _Raw | BinaryIO, magic: bytes):
    """A bounded-output reader over ``raw`` for its compression (the stdlib file classes
    decompress at most what is asked; tarfile's own stream decompresses a whole block at once)."""
    if magic.startswith(GZIP_MAGIC):
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[arg-type]
    if magic.startswith(XZ_MAGIC):
        return lzma.LZMAFile(raw)
    if magic.startswith(BZ2_MAGIC):
        return bz2.BZ2File(raw)
    return raw


def _sniff(path: Path) -> str | None:
    """"tar" or "zip" from a file's content, or None."""
    try:
        with open(path, "rb") as handle:
            magic = handle.read(8)
            handle.seek(0)
            if magic.startswith(ZIP_MAGICS):
                return "zip" if zipfile.is_zipfile(handle) else None
            with _decompressing(handle, magic) as stream:
                block = stream.read(tarfile.BLOCKSIZE)
    except Exception:  # noqa: BLE001 - unreadable or not what its magic said: not an archive
        return None
    try:
        tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")  # checks the header checksum
    except tarfile.HeaderError:
        return None  # includes an all-zero first block: an empty archive
    return "tar"


def _text(name: str) -> str:
    """A name as text: bytes that are not UTF-8 (kept by tarfile as surrogates) become U+FFFD."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _shown(prefix: str, name: str) -> str:
    """How an entry is named in a refused Member: as the archive has it, cut if very long."""
    shown = prefix + _text(name)
    return shown if len(shown) <= MAX_NAME else shown[:MAX_NAME] + "…"


def _clean(name: str) -> tuple[str, str]:
    """``(relative path, "")`` for a name that stays inside the bundle, else ``("", reason)``."""
    name = _text(name).replace("\\", "/")  # Windows zips separate with backslashes
    if "\x00" in name:
        return "", "invalid name"
    if name.startswith("/") or re.match(r"[A-Za-z]:/", name):
        return "", "absolute path"
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        return "", "path escapes the bundle"
    if not parts or parts[0].startswith(TMP_PREFIX):
        return "", "invalid name"
    if len(name) > MAX_NAME or any(len(part.encode()) > 255 for part in parts):
        return "", "name too long"
    return "/".join(parts), ""


def _zip_refusal(info: zipfile.ZipInfo) -> str:
    mode = info.external_attr >> 16  # Unix mode bits, when a Unix zip wrote them
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        return "device file"
    if info.flag_bits & 0x1:
        return "encrypted"
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        # zipfile decompresses bzip2 and lzma members without an output bound.
        return f"unsupported zip compression (method {info.compress_type})"
    return ""


def _tar_refusal(info: tarfile.TarInfo) -> str:
    if info.issym():
        return "symlink"
    if info.islnk():
        return "hardlink"
    if info.ischr() or info.isblk() or info.isfifo():
        return "device file"
    if not info.isreg():
        return f"unsupported entry type {info.type.decode(errors='replace')!r}"
    return ""


def _inside(path: Path, root: Path, *, resolve: bool = True) -> bool:
    """Whether ``path`` is ``root`` or under it: on disk (links resolved), or by name alone."""
    real = os.path.realpath(path) if resolve else os.path.normpath(path)
    return real == str(root) or real.startswith(str(root) + os.sep)


# --- unpacking ----------------------------------------------------------------------------------

class _Unpacker:
    """The state of one ``unpack``: counters the limits are checked against, members so far."""

    def __init__(self, limits: Limits, workdir: Path, tmpdir: Path) -> None:
        self.limits = limits
        self.workdir = workdir
        self.tmpdir = tmpdir
        self.members: list[Member | None] = []
        self.where: dict[str, int] = {}  # extracted name -> index: a later duplicate replaces it
        self.produced = 0  # uncompressed bytes out of every archive (or copied from a directory)
        self.consumed = 0  # bytes read from the upload itself
        # Of ``produced``, the bytes of refused members (read before the refusal, or skipped
        # after it): they cost work, so they count against the byte budget, but nothing of them
        # is kept, so they do not count for the bundle's ratio, or one bomb would stop the rest.
        self.dropped = 0
        self.entries = 0
        self.latest_mtime: float | None = None

    def ratio_reason(self, ratio: float) -> str:
        # Whole numbers, unless rounding would show a ratio just over the limit as equal to it.
        shown = f"{ratio:.0f}" if round(ratio) > self.limits.max_ratio else f"{ratio:.2f}"
        return f"compression ratio {shown} over {self.limits.max_ratio:g}"

    def produce(self, size: int) -> None:
        self.produced += size
        if self.produced > self.limits.max_total_bytes:
            raise _Stop("over the size limit")

    def bundle_ratio(self) -> float:
        """Kept uncompressed bytes over the bytes read from the upload, or 0 within the grace."""
        kept = self.produced - self.dropped
        return kept / max(self.consumed, 1) if kept > RATIO_GRACE else 0.0

    def discard(self, src, already: int = 0) -> None:
        """Read a refused member to its end (a tar stream has no other way past it), counting
        what it produced, ``already`` read included, as dropped."""
        self.dropped += already
        while chunk := src.read(CHUNK):
            self.dropped += len(chunk)

    def refuse(self, name: str, reason: str, size: int = 0) -> None:
        self.members.append(Member(name, None, size, ParseHints(), "", reason))

    def admit(self, name: str) -> None:
        """Count one more entry; past ``max_files`` it is refused and unpacking stops."""
        self.entries += 1
        if self.entries > self.limits.max_files:
            self.stop(name, "too many files")

    def stop(self, name: str, reason: str) -> None:
        """Refuse ``name`` and end the unpacking."""
        self.refuse(name, reason)
        stop = _Stop(reason)
        stop.reported = True
        raise stop

    def saw_time(self, stamp: float) -> None:
        """Note a regular file's time (seconds since the epoch) unless it is implausible."""
        latest = (datetime.now(UTC) + timedelta(days=2)).timestamp()
        if EARLIEST_COLLECTION.timestamp() <= stamp <= latest:
            self.latest_mtime = max(self.latest_mtime or stamp, stamp)

    def run(self, path: Path) -> None:
        try:
            if path.is_dir():
                self.walk(path)
                return
            if not path.is_file():
                raise FileNotFoundError(errno.ENOENT, "no bundle there", str(path))
            kind = _sniff(path)
            if kind is None:
                self.refuse(path.name, "corrupt archive: not a tar or zip archive")
                return
            with open(path, "rb") as handle:
                self.unpack_archive(handle, kind, "", 0, path.name, top=True)
        except _Stop:
            pass  # already reported as a refused member

    def unpack_archive(self, handle: BinaryIO, kind: str, prefix: str, depth: int,
                       archive_name: str, *, top: bool) -> None:
        """Unpack one archive; its members are named ``prefix + name``. A broken archive ends
        here; a ``_Stop`` goes on up to end everything."""
        try:
            if kind == "zip":
                self.unpack_zip(handle, prefix, depth, archive_name, top=top)
            else:
                self.unpack_tar(handle, prefix, depth, top=top)
        except _Halt as halt:
            if not halt.reported:
                halt.reported = True
                self.refuse(archive_name, halt.reason)
            if isinstance(halt, _Stop):
                raise

    def unpack_tar(self, handle: BinaryIO, prefix: str, depth: int, *, top: bool) -> None:
        magic = handle.read(8)
        handle.seek(0)
        raw = _Raw(handle, self if top else None)
        stream = _Produced(_decompressing(raw, magic), self)
        try:
            tar = tarfile.open(fileobj=stream, mode="r|", tarinfo=_GuardedTarInfo)  # type: ignore[call-overload]
        except tarfile.TarError as exc:
            raise _Broken(_why(exc)) from exc
        with tar:
            while True:
                try:
                    info = tar.next()
                except tarfile.TarError as exc:
                    raise _Broken(_why(exc)) from exc
                if info is None:
                    return
                # Stream mode keeps every header it has read; memory would grow with entries.
                tar.members.clear()
                if info.isdir():
                    continue
                shown = _shown(prefix, info.name)
                self.admit(shown)
                if info.isreg():
                    self.saw_time(info.mtime)
                clean, reason = _clean(info.name)
                reason = _tar_refusal(info) or reason
                if reason:
                    self.refuse(shown, reason, info.size)
                    if info.isreg():  # its data is skipped, and kept nowhere
                        self.discard(_TarData(tar.extractfile(info)))
                    continue
                start = raw.count
                self.write(prefix + clean, _TarData(tar.extractfile(info)), info.size,
                           lambda start=start: raw.count - start + RATIO_SLACK, depth)

    def unpack_zip(self, handle: BinaryIO, prefix: str, depth: int, archive_name: str, *,
                   top: bool) -> None:
        raw = _Raw(handle, self if top else None)
        try:
            # Counted before ZipFile parses the central directory: that holds every entry.
            declared = zipfile._EndRecData(raw)[zipfile._ECD_ENTRIES_TOTAL]  # type: ignore[attr-defined]
            if declared > self.limits.max_files - self.entries:
                self.stop(archive_name, "too many files")
            archive = zipfile.ZipFile(raw)  # type: ignore[arg-type]
        except _Halt:
            raise
        except Exception as exc:  # noqa: BLE001 - BadZipFile, OSError, ...: corrupt
            raise _Broken(_why(exc)) from exc
        with archive:
            for info in archive.infolist():
                if info.is_dir():
                    continue
                shown = _shown(prefix, info.filename)
                self.admit(shown)
                with contextlib.suppress(ValueError):  # zip times are local: near enough
                    self.saw_time(datetime(*info.date_time, tzinfo=UTC).timestamp())
                clean, reason = _clean(info.filename)
                reason = _zip_refusal(info) or reason
                if reason:
                    self.refuse(shown, reason, info.file_size)
                    continue
                try:
                    src = _Produced(archive.open(info), self)
                except Exception as exc:  # noqa: BLE001 - a bad local header: this member only
                    self.refuse(shown, _Broken(_why(exc)).reason, info.file_size)
                    continue
                try:
                    self.write(prefix + clean, src, info.file_size,
                               lambda info=info: info.compress_size, depth, stream=False)
                except _Broken:
                    continue  # reported; a zip's other members do not depend on this one
                finally:
                    src.close()

    def walk(self, root: Path) -> None:
        """Copy a directory's regular files (symlinks are not followed: they are refused)."""
        stack: list[tuple[Path, str]] = [(root, "")]
        while stack:
            directory, prefix = stack.pop()
            with os.scandir(directory) as scan:
                entries = sorted(scan, key=lambda entry: entry.name)
            subdirs = []
            for entry in entries:
                name = prefix + _text(entry.name)
                if entry.is_dir(follow_symlinks=False):
                    if os.path.realpath(entry.path) != str(self.workdir):  # workdir inside it
                        subdirs.append((Path(entry.path), name + "/"))
                    continue
                shown = _shown("", name)
                self.admit(shown)
                clean, reason = _clean(name)
                if entry.is_symlink():
                    reason = "symlink"
                elif not entry.is_file(follow_symlinks=False):
                    reason = "device file"
                if reason:
                    self.refuse(shown, reason)
                    continue
                try:
                    # The entry may have been swapped since scandir: no following a symlink, no
                    # blocking on a FIFO, and a regular file or nothing.
                    fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                except OSError as exc:
                    self.refuse(shown, f"unreadable: {exc.strerror}")
                    continue
                handle = os.fdopen(fd, "rb")
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    handle.close()
                    self.refuse(shown, "device file")
                    continue
                with handle, contextlib.suppress(_Broken):  # an unreadable file: reported, next
                    raw = _Raw(handle, self)
                    self.write(clean, _Produced(raw, self), os.fstat(fd).st_size,
                               lambda raw=raw: raw.count + RATIO_SLACK, 0, stream=False)
            stack.extend(reversed(subdirs))  # depth first, in name order

    def write(self, name: str, src, declared: int, compressed: Callable[[], int],
              depth: int, *, stream: bool = True) -> None:
        """Copy one regular file to ``workdir/name``, or unpack it there if it is an archive.

        ``compressed()`` is the compressed size attributed to the bytes read so far; the ratio
        is checked on every chunk before it is written. The copy goes to a temporary file that
        is moved into place only when complete. A refused member of a ``stream`` (a tar) is read
        to its end, the only way past it; a zip's or a directory's is left where it is."""
        fd, tmp = tempfile.mkstemp(dir=self.tmpdir)
        try:
            written = 0
            with os.fdopen(fd, "wb") as out:
                while True:
                    try:
                        chunk = src.read(CHUNK)
                    except _Halt as halt:
                        halt.reported = True
                        self.refuse(name, halt.reason, declared)
                        raise
                    if not chunk:
                        break
                    written += len(chunk)
                    ratio = written / max(compressed(), 1)
                    reason = ""
                    if written > RATIO_GRACE and ratio > self.limits.max_ratio:
                        reason = self.ratio_reason(ratio)
                    elif (overall := self.bundle_ratio()) > self.limits.max_ratio:
                        reason = f"{self.ratio_reason(overall)} for the bundle"
                    if reason:
                        # This member alone is refused: what follows it is still read.
                        self.refuse(name, reason, declared)
                        if stream:
                            self.discard(src, written)
                        else:
                            self.dropped += written
                        return
                    out.write(chunk)
            kind = _sniff(Path(tmp)) if name.lower().endswith(ARCHIVE_SUFFIXES) else None
            if kind is None:
                self.place(tmp, name, written)
            elif depth + 1 > self.limits.max_depth:
                self.refuse(name, "nested too deep", written)
                self.dropped += written
            else:
                with open(tmp, "rb") as handle:
                    self.unpack_archive(handle, kind, name + "/", depth + 1, name, top=False)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def place(self, tmp: str, name: str, size: int) -> None:
        dest = self.workdir / name
        # Never true after _clean, and we create no links; checked again all the same, by name
        # before any directory is made, then on disk.
        if not _inside(dest, self.workdir, resolve=False):
            self.refuse(name, "path escapes the bundle", size)
            self.dropped += size
            return
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            if not _inside(dest.parent, self.workdir):
                self.refuse(name, "path escapes the bundle", size)
                self.dropped += size
                return
            os.replace(tmp, dest)
        except (FileExistsError, NotADirectoryError, IsADirectoryError):
            self.refuse(name, "path conflicts with another file in the bundle", size)
            self.dropped += size
            return
        if name in self.where:  # a later entry of the same name wins, as with tar -x
            self.members[self.where[name]] = None
        self.where[name] = len(self.members)
        self.members.append(Member(name, dest, size))

    def result(self) -> list[Member]:
        members = [member for member in self.members if member is not None]
        _assign_layouts(members)
        found = _collection_time(members, self.latest_mtime)
        if found is not None:
            when, source = found
            hints = {"year": when.year,
                     "year_reason": f"collection time {when:%Y-%m-%d} from {source}"}
            if _HINTS_COLLECTED:
                hints["collected"] = when
            for member in members:
                member.hints = replace(member.hints, **hints)
        return members


# --- layouts ------------------------------------------------------------------------------------

# What marks a bundle of each layout, most specific first; ``root`` is the directory the layout
# covers (for must-gather, the parent of the gather image's directory).
_MARKERS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("must-gather", re.compile(
        r"(?P<root>(?:[^/]+/)*?)(?:[^/]+/)?(?:namespaces/[^/]+/(?:core|pods)/"
        r"|cluster-scoped-resources/|host_service_logs/|audit_logs/[^/]*apiserver[^/]*/)")),
    ("sonobuoy", re.compile(
        r"(?P<root>(?:[^/]+/)*?)(?:podlogs/[^/]+/[^/]+/logs/|plugins/[^/]+/results/"
        r"|resources/(?:ns/[^/]+|cluster)/[^/]+\.json$"
        r"|meta/(?:run\.log|config\.json|info\.json|query-time\.json)$)")),
    ("troubleshoot", re.compile(r"(?P<root>(?:[^/]+/)*?)cluster-resources/")),
    ("konvoy", re.compile(
        r"(?P<root>(?:[^/]+/)*?)[^/]+/(?:var/log/kubernetes/audit/[^/]+"
        r"|kubelet\.service\.log|containerd\.service\.log|journalctl\.log)$")),
    ("kind", re.compile(
        r"(?P<root>(?:[^/]+/)*?)[^/]+/(?:kubelet\.log|containerd\.log|journal\.log"
        r"|kubernetes-version\.txt|pods/[^/_]+_[^/_]+_[^/]+/[^/]+/\d+\.log|containers/[^/]+\.log)$")),
)
_ORDER = [layout for layout, _ in _MARKERS]  # breaks a tie of votes


def _hints_must_gather(rel: str) -> ParseHints:
    if match := re.search(
            r"(?:^|/)namespaces/([^/]+)/pods/([^/]+)/([^/]+)/\3/logs/[^/]+$", rel):
        return ParseHints(component=match[3], pod=f"{match[1]}/{match[2]}")
    if match := re.search(r"(?:^|/)host_service_logs/[^/]+/([^/]+?)_service\.log(?:\.gz)?$", rel):
        return ParseHints(component=match[1])
    if match := re.search(r"(?:^|/)audit_logs/([^/]+)/([^/]+)$", rel):
        node = match[2].split("-audit")[0] if "-audit" in match[2] else ""
        return ParseHints(component=match[1], node=node)
    return ParseHints()


def _node_pod(rest: str) -> str:
    """"namespace/name" of the pod that wrote a file of a node's directory (kind), or ""."""
    if match := re.search(r"(?:^|/)pods/([^/_]+)_([^/_]+)_[^/]+/[^/]+/\d+\.log(?:\.gz)?$", rest):
        return f"{match[1]}/{match[2]}"
    if match := re.search(r"(?:^|/)containers/([^/_]+)_([^/_]+)_[^/]+-[0-9a-f]{64}\.log$", rest):
        return f"{match[2]}/{match[1]}"
    return ""


def _node_component(rest: str) -> str:
    """The program that wrote a file of a node's directory (kind, konvoy), or ""."""
    base = rest.rsplit("/", 1)[-1]
    if match := re.search(r"(?:^|/)pods/[^/_]+_[^/_]+_[^/]+/([^/]+)/\d+\.log(?:\.gz)?$", rest):
        return match[1]
    if match := re.search(r"(?:^|/)containers/[^/_]+_[^/_]+_([^/]+)-[0-9a-f]{64}\.log$", rest):
        return match[1]
    if "kubernetes/audit/" in rest or re.fullmatch(
            r"(?:kube-apiserver-)?audit(?:[-.][^/]*)?\.log(?:\.gz)?", base):
        return "kube-apiserver"
    if rest in ("kubelet.log", "containerd.log"):
        return rest.removesuffix(".log")
    if match := re.fullmatch(r"([^/]+)\.service\.log", rest):
        return match[1]
    return ""  # journal.log, journalctl.log: one file, every unit of the node


def _hints_node_dirs(rel: str) -> ParseHints:
    node, slash, rest = rel.partition("/")
    if not slash:
        return ParseHints()
    for suffix in ARCHIVE_SUFFIXES:  # konvoy ships a node as bundles/<node>.tar.gz
        if node.lower().endswith(suffix):
            node = node[: -len(suffix)]
            break
    return ParseHints(component=_node_component(rest), node=node, pod=_node_pod(rest))


def _hints_troubleshoot(rel: str) -> ParseHints:
    match = re.search(
        r"(?:^|/)cluster-resources/pods/logs/([^/]+)/([^/]+)/([^/]+?)(?:-previous)?\.log$", rel)
    return ParseHints(component=match[3], pod=f"{match[1]}/{match[2]}") if match else ParseHints()


def _hints_sonobuoy(rel: str) -> ParseHints:
    if match := re.fullmatch(r"podlogs/([^/]+)/([^/]+)/logs/([^/]+)\.txt", rel):
        return ParseHints(component=match[3], pod=f"{match[1]}/{match[2]}")
    if match := re.match(r"plugins/systemd[-_]logs/results/(?:global/)?([^/]+?)(?:\.json)?(?:/|$)",
                         rel):
        return ParseHints(node=match[1])
    if match := re.match(r"hosts/([^/]+)/", rel):
        return ParseHints(node=match[1])
    return ParseHints()


_HINTS: dict[str, Callable[[str], ParseHints]] = {
    "must-gather": _hints_must_gather, "sonobuoy": _hints_sonobuoy,
    "troubleshoot": _hints_troubleshoot, "konvoy": _hints_node_dirs, "kind": _hints_node_dirs,
}


def _root_of(name: str, roots: dict[str, str]) -> str | None:
    """The longest directory of ``name`` (or "") that is a layout's root."""
    end = len(name)
    while end >= 0:
        end = name.rfind("/", 0, end)
        if (candidate := name[: end + 1]) in roots:
            return candidate
    return None


def _assign_layouts(members: list[Member]) -> None:
    """Each root takes the layout most of its files mark; every file under it gets that layout
    and the hints its path gives. A bundle may hold several (a zip of two must-gathers)."""
    votes: dict[str, Counter[str]] = {}
    for member in members:
        for layout, marker in _MARKERS:
            if match := marker.match(member.name):
                votes.setdefault(match["root"], Counter())[layout] += 1
                break
    roots = {root: max(counts, key=lambda layout: (counts[layout], -_ORDER.index(layout)))
             for root, counts in votes.items()}
    for member in members:
        root = _root_of(member.name, roots)
        if root is not None:
            member.layout = roots[root]
            member.hints = _HINTS[member.layout](member.name[len(root):])


# --- collection time ----------------------------------------------------------------------------

# A time with its zone, as must-gather's ``timestamp`` (``2021-08-03 10:12:00.0169 +0000 UTC``)
# and sonobuoy's logs (``2017-12-13T17:05:25Z``) write it.
_TIME = re.compile(rb"(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:\.\d+)?) ?(Z|[+-]\d\d:?\d\d)\b")


def _times(path: Path) -> list[datetime]:
    """The plausible times in the first and last 64 KiB of a file."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(64 * 1024)
            if handle.seek(0, os.SEEK_END) > 128 * 1024:
                handle.seek(-64 * 1024, os.SEEK_END)
                data += b"\n" + handle.read()
    except OSError:
        return []
    found = []
    for stamp, zone in _TIME.findall(data):
        with contextlib.suppress(ValueError):
            found.append(datetime.fromisoformat((stamp + zone).decode()).astimezone(UTC))
    latest = datetime.now(UTC) + timedelta(days=2)
    return [when for when in found if EARLIEST_COLLECTION <= when <= latest]


def _collection_time(members: list[Member],
                     latest_mtime: float | None) -> tuple[datetime, str] | None:
    """When the bundle was collected, and from what: the collector's own record (must-gather's
    ``timestamp`` files, sonobuoy's ``meta/run.log`` or ``meta/info.json``) before the
    archive's file times, which a repack or a copy changes."""
    recorded: list[tuple[datetime, str]] = []
    for member in members:
        if member.path is None:
            continue
        tail = "/".join(member.name.split("/")[-2:])
        if member.layout == "must-gather" and member.name.rsplit("/", 1)[-1] == "timestamp":
            recorded += [(when, "the must-gather timestamp file") for when in _times(member.path)]
        elif member.layout == "sonobuoy" and tail in ("meta/run.log", "meta/info.json"):
            recorded += [(when, f"sonobuoy's {tail}") for when in _times(member.path)]
    if recorded:
        return max(recorded)
    if latest_mtime is not None:
        return datetime.fromtimestamp(latest_mtime, UTC), "the bundle's file times"
    return None


# The description of unrecognised files is the registry's, shared with the ingest pipeline.
_describe = describe_unknown


__all__ = ["Limits", "Member", "classify", "is_bundle", "unpack"]
