"""Signed .mln files: an ed25519 signature in a trailer after the manifest.

Hashes detect accidents; a signature detects changes made on purpose, by anyone without the
private key. The signature covers the header (which holds the manifest's hash and the
FLAG_SIGNED bit), the manifest's hash and every section's hash, so with the sections verified
against their hashes it covers every byte of the file before the trailer. The trailer itself is
not signed (it holds the signature) and lies after everything signed, so signing excludes it by
construction: no field is zeroed or skipped.

Trailer (144 bytes, little-endian), the last bytes of a file whose header has FLAG_SIGNED:

    0    8   magic             b"\\x89MLNSIG\\n"
    8    2   algorithm (u16)   1 = ed25519
    10   2   reserved (u16)    0
    12   4   reserved (u32)    0
    16   32  key id            SHA-256 of the raw 32-byte public key
    48   64  signature         ed25519 over signed_message()
    112  32  trailer sha256    SHA-256 of bytes 0..112 (damage to the trailer shows without a key)

The `cryptography` package is imported only to sign or to check a signature, so a runtime that
loads files without a trust policy needs nothing beyond the standard library and numpy.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from myelin.errors import SigningKeyError
from myelin.mln._layout import CHUNK_SIZE, FLAG_SIGNED, HEADER_SIZE, Header

SIGNATURE_MAGIC = b"\x89MLNSIG\n"
ED25519 = 1
TRAILER_SIZE = 144
_TRAILER = struct.Struct("<8sHHI32s64s")  # the part the trailer hash covers
_DOMAIN = b"PLeX .mln signature v1\x00"  # a signature over a .mln means nothing elsewhere
assert _TRAILER.size + 32 == TRAILER_SIZE

# What `trust=` and `--key` accept: a PEM file's path, PEM bytes, or a loaded key.
KeySource = str | os.PathLike[str] | bytes | Any


@dataclass(frozen=True)
class SignatureTrailer:
    """The signature record at the end of a signed file."""

    key_id: bytes  # SHA-256 of the raw public key
    signature: bytes
    algorithm: int = ED25519

    def pack(self) -> bytes:
        body = _TRAILER.pack(SIGNATURE_MAGIC, self.algorithm, 0, 0, self.key_id, self.signature)
        return body + hashlib.sha256(body).digest()

    @classmethod
    def unpack(cls, data: bytes | memoryview) -> SignatureTrailer:
        """Parse a trailer; ValueError (a sentence for people) when it is damaged."""
        data = bytes(data)
        if len(data) != TRAILER_SIZE:
            raise ValueError(f"the signature trailer is {len(data)} bytes, not {TRAILER_SIZE}")
        body, digest = data[: _TRAILER.size], data[_TRAILER.size :]
        magic, algorithm, reserved16, reserved32, key, signature = _TRAILER.unpack(body)
        if magic != SIGNATURE_MAGIC:
            raise ValueError("the header says the file is signed but it ends in no signature")
        if hashlib.sha256(body).digest() != digest:
            raise ValueError("the signature trailer is corrupt (sha256 mismatch)")
        if algorithm != ED25519 or reserved16 or reserved32:
            raise ValueError(
                f"the signature uses algorithm {algorithm}; this runtime knows ed25519 (1) "
                "— upgrade the runtime"
            )
        return cls(key, signature, algorithm)


def signed_message(header: bytes, manifest_sha256: bytes, section_sha256: Sequence[str]) -> bytes:
    """The bytes a signature signs: a domain tag, the header, the manifest's hash and every
    section's hash in table order."""
    digests = b"".join(bytes.fromhex(d) for d in section_sha256)
    return _DOMAIN + header + manifest_sha256 + struct.pack("<I", len(section_sha256)) + digests


# --- keys ----------------------------------------------------------------------------------------


def _crypto() -> Any:
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise SigningKeyError(
            "signing and trust policies need the 'cryptography' package: pip install -e '.[sign]'"
        ) from exc
    return serialization, ed25519


def _pem(source: KeySource, what: str) -> tuple[bytes, str]:
    if isinstance(source, bytes):
        return source, f"the {what} given"
    if isinstance(source, str) and source.lstrip().startswith("-----BEGIN"):
        return source.encode(), f"the {what} given"
    path = Path(source)
    try:
        return path.read_bytes(), str(path)
    except OSError as exc:
        raise SigningKeyError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from exc


def load_private_key(source: KeySource) -> Any:
    """An ed25519 private key from a PEM file (PKCS#8, as `openssl genpkey -algorithm ed25519`
    writes it), PEM bytes, or an Ed25519PrivateKey."""
    serialization, ed25519 = _crypto()
    return _load_key(
        source,
        ed25519.Ed25519PrivateKey,
        "private key",
        "an unencrypted PEM private key (PKCS#8)",
        lambda data: serialization.load_pem_private_key(data, password=None),
    )


def load_public_key(source: KeySource) -> Any:
    """An ed25519 public key from a PEM file (SubjectPublicKeyInfo, as `openssl pkey -pubout`
    writes it), PEM bytes, or an Ed25519PublicKey. A private key is refused: trust is given to
    a public key, and a private key does not belong where artifacts are loaded."""
    serialization, ed25519 = _crypto()
    return _load_key(
        source,
        ed25519.Ed25519PublicKey,
        "public key",
        "a PEM public key (SubjectPublicKeyInfo)",
        serialization.load_pem_public_key,
    )


def _load_key(
    source: KeySource, key_type: type, what: str, expected: str, parse: Callable[[bytes], Any]
) -> Any:
    if isinstance(source, key_type):
        return source
    data, where = _pem(source, what)
    if what == "public key" and b"PRIVATE KEY" in data:
        raise SigningKeyError(
            f"{where}: is a private key; trust the public key (plex keygen writes both)"
        )
    try:
        key = parse(data)
    except (ValueError, TypeError) as exc:
        raise SigningKeyError(f"{where}: not {expected}: {exc}") from exc
    if not isinstance(key, key_type):
        raise SigningKeyError(
            f"{where}: a {type(key).__name__}; .mln files are signed with ed25519"
        )
    return key


def key_id(public_key: Any) -> bytes:
    """SHA-256 of the raw public key: names the key a file was signed with."""
    serialization, _ = _crypto()
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).digest()


def generate_key_pair() -> tuple[bytes, bytes]:
    """A new ed25519 key pair as PEM: (private PKCS#8, public SubjectPublicKeyInfo)."""
    serialization, ed25519 = _crypto()
    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private, public


def verify_signature(public_key: Any, trailer: SignatureTrailer, message: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature

    try:
        public_key.verify(trailer.signature, message)
    except InvalidSignature:
        return False
    return True


# --- signing a file ------------------------------------------------------------------------------


def sign_file(
    path: str | os.PathLike[str], key: KeySource, output: str | os.PathLike[str] | None = None
) -> Path:
    """Sign a .mln: write it to `output` (default: in place) with FLAG_SIGNED set and a trailer.

    The file is fully verified first (a damaged file is never signed), a signature already
    there is replaced, and the result goes through a temporary sibling and an atomic rename, so
    a process that has the old file mapped keeps reading the old bytes.
    """
    from myelin.mln._reader import MlnReader

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
    from myelin.mln._writer import atomic_file

    with atomic_file(target) as out:
        out.write(header)
        view = memoryview(mapping)
        try:
            for start in range(HEADER_SIZE, end, CHUNK_SIZE):
                out.write(view[start : min(start + CHUNK_SIZE, end)])
        finally:
            view.release()
        out.write(trailer)
