"""MlnReader: map a .mln file read-only, check everything, hand out zero-copy section views and
the typed manifest; with a trust key, refuse any file that key did not sign.

What is hashed must be what runs. A file mapped shared changes under the mapping when anyone
writes to it (MAP_PRIVATE does not help: pages not yet copied on write still show the file's
current bytes), so the bytes that become code (module and plugin sections) are copied into a
sealed memfd and hashed there, and `private_copy=True` does the same for the whole file.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import mmap
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from myelin.errors import ArtifactError, SignatureError
from myelin.mln._layout import (
    CHUNK_SIZE,
    FLAG_SIGNED,
    FORMAT_MAJOR,
    HEADER_SIZE,
    KNOWN_FLAGS,
    MAGIC,
    MAX_MANIFEST_SIZE,
    Header,
    LayoutError,
    SectionEntry,
    check_layout,
)
from myelin.mln._manifest import ManifestInvalid, decode_manifest
from myelin.mln._records import ArtifactManifest, validate_manifest
from myelin.mln._signing import TRAILER_SIZE, KeySource, SignatureTrailer, signed_message

_DAMAGED = "the file was damaged after it was built — rebuild or re-copy it"
_PARALLEL_VERIFY_BYTES = 64 * 1024 * 1024  # below this, threads cost more than they save


def sha256_of(view: memoryview) -> bytes:
    """Hash a view in large chunks: no copies, and hashlib drops the GIL for each chunk."""
    digest = hashlib.sha256()
    for start in range(0, len(view), CHUNK_SIZE):
        digest.update(view[start : start + CHUNK_SIZE])
    return digest.digest()


# A sealed memfd's content can no longer change, by anyone who opens /proc/PID/fd/N included.
_SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
_MEMFD_NAME_MAX = 249  # memfd_create's limit, less its "memfd:" prefix


def sealed_memfd(name: str, data: memoryview) -> int:
    """A close-on-exec memfd holding a copy of `data`, sealed against any later write."""
    fd = os.memfd_create(name[:_MEMFD_NAME_MAX], os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = data
        while view:
            written = os.write(fd, view)
            view = view[written:]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _sealed_file_copy(name: str, source: int, length: int) -> int:
    """A sealed memfd holding the first `length` bytes of the open file `source`, copied in the
    kernel (sendfile); EOFError if the file is shorter than that by now."""
    fd = os.memfd_create(name[:_MEMFD_NAME_MAX], os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        copied = 0
        while copied < length:
            sent = os.sendfile(fd, source, copied, length - copied)
            if sent == 0:
                raise EOFError(f"the file shrank to {copied} bytes while it was copied")
            copied += sent
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
    except BaseException:
        os.close(fd)
        raise
    return fd


def map_sealed(fd: int) -> mmap.mmap:
    """A read-only shared mapping of a sealed memfd (its pages are the memfd's own)."""
    return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)


def _all_zero(view: memoryview) -> bool:
    zeros = bytes(min(len(view), CHUNK_SIZE))
    return all(
        view[start : start + CHUNK_SIZE] == zeros[: min(CHUNK_SIZE, len(view) - start)]
        for start in range(0, len(view), CHUNK_SIZE)
    )


class MlnReader:
    """An open .mln file: its manifest, its section table, and zero-copy views of its sections.

    Opening checks the header, the manifest's hash and schema, and that every section lies inside
    the file without overlapping another; with `verify` (the default) it also hashes every section.
    With `trust` (a public key: PEM path, PEM bytes or a loaded key) it also hashes every section
    whatever `verify` says, and requires a signature by that key over the header, the manifest
    and every section hash. Any problem is an ArtifactError (SignatureError for the signature)
    whose message names the file.

    `private_copy=True` copies the whole file into a sealed memfd first and reads only that
    copy: what was hashed (and, under `trust`, what the signature covers) is what every later
    view returns, whatever happens to the file afterwards (an in-place write, a truncation).
    It costs a copy of the file in memory and the time to make it (docs/security.md). Without
    it the file is mapped shared, zero-copy, and `code_section` still hands out hashed private
    copies of the sections that become code.

    `artifact_manifest` is the manifest as typed records (what the runtime reads); `manifest` is
    the same manifest as the JSON dict stored in the file, for tools that print or copy it.
    """

    path: Path
    manifest: dict[str, Any]
    artifact_manifest: ArtifactManifest
    sections: dict[str, SectionEntry]
    signature: SignatureTrailer | None  # the trailer of a signed file (not yet checked)
    mmap: mmap.mmap
    file_size: int
    format_version: tuple[int, int]

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        verify: bool = True,
        trust: KeySource | None = None,
        private_copy: bool = False,
    ) -> None:
        self.path = Path(path)
        self.private_copy = private_copy
        self._view: memoryview | None = None
        self._gaps: list[tuple[int, int]] = []
        self.signature = None
        if trust is not None:
            from myelin.mln._signing import load_public_key

            trust = load_public_key(trust)  # a bad key fails before gigabytes are hashed
        # sections hashed against the manifest in this reader's memory (see code_section)
        self._verified = False
        try:
            self._open()
            if verify or trust is not None:
                self.verify_all()
                self._verified = True
            if trust is not None:
                self.verify_signature(trust)
        except BaseException:
            self.close()
            raise

    # --- opening ---------------------------------------------------------------------------------

    def _error(self, message: str) -> ArtifactError:
        return ArtifactError(f"{self.path}: {message}")

    def _open(self) -> None:
        try:
            with open(self.path, "rb") as file:
                info = os.fstat(file.fileno())
                if not stat.S_ISREG(info.st_mode):
                    raise self._error("not a regular file")
                if info.st_size < HEADER_SIZE:
                    head = file.read(HEADER_SIZE)
                    # a start of a real header (the magic, or as much of it as there is) is a
                    # truncated .mln; anything else is another file
                    if head[: len(MAGIC)] != MAGIC[: len(head)]:
                        raise self._error("not a .mln file (wrong magic bytes)")
                    raise self._error(
                        f"truncated: the file is {len(head)} bytes, shorter than the "
                        f"{HEADER_SIZE}-byte header"
                    )
                if self.private_copy:
                    try:
                        copy = _sealed_file_copy(
                            f"mln:{self.path.name}", file.fileno(), info.st_size
                        )
                    except EOFError as exc:
                        raise self._error(f"{exc}; load it again once it is written") from exc
                    except OSError as exc:
                        raise self._error(
                            f"cannot make the private copy of its {info.st_size} bytes in memory "
                            f"({exc.strerror or exc}); free memory, or load it with "
                            "private_copy=False to map the file instead (docs/security.md)"
                        ) from exc
                    # The copy's own descriptor closes too: its mapping keeps the memfd.
                    try:
                        self.mmap = map_sealed(copy)
                    finally:
                        os.close(copy)
                else:
                    # The map holds its own reference to the file; the descriptor can close now.
                    self.mmap = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as exc:
            raise self._error(f"cannot open: {exc.strerror or exc}") from exc
        self._view = memoryview(self.mmap)
        self.file_size = len(self.mmap)

        header = Header.unpack(self._view[:HEADER_SIZE])
        if header.magic != MAGIC:
            raise self._error("not a .mln file (wrong magic bytes)")
        self.format_version = (header.major, header.minor)
        if header.major != FORMAT_MAJOR:
            raise self._error(
                f"format version {header.major}.{header.minor}; this runtime reads "
                f"{FORMAT_MAJOR}.x — rebuild with this PLeX or upgrade the runtime"
            )
        if header.flags & ~KNOWN_FLAGS:
            raise self._error(
                f"unknown header flags 0x{header.flags:08x}; this runtime knows "
                f"0x{KNOWN_FLAGS:08x} — rebuild with this PLeX or upgrade the runtime"
            )
        self._header_bytes = bytes(self._view[:HEADER_SIZE])
        signed = bool(header.flags & FLAG_SIGNED)
        # A signed file's manifest ends where its trailer begins.
        content_end = self.file_size - TRAILER_SIZE if signed else self.file_size
        start, length = header.manifest_offset, header.manifest_length
        if length > MAX_MANIFEST_SIZE:
            raise self._error(
                f"manifest of {length} bytes is larger than the {MAX_MANIFEST_SIZE}-byte limit"
            )
        if start < HEADER_SIZE or start + length > content_end:
            after = f" and a {TRAILER_SIZE}-byte signature" if signed else ""
            raise self._error(
                f"truncated: the header places the manifest at bytes {start}..{start + length}"
                f"{after} but the file is {self.file_size} bytes"
            )
        manifest_bytes = self._view[start : start + length]
        if sha256_of(manifest_bytes) != header.manifest_sha256:
            raise self._error(f"manifest is corrupt (sha256 mismatch); {_DAMAGED}")
        try:
            manifest = decode_manifest(bytes(manifest_bytes))
        except UnicodeDecodeError as exc:
            raise self._error(f"manifest is not valid UTF-8 (at byte {exc.start})") from exc
        except (ValueError, RecursionError) as exc:
            raise self._error(f"manifest is not valid JSON: {exc}") from exc
        try:
            records = validate_manifest(manifest, format_version=self.format_version)
            self.sections = records.section_table()
            self._gaps = check_layout(
                list(self.sections.values()), start, length, content_end, signed=signed
            )
        except (ManifestInvalid, LayoutError) as exc:
            raise self._error(str(exc)) from exc
        if signed:
            try:
                self.signature = SignatureTrailer.unpack(self._view[content_end:])
            except ValueError as exc:
                raise self._error(f"{exc}; {_DAMAGED}") from exc
        self.manifest = manifest
        self.artifact_manifest = records
        self._manifest_sha256 = header.manifest_sha256

    # --- access ----------------------------------------------------------------------------------

    def _live_view(self) -> memoryview:
        if self._view is None:
            raise self._error("the reader is closed")
        return self._view

    def _section(self, name: str) -> SectionEntry:
        section = self.sections.get(name)
        if section is None:
            known = ", ".join(sorted(self.sections)) or "none"
            raise self._error(f"no section named {name!r} (sections: {known})")
        return section

    def section_view(self, name: str) -> memoryview:
        """A read-only, zero-copy view of a section's bytes, valid while the file is mapped."""
        section = self._section(name)
        return self._live_view()[section.offset : section.end]

    def code_section(self, name: str) -> memoryview:
        """A read-only view of a section whose bytes become code (a VM module, a plugin),
        hashed against the manifest in memory nobody else can write: the private copy of the
        file, or else a sealed memfd copy of just this section. Hashed whatever `verify` said,
        and under `trust` covered by the signature: what IREE wraps is what was checked.
        ArtifactError on a hash mismatch."""
        if self.private_copy:
            if not self._verified:
                self.verify_section(name)
            return self.section_view(name)
        section = self._section(name)
        if section.length == 0:
            view = memoryview(b"")
        else:
            fd = sealed_memfd(f"mln:{name}", self.section_view(name))
            try:
                view = memoryview(map_sealed(fd))
            finally:
                os.close(fd)
        if sha256_of(view).hex() != section.sha256:
            raise self._error(f"section {name!r} is corrupt (sha256 mismatch); {_DAMAGED}")
        return view

    def verify_section(self, name: str) -> None:
        """Hash one section and compare with the manifest; ArtifactError on mismatch."""
        section = self._section(name)
        view = self._live_view()[section.offset : section.end]
        if sha256_of(view).hex() != section.sha256:
            raise self._error(f"section {name!r} is corrupt (sha256 mismatch); {_DAMAGED}")

    def verify_all(self) -> None:
        """Hash every section (in parallel when there is much to hash) and check the padding."""
        view = self._live_view()
        for start, end in self._gaps:
            if not _all_zero(view[start:end]):
                raise self._error(f"padding at bytes {start}..{end} is not zero; {_DAMAGED}")
        names = list(self.sections)
        total = sum(s.length for s in self.sections.values())
        workers = min(len(names), os.cpu_count() or 1, 8)
        if workers < 2 or total < _PARALLEL_VERIFY_BYTES:
            for name in names:
                self.verify_section(name)
            return
        # Largest first so one big section does not start last; errors surface in manifest order.
        by_size = sorted(names, key=lambda n: -self.sections[n].length)
        with ThreadPoolExecutor(max_workers=workers) as pool:
            outcomes = dict(zip(by_size, pool.map(self._section_problem, by_size), strict=True))
        for name in names:
            if outcomes[name] is not None:
                raise outcomes[name]

    def signed_message(self) -> bytes:
        """What the signature of this file signs (see myelin.mln._signing)."""
        digests = [s.sha256 for s in self.artifact_manifest.sections or ()]
        return signed_message(self._header_bytes, self._manifest_sha256, digests)

    def verify_signature(self, trust: KeySource) -> None:
        """Require a valid signature by `trust` (a public key). Call it on a verified reader:
        the signature covers section hashes, which mean something once the bytes match them.
        Raises SignatureError."""
        from myelin.mln._signing import key_id, load_public_key, verify_signature

        public = load_public_key(trust)
        expected = key_id(public)
        if self.signature is None:
            raise SignatureError(
                f"{self.path}: not signed, and the trust policy accepts only files signed by key "
                f"{expected.hex()[:16]}; sign it with `plex sign`"
            )
        if self.signature.key_id != expected:
            raise SignatureError(
                f"{self.path}: signed by key {self.signature.key_id.hex()[:16]}, not by the "
                f"trusted key {expected.hex()[:16]}"
            )
        if not verify_signature(public, self.signature, self.signed_message()):
            raise SignatureError(
                f"{self.path}: the signature does not verify: the file was changed after it "
                "was signed"
            )

    def _section_problem(self, name: str) -> ArtifactError | None:
        try:
            self.verify_section(name)
        except ArtifactError as exc:
            return exc
        return None

    # --- lifetime --------------------------------------------------------------------------------

    def close(self) -> None:
        """Unmap the file. Views still held elsewhere keep the mapping alive until they go."""
        view, self._view = self._view, None
        if view is not None:
            view.release()
        mapping = getattr(self, "mmap", None)
        if mapping is not None:
            # While section views are still exported the map stays; it goes with the last one.
            with contextlib.suppress(BufferError):
                mapping.close()

    def __enter__(self) -> MlnReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._view is None else f"{len(self.sections)} sections"
        return f"MlnReader({str(self.path)!r}, {state})"
