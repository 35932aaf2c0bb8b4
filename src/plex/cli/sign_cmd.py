"""`plex sign`, `plex verify`, `plex keygen`: ed25519 signatures on .mln files.

A signature says who built the file; the trust policy (`plex run --trust`,
`myelin.Instance(trust=...)`) refuses anything that key did not sign. Keys are PEM files as
`openssl genpkey -algorithm ed25519` writes them (PKCS#8 private, SubjectPublicKeyInfo public).
The format is in docs/mln-format.md, what it promises in docs/security.md.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from plex.cli.options import artifact_argument


def sign(
    artifact: Path = artifact_argument("The .mln file to sign."),
    key: Path = typer.Option(
        ..., "--key", "-k", help="The private key (PEM, PKCS#8).", metavar="KEY"
    ),
    output: Path = typer.Option(
        None,
        "--output",
        "-o",
        help="Write the signed copy here (default: sign the file in place).",
        metavar="FILE",
    ),
) -> None:
    """Sign a .mln (after checking every hash), replacing any signature it has."""
    from myelin.mln import key_id, load_private_key, sign_file

    private = load_private_key(key)
    written = sign_file(artifact, private, output)
    ident = key_id(private.public_key()).hex()[:16]
    typer.echo(f"signed {written} with key {ident}")


def verify(
    artifact: Path = artifact_argument(),
    key: Path = typer.Option(
        ..., "--key", "-k", help="The public key to trust (PEM).", metavar="PUB"
    ),
) -> None:
    """Check every hash and the signature by KEY; exit 0 only when the signature verifies."""
    from myelin.mln import MlnReader

    with MlnReader(artifact, trust=key) as reader:
        signature = reader.signature  # never None here: trust= refuses an unsigned file
        ident = signature.key_id.hex()[:16] if signature is not None else "?"
    typer.echo(f"{artifact}: signature by key {ident} verifies; every section hash matches")


def keygen(
    key: Path = typer.Argument(
        ..., help="Where to write the private key (PEM, PKCS#8).", metavar="KEY"
    ),
    public: Path = typer.Option(
        None,
        "--public",
        "-p",
        help="Where to write the public key (default: KEY's name with .pub.pem).",
        metavar="PUB",
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite existing key files."),
) -> None:
    """Make an ed25519 key pair: KEY (private, readable by you only) and its public key."""
    from myelin.mln import generate_key_pair
    from plex.errors import PlexError

    public = public if public is not None else key.with_name(f"{key.stem}.pub.pem")
    if public == key:
        raise PlexError(f"--public {public}: the same file as the private key")
    if not force:
        for path in (key, public):
            if path.exists():
                raise PlexError(f"{path}: exists; pass --force to overwrite it")
    private_pem, public_pem = generate_key_pair()
    try:
        _write(key, private_pem, mode=0o600)
        _write(public, public_pem, mode=0o644)
    except OSError as e:
        raise PlexError(f"cannot write the key: {e}") from None
    typer.echo(f"wrote private key {key} and public key {public}")


def _write(path: Path, data: bytes, *, mode: int) -> None:
    """Create the file with its final mode (a private key is never readable by others, not
    even for a moment)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as file:
        file.write(data)
