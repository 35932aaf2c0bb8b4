"""Signed .mln files: `plex keygen / sign / verify`, `plex run --trust` and
`myelin.Instance(trust=...)`. A trust policy refuses an unsigned, wrongly signed or tampered file
before any module is wrapped or any parameter registered; hashes alone catch only accidents."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import myelin
from myelin.errors import ArtifactError, SignatureError, SigningKeyError
from myelin.mln import (
    FLAG_SIGNED,
    HEADER_SIZE,
    TRAILER_SIZE,
    MlnReader,
    generate_key_pair,
    load_public_key,
    sign_file,
)
from myelin.runtime.model import Model
from plex.cli import app
from tests.myelin.test_mln_format import build, replace_manifest

HEADER = struct.Struct("<8sHHIQQ32s")


def plex(*args: str | Path):
    result = CliRunner().invoke(app, [str(a) for a in args])
    text = result.output + (getattr(result, "stderr", "") or "")
    return result.exit_code, text


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("keys")
    code, text = plex("keygen", folder / "signing.pem")
    assert code == 0, text
    return folder / "signing.pem", folder / "signing.pub.pem"


@pytest.fixture(scope="module")
def other_keys(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("other")
    private, public = generate_key_pair()
    (folder / "k.pem").write_bytes(private)
    (folder / "k.pub.pem").write_bytes(public)
    return folder / "k.pem", folder / "k.pub.pem"


@pytest.fixture
def signed(mlp_mln, keys, tmp_path) -> Path:
    out = tmp_path / "signed.mln"
    code, text = plex("sign", mlp_mln, "--key", keys[0], "-o", out)
    assert code == 0, text
    return out


# --- keys -----------------------------------------------------------------------------------------


def test_keygen_writes_pkcs8_and_spki_pem(keys):
    private, public = keys
    assert private.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")  # PKCS#8
    assert public.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")  # SubjectPublicKeyInfo
    assert private.stat().st_mode & 0o077 == 0
    code, text = plex("keygen", private)
    assert code == 1 and "exists; pass --force" in text


def test_keys_written_by_openssl_sign_and_verify(mlp_mln, tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("no openssl here")
    key, pub = tmp_path / "o.pem", tmp_path / "o.pub.pem"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", key], check=True)
    subprocess.run(["openssl", "pkey", "-in", key, "-pubout", "-out", pub], check=True)
    out = tmp_path / "o.mln"
    assert plex("sign", mlp_mln, "--key", key, "-o", out)[0] == 0
    code, text = plex("verify", out, "--key", pub)
    assert code == 0 and "verifies" in text


def test_wrong_kind_of_key_is_one_clear_error(signed, keys, tmp_path):
    with pytest.raises(SigningKeyError, match="is a private key; trust the public key"):
        myelin.Instance(trust=keys[0])
    junk = tmp_path / "junk.pem"
    junk.write_text("not a key")
    code, text = plex("verify", signed, "--key", junk)
    assert code == 1 and "not a PEM public key" in text
    code, text = plex("sign", signed, "--key", tmp_path / "missing.pem")
    assert code == 1 and "cannot read the private key" in text


# --- signing and verifying ------------------------------------------------------------------------


def test_sign_to_a_copy_and_in_place(mlp_mln, keys, signed, tmp_path):
    assert mlp_mln.stat().st_size + TRAILER_SIZE == signed.stat().st_size
    assert MlnReader(mlp_mln).signature is None  # -o left the source alone
    with MlnReader(signed) as reader:
        assert reader.signature is not None
        assert reader.manifest == MlnReader(mlp_mln).manifest
    in_place = tmp_path / "in-place.mln"
    shutil.copy(mlp_mln, in_place)
    assert plex("sign", in_place, "--key", keys[0])[0] == 0
    assert in_place.read_bytes() == signed.read_bytes()  # ed25519 is deterministic
    assert plex("sign", in_place, "--key", keys[0])[0] == 0  # re-signing replaces the trailer
    assert in_place.read_bytes() == signed.read_bytes()


def test_verify_exit_code(mlp_mln, signed, keys, other_keys):
    code, text = plex("verify", signed, "--key", keys[1])
    assert code == 0 and "verifies" in text
    code, text = plex("verify", mlp_mln, "--key", keys[1])
    assert code == 1 and "not signed" in text
    code, text = plex("verify", signed, "--key", other_keys[1])
    assert code == 1 and "not by the trusted key" in text


def test_a_signed_file_loads_and_runs_with_and_without_trust(signed, keys):
    x = np.ones((2, 16), np.float32)
    plain = myelin.Instance().load(signed)
    trusted = myelin.Instance(trust=keys[1]).load(signed)
    with plain.session() as a, trusted.session() as b:
        np.testing.assert_array_equal(a.call("forward", x), b.call("forward", x))
    code, text = plex("run", signed, "-f", "forward", "--input", "2x16xf32=1", "--trust", keys[1])
    assert code == 0 and "result 0" in text


def tamper_module(source: Path, target: Path) -> Path:
    """What an attacker does: change native code and fix every hash that covers it."""
    shutil.copy(source, target)
    data = bytearray(target.read_bytes())
    magic, major, minor, flags, offset, length, _ = HEADER.unpack(data[:HEADER_SIZE])
    manifest = json.loads(data[offset : offset + length])
    section = next(s for s in manifest["sections"] if s["kind"] == "module")
    data[section["offset"] + section["length"] // 2] ^= 0xFF
    start, end = section["offset"], section["offset"] + section["length"]
    section["sha256"] = hashlib.sha256(data[start:end]).hexdigest()
    body = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    header = HEADER.pack(
        magic, major, minor, flags, offset, len(body), hashlib.sha256(body).digest()
    )
    tail = data[offset + length :]  # the signature trailer, if any, stays
    target.write_bytes(header + bytes(data[HEADER_SIZE:offset]) + body + bytes(tail))
    return target


def test_hashes_catch_accidents_not_attacks(mlp_mln, tmp_path):
    """The reason for signatures: a tampered module with recomputed hashes passes every hash."""
    tampered = tamper_module(mlp_mln, tmp_path / "tampered.mln")
    with MlnReader(tampered) as reader:
        assert reader.signature is None  # it loads as a valid, unsigned file


@pytest.fixture
def no_loading(monkeypatch):
    """Fail the test if a refused file got as far as wrapping modules or registering
    parameters."""

    def forbidden(self):
        raise AssertionError("a refused artifact reached module wrapping / parameter registration")

    monkeypatch.setattr(Model, "_load_modules", forbidden)
    monkeypatch.setattr(Model, "_parameter_providers", forbidden)


@pytest.mark.parametrize("case", ["unsigned", "other-key", "tampered", "stripped", "swapped"])
def test_trust_refuses_before_loading_anything(
    case, mlp_mln, signed, keys, other_keys, tmp_path, no_loading
):
    if case == "unsigned":
        path, message = mlp_mln, "not signed"
    elif case == "other-key":
        path = sign_file(mlp_mln, other_keys[0], tmp_path / "other.mln")
        message = "not by the trusted key"
    elif case == "tampered":
        path, message = tamper_module(signed, tmp_path / "t.mln"), "does not verify"
    elif case == "stripped":  # the signature removed and the flag cleared: now "unsigned"
        data = bytearray(signed.read_bytes()[:-TRAILER_SIZE])
        data[12] &= ~FLAG_SIGNED
        path = tmp_path / "stripped.mln"
        path.write_bytes(bytes(data))
        message = "not signed"
    else:  # a valid trailer of this key, taken from another file it signed
        other = tmp_path / "demo.mln"
        sign_file(build(other), keys[0])
        path = tmp_path / "swapped.mln"
        path.write_bytes(signed.read_bytes()[:-TRAILER_SIZE] + other.read_bytes()[-TRAILER_SIZE:])
        message = "does not verify"
    with pytest.raises(SignatureError, match=message) as caught:
        myelin.Instance(trust=keys[1]).load(path, verify=False)  # trust forces verification
    assert str(path) in str(caught.value)
    code, text = plex("run", path, "-f", "forward", "--input", "2x16xf32=1", "--trust", keys[1])
    assert code == 1 and message in text and "internal error" not in text


def test_one_flipped_byte_anywhere_in_a_signed_file_is_refused(signed, keys, tmp_path):
    """Every byte of the header and the trailer, and 300 random bytes elsewhere (sections,
    padding, manifest): each flip is an ArtifactError under the trust policy."""
    data = signed.read_bytes()
    trust = load_public_key(keys[1])
    size = len(data)
    positions = [*range(HEADER_SIZE), *range(size - TRAILER_SIZE, size)]
    rng = random.Random(11)
    positions += rng.sample(range(HEADER_SIZE, size - TRAILER_SIZE), 300)
    bad = tmp_path / "flipped.mln"
    for position in positions:
        flipped = bytearray(data)
        flipped[position] ^= 1 << rng.randrange(8)
        bad.write_bytes(bytes(flipped))
        with pytest.raises(ArtifactError):
            MlnReader(bad, trust=trust).close()


def test_signing_refuses_a_damaged_file(mlp_mln, keys, tmp_path):
    damaged = tmp_path / "damaged.mln"
    data = bytearray(mlp_mln.read_bytes())
    with MlnReader(mlp_mln) as reader:
        section = next(s for s in reader.sections.values() if s.kind == "parameter")
    data[section.offset] ^= 1
    damaged.write_bytes(bytes(data))
    code, text = plex("sign", damaged, "--key", keys[0])
    assert code == 1 and "corrupt (sha256 mismatch)" in text
    assert damaged.read_bytes() == bytes(data)


def test_an_unsigned_1_0_file_still_loads(tmp_path):
    """Files written before signatures existed (format 1.0, no flags) read as before."""
    path = build(tmp_path / "old.mln")
    with MlnReader(path, verify=False) as reader:
        manifest = dict(reader.manifest, format={"major": 1, "minor": 0})
    replace_manifest(path, manifest, minor=0)
    with MlnReader(path) as reader:
        assert reader.format_version == (1, 0) and reader.signature is None


def test_inspect_shows_the_signing_key(signed):
    code, text = plex("inspect", signed)
    assert code == 0, text
    assert "signed by key" in text and "plex verify" in text
