"""MlnWriter: stream sections into a .mln file atomically, hashing as it writes."""

from __future__ import annotations

import contextlib
import copy
import glob
import hashlib
import os
import secrets
import socket
import stat
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Union

if TYPE_CHECKING:
    import numpy as np

from myelin.errors import ArtifactError
from myelin.mln._layout import (
    CHUNK_SIZE,
    FLAG_SIGNED,
    FORMAT_MAJOR,
    FORMAT_MINOR,
    HEADER_SIZE,
    MAX_MANIFEST_SIZE,
    MIN_ALIGNMENT,
    PARAMETER_PAGE,
    SECTION_ALIGNMENT,
    Header,
    LayoutError,
    SectionEntry,
    align_up,
    check_layout,
)
from myelin.mln._manifest import ManifestInvalid, decode_manifest, encode_manifest
from myelin.mln._reader import MlnReader
from myelin.mln._records import ArtifactManifest, section_json, validate_manifest
from myelin.mln._signing import (
    KeySource,
    SignatureTrailer,
    key_id,
    load_private_key,
    signed_message,
)

SectionData = Union[bytes, bytearray, memoryview, "np.ndarray", os.PathLike[str]]
_WRITER_FILLS = ("format", "sections")
_PLACEHOLDER_SHA256 = "0" * 64  # hex digests are fixed-length, so the manifest size is known early


@dataclass(frozen=True)
class _PendingSection:
    name: str
    kind: str
    source: memoryview | Path  # bytes in memory, or a file streamed at write time
    length: int


class MlnWriter:
    """Collects a manifest and sections, then writes them as one .mln file.

    `manifest` (a dict, or an ArtifactManifest) holds everything except "format" and
    "sections", which the writer fills. Sections are laid out in the order they are added.
    In-memory data is referenced, not copied: do not change it before write(). A Path is
    streamed at write time, never read whole into memory.
    """

    def __init__(self, manifest: Mapping[str, Any] | ArtifactManifest) -> None:
        if isinstance(manifest, ArtifactManifest):
            manifest = manifest.to_json()
        given = [key for key in _WRITER_FILLS if key in manifest]
        if given:
            raise ValueError(f"the manifest must not contain {given}: the writer fills them")
        self._manifest = copy.deepcopy(dict(manifest))
        self._sections: list[_PendingSection] = []

    def add_section(self, name: str, kind: str, data: SectionData) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a section name must be a non-empty string, got {name!r}")
        if kind not in SECTION_ALIGNMENT:
            raise ValueError(
                f"unknown section kind {kind!r} (expected one of {', '.join(SECTION_ALIGNMENT)})"
            )
        if any(s.name == name for s in self._sections):
            raise ValueError(f"section {name!r} was already added")
        source, length = _section_source(data)
        self._sections.append(_PendingSection(name, kind, source, length))

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write the file via a temporary sibling and an atomic rename; return its path.

        On any failure the temporary file is removed and `path` is left as it was.
        """
        path = Path(path)
        offsets, manifest_offset = self._plan()
        # Validate before writing any bytes: a bad manifest fails fast, even with GBs of weights.
        self._encode_checked(path, offsets, [_PLACEHOLDER_SHA256] * len(offsets), manifest_offset)

        with atomic_file(path) as out:
            out.write(bytes(HEADER_SIZE))  # the header goes in last
            position, digests = HEADER_SIZE, []
            for section, offset in zip(self._sections, offsets, strict=True):
                out.write(bytes(offset - position))
                digests.append(_copy_hashing(section, out, path))
                position = offset + section.length
            manifest_bytes = self._encode_checked(path, offsets, digests, manifest_offset)
            out.write(bytes(manifest_offset - position))
            out.write(manifest_bytes)
            header = Header(
                FORMAT_MAJOR,
                FORMAT_MINOR,
                0,
                manifest_offset,
                len(manifest_bytes),
                hashlib.sha256(manifest_bytes).digest(),
            )
            out.seek(0)
            out.write(header.pack())
        return path

    def _plan(self) -> tuple[list[int], int]:
        """Each section's offset, and the manifest's."""
        offsets, position = [], HEADER_SIZE
        for section in self._sections:
            offset = align_up(position, SECTION_ALIGNMENT[section.kind])
            offsets.append(offset)
            position = offset + section.length
        # In a file with parameters the manifest starts on a page (PARAMETER_PAGE).
        has_parameters = any(s.kind == "parameter" for s in self._sections)
        return offsets, align_up(position, PARAMETER_PAGE if has_parameters else MIN_ALIGNMENT)

    def _encode_checked(
        self, path: Path, offsets: list[int], digests: list[str], manifest_offset: int
    ) -> bytes:
        """Encode the final manifest and check it exactly as the reader will."""
        sections = [
            SectionEntry(s.name, s.kind, offset, s.length, SECTION_ALIGNMENT[s.kind], digest)
            for s, offset, digest in zip(self._sections, offsets, digests, strict=True)
        ]
        manifest = {
            **self._manifest,
            "format": {"major": FORMAT_MAJOR, "minor": FORMAT_MINOR},
            "sections": [section_json(s) for s in sections],
        }
        try:
            data = encode_manifest(manifest)
        except (TypeError, ValueError) as exc:
            raise ArtifactError(f"{path}: cannot write: manifest is not JSON: {exc}") from exc
        if len(data) > MAX_MANIFEST_SIZE:
            raise ArtifactError(
                f"{path}: cannot write: manifest of {len(data)} bytes is larger than the "
                f"{MAX_MANIFEST_SIZE}-byte limit"
            )
        try:
            # Check what the reader will see (tuples became lists, and so on), not our dict.
            validate_manifest(decode_manifest(data), format_version=(FORMAT_MAJOR, FORMAT_MINOR))
            check_layout(sections, manifest_offset, len(data), manifest_offset + len(data))
        except (ManifestInvalid, LayoutError) as exc:
            raise ArtifactError(f"{path}: cannot write: {exc}") from exc
        return data


def _section_source(data: SectionData) -> tuple[memoryview | Path, int]:
    if isinstance(data, str):
        raise TypeError("section data is a str: pass a pathlib.Path for a file, bytes for data")
    if isinstance(data, os.PathLike):
        path = Path(data)
        try:
            info = path.stat()
        except OSError as exc:
            raise ArtifactError(f"{path}: cannot read section data: {exc.strerror}") from exc
        if not stat.S_ISREG(info.st_mode):
            raise ArtifactError(f"{path}: cannot read section data: not a regular file")
        return path, info.st_size
    numpy = sys.modules.get("numpy")  # an ndarray exists only if numpy is loaded
    if numpy is not None and isinstance(data, numpy.ndarray):
        np = numpy
        if data.dtype.hasobject:
            raise TypeError("an object array has no raw bytes to store")
        # ascontiguousarray copies only when the array is not C-contiguous already.
        data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    try:
        view = memoryview(data)
    except TypeError:
        raise TypeError(
            f"section data must be bytes-like, a numpy array or a Path, not {type(data).__name__}"
        ) from None
    if not view.c_contiguous:
        view = memoryview(view.tobytes())
    view = view.cast("B")
    return view, len(view)


def _copy_hashing(section: _PendingSection, out: BinaryIO, target: Path) -> str:
    """Write a section's bytes to `out` in chunks, hashing them on the way; return the digest."""
    digest = hashlib.sha256()
    if isinstance(section.source, memoryview):
        for start in range(0, section.length, CHUNK_SIZE):
            chunk = section.source[start : start + CHUNK_SIZE]
            digest.update(chunk)
            out.write(chunk)
        return digest.hexdigest()
    buffer = memoryview(bytearray(CHUNK_SIZE))
    remaining = section.length
    with open(section.source, "rb") as file:
        while remaining:
            count = file.readinto(buffer[: min(CHUNK_SIZE, remaining)])
            if not count:
                break
            digest.update(buffer[:count])
            out.write(buffer[:count])
            remaining -= count
        if remaining or file.read(1):
            raise ArtifactError(
                f"{target}: cannot write: {section.source} changed size while being written "
                f"(section {section.name!r}, expected {section.length} bytes)"
            )
    return digest.hexdigest()


@contextlib.contextmanager
def atomic_file(target: Path) -> Iterator[BinaryIO]:
    """A new file that replaces `target` only once it is complete and on disk.

    Written through a temporary sibling and an atomic rename, so a reader that has the old file
    mapped keeps its bytes, and a failure (or a kill) never leaves a half-written `target`: the
    temporary is removed on error, and one a dead writer left is removed by the next write.
    """
    remove_stale_temporaries(target)
    temp = target.with_name(f"{target.name}{temp_suffix()}")
    created = False
    try:
        with open(temp, "xb") as out:
            created = True
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, target)
    except BaseException as exc:
        if created:
            with contextlib.suppress(OSError):
                temp.unlink()
        if isinstance(exc, OSError):
            raise ArtifactError(f"{target}: cannot write: {exc}") from exc
        raise
    _fsync_directory(target.parent)


def _fsync_directory(directory: Path) -> None:
    """Make the rename durable (POSIX); where a folder cannot be opened, skip it."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# Temporary siblings are `<output>.tmp-<host>-<pid>-<random>`: a writer killed outright (SIGKILL,
# power loss) leaves one, and the next write of the same output removes it once its writer is
# known to be dead (same host, no such process). Another host's file, or a live writer's, is
# never touched; names without a pid (written before this rule) are removed after a day.
_TEMP_MARK = ".tmp-"
_OLD_TEMP_AGE_S = 24 * 3600


def _host() -> str:
    return socket.gethostname().replace("-", "_") or "host"


def temp_suffix() -> str:
    return f"{_TEMP_MARK}{_host()}-{os.getpid()}-{secrets.token_hex(4)}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by someone else
    return True


def remove_stale_temporaries(path: Path) -> list[Path]:
    """Remove the temporary siblings of `path` that dead writers left; return them."""
    removed = []
    try:
        candidates = list(path.parent.glob(f"{glob.escape(path.name)}{_TEMP_MARK}*"))
    except OSError:
        return removed
    for temp in candidates:
        fields = temp.name[len(path.name) + len(_TEMP_MARK) :].split("-")
        if len(fields) == 3 and fields[1].isdigit():
            stale = fields[0] == _host() and not _pid_alive(int(fields[1]))
        else:
            try:
                stale = time.time() - temp.lstat().st_mtime > _OLD_TEMP_AGE_S
            except OSError:
                continue
        if stale and temp.is_file() and not temp.is_symlink():
            with contextlib.suppress(OSError):
                temp.unlink()
                removed.append(temp)
    return removed


# --- signing a file (sign_file) ------------------------------------------------------------


def sign_file(
    path: str | os.PathLike[str], key: KeySource, output: str | os.PathLike[str] | None = None
) -> Path:
    """Sign a .mln: write it to `output` (default: in place) with FLAG_SIGNED set and a trailer.

    The file is fully verified first (a damaged file is never signed), a signature already
    there is replaced, and the result goes through a temporary sibling and an atomic rename, so
    a process that has the old file mapped keeps reading the old bytes.
    """
    private = load_private_key(key)
    source = Path(path)
    target = Path(output) if output is not None else source
    with MlnReader(source) as reader:
        header = Header.unpack(reader.mmap[:HEADER_SIZE])
        signed_header = Header(
            header.major,
            header.minor,
            header.flags | FLAG_SIGNED,
            header.manifest_offset,
            header.manifest_length,
            header.manifest_sha256,
        ).pack()
        digests = [s.sha256 for s in reader.artifact_manifest.sections or ()]
        message = signed_message(signed_header, header.manifest_sha256, digests)
        trailer = SignatureTrailer(key_id(private.public_key()), private.sign(message))
        end = header.manifest_offset + header.manifest_length
        _write_atomically(target, signed_header, reader.mmap, end, trailer.pack())
    return target


def _write_atomically(target: Path, header: bytes, mapping: Any, end: int, trailer: bytes) -> None:
    with atomic_file(target) as out:
        out.write(header)
        view = memoryview(mapping)
        try:
            for start in range(HEADER_SIZE, end, CHUNK_SIZE):
                out.write(view[start : min(start + CHUNK_SIZE, end)])
        finally:
            view.release()
        out.write(trailer)
