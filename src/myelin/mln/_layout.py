"""Byte layout of a .mln file: the header, section alignment, and the checks on where things lie.

    [header, 64 bytes][section][pad][section]...[pad][manifest (JSON)][signature trailer]

Every section starts on its kind's alignment (parameters on a 4096-byte page so the runtime can
wrap them zero-copy from an mmap, and the manifest after them on a page too); padding is zero
bytes; the manifest comes last so the writer knows every
section's offset when it writes it, and the header is written last of all. A signed file (header
flag FLAG_SIGNED) ends with a fixed-size signature trailer after the manifest, outside everything
the signature covers (myelin.mln._signing).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from types import MappingProxyType

MAGIC = b"\x89MLN\r\n\x1a\n"  # PNG-style: a high byte and line endings that text mangling breaks
FORMAT_MAJOR = 1
FORMAT_MINOR = 1  # 1.1 added FLAG_SIGNED and the signature trailer
HEADER_SIZE = 64
MAX_MANIFEST_SIZE = 64 * 1024 * 1024
# "backend": an external backend's executable plugin or a vendor library it links
# (myelin.backends); a runtime that predates them refuses the artifact on the unknown kind.
SECTION_ALIGNMENT = MappingProxyType({"module": 64, "parameter": 4096, "blob": 64, "backend": 4096})
MIN_ALIGNMENT = 64  # also the alignment of section kinds from a newer minor
# The page parameters are mapped, wrapped and imported in: parameter sections start on it, and
# in a file with parameters the manifest does too (else on MIN_ALIGNMENT), so the pages that
# hold the parameters lie wholly inside the file. Why: a device imports host memory only in
# whole pages (Vulkan's minImportedHostPointerAlignment, 4096 on lavapipe and the common GPUs);
# memory it cannot import, IREE's Vulkan driver reads through host-side staging instead.
PARAMETER_PAGE = SECTION_ALIGNMENT["parameter"]
CHUNK_SIZE = 4 * 1024 * 1024  # unit of streaming and hashing
FLAG_SIGNED = 0x1  # a signature trailer follows the manifest (format 1.1)
KNOWN_FLAGS = FLAG_SIGNED

# magic, major, minor, flags, manifest_offset, manifest_length, manifest_sha256
_HEADER = struct.Struct("<8sHHIQQ32s")
assert _HEADER.size == HEADER_SIZE


class LayoutError(ValueError):
    """A layout rule is broken; the reader and writer raise it as ArtifactError with the path."""


@dataclass(frozen=True)
class Header:
    major: int
    minor: int
    flags: int
    manifest_offset: int
    manifest_length: int
    manifest_sha256: bytes
    magic: bytes = MAGIC

    def pack(self) -> bytes:
        return _HEADER.pack(
            self.magic,
            self.major,
            self.minor,
            self.flags,
            self.manifest_offset,
            self.manifest_length,
            self.manifest_sha256,
        )

    @classmethod
    def unpack(cls, data: bytes | memoryview) -> Header:
        magic, major, minor, flags, offset, length, digest = _HEADER.unpack(data)
        return cls(major, minor, flags, offset, length, digest, magic)


@dataclass(frozen=True)
class SectionEntry:
    """One row of the manifest's section table: where a section's bytes lie and their hash."""

    name: str
    kind: str
    offset: int
    length: int
    alignment: int
    sha256: str

    @property
    def end(self) -> int:
        return self.offset + self.length


def align_up(position: int, alignment: int) -> int:
    return -(-position // alignment) * alignment


def module_section_name(variant: str, module: str) -> str:
    """Name of the section that holds a variant's module (VM bytecode)."""
    return f"variant/{variant}/module/{module}"


def parameter_section_name(scope: str, key: str) -> str:
    """Name of the section that holds one parameter's bytes."""
    return f"param/{scope}/{key}"


def check_layout(
    sections: list[SectionEntry],
    manifest_offset: int,
    manifest_length: int,
    content_end: int,
    *,
    signed: bool = False,
) -> list[tuple[int, int]]:
    """Check that sections lie between the header and the manifest without overlapping.

    `content_end` is where the manifest must end: the file's size, or where a signed file's
    trailer begins. The manifest range itself was checked against the header already. Returns
    the gaps (padding ranges) between header, sections and manifest, which must hold zero bytes.
    """
    if manifest_offset + manifest_length != content_end:
        extra = content_end - manifest_offset - manifest_length
        last = "only its signature may follow" if signed else "it must come last"
        raise LayoutError(f"{extra} unexpected bytes after the manifest ({last})")
    gaps = []
    position, previous = HEADER_SIZE, "the header"
    for section in sorted(sections, key=lambda s: (s.offset, s.length)):
        what = f"section {section.name!r} (bytes {section.offset}..{section.end})"
        if section.end > manifest_offset:
            raise LayoutError(f"{what} overlaps the manifest (from byte {manifest_offset})")
        if section.length == 0:
            if section.offset < HEADER_SIZE:
                raise LayoutError(f"{what} lies inside the header")
            continue  # an empty section occupies no bytes
        if section.offset < position:
            raise LayoutError(f"{what} overlaps {previous} (which ends at byte {position})")
        if section.offset > position:
            gaps.append((position, section.offset))
        position, previous = section.end, f"section {section.name!r}"
    if manifest_offset > position:
        gaps.append((position, manifest_offset))
    return gaps
