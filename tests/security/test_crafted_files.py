"""Crafted files: someone who can write a .mln changes what they like and recomputes every hash.
Under a trust policy each is refused before any of it is used (a manifest field, a module
section, a plugin section, all with the original signature kept); without one, a crafted
backend section never reaches the dynamic loader unless the caller opted in (tools/fuzz.py's
`mln-backend` targets, replayed here with every dynamic load of a memfd watched)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import myelin
from myelin.errors import SignatureError
from myelin.mln import FLAG_SIGNED, TRAILER_SIZE, MlnReader, generate_key_pair, sign_file
from tests.conftest import REPO
from tests.security.crafting import (
    PLUGIN_SECTION,
    marker_plugin,
    plex,
    rewrite,
    with_plugin_variant,
)

_spec = importlib.util.spec_from_file_location("plex_fuzz_tool", REPO / "tools" / "fuzz.py")
assert _spec is not None and _spec.loader is not None
fuzz = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fuzz)


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("keys")
    private, public = generate_key_pair()
    (folder / "k.pem").write_bytes(private)
    (folder / "k.pub.pem").write_bytes(public)
    return folder / "k.pem", folder / "k.pub.pem"


def keep_signature(crafted: Path, signed: Path) -> Path:
    """`crafted` (unsigned, hashes recomputed) given the signed flag and `signed`'s trailer, as an
    attacker keeps a signature in the hope that nobody checks it against the content."""
    data = bytearray(crafted.read_bytes())
    data[12] |= FLAG_SIGNED
    crafted.write_bytes(bytes(data) + signed.read_bytes()[-TRAILER_SIZE:])
    return crafted


def _flip_first_module_byte(path: Path) -> dict[str, tuple[str, bytes]]:
    with MlnReader(path) as reader:
        name = next(s.name for s in reader.sections.values() if s.kind == "module")
        data = bytearray(reader.section_view(name))
    data[len(data) // 2] ^= 0x01
    return {name: ("module", bytes(data))}


def _budget(manifest: dict) -> None:
    manifest["policies"]["memory_budget"] = 1 << 40


@pytest.mark.parametrize("part", ["manifest field", "module section", "plugin section"])
def test_a_crafted_file_with_recomputed_hashes_is_refused_under_trust(
    part, mlp_mln, keys, tmp_path
):
    marker = tmp_path / "native-code-ran"
    plugin = marker_plugin(tmp_path, marker)
    # The genuine file: the MLP with a plugin variant, signed by the trusted key.
    genuine = with_plugin_variant(mlp_mln, tmp_path / "genuine.mln", plugin)
    signed = sign_file(genuine, keys[0], tmp_path / "signed.mln")
    if part == "module section":
        changes = {"sections": _flip_first_module_byte(genuine)}
    elif part == "plugin section":  # other bytes: the plugin an attacker would ship
        changes = {"sections": {PLUGIN_SECTION: ("backend", plugin + b"\0")}}
    else:
        changes = {"manifest": _budget}
    crafted = keep_signature(rewrite(genuine, tmp_path / "crafted.mln", **changes), signed)
    with MlnReader(crafted):  # every hash is consistent: only the signature can tell
        pass
    with pytest.raises(SignatureError, match="does not verify"):
        myelin.Instance(trust=keys[1], allow_native_code=True).load(crafted)
    assert not marker.exists()


@pytest.fixture
def targets(tmp_path, monkeypatch):
    fuzz.watch_native_loads(monkeypatch.setattr)
    return fuzz.Targets(tmp_path / "fuzz")


@pytest.mark.parametrize(
    "seed", sorted((REPO / "tools" / "fuzz_corpus" / "mln-backend").iterdir()), ids=lambda p: p.name
)
def test_the_backend_corpus_never_reaches_the_dynamic_loader(targets, seed):
    assert targets.mln_backend(seed.read_bytes()) is False  # refused, and no NativeCodeLoaded


RECORD = {"name": "fuzz", "abi": 2, "ops": ["matmul"], "plugin": fuzz.BACKEND_SECTION,
          "libraries": []}  # fmt: skip


@pytest.mark.parametrize(
    "record",
    [
        RECORD,
        {**RECORD, "abi": 1},  # another ABI
        {**RECORD, "libraries": [fuzz.BACKEND_SECTION]},  # the plugin again, as a library
        {**RECORD, "libraries": ["variant/default/module/mlp"]},  # a module section as a library
        {**RECORD, "plugin": "param/mlp/w1"},  # weights as the plugin
        {**RECORD, "plugin": "no/such/section"},
        {**RECORD, "name": "../../x"},
        {**RECORD, "ops": 7},
    ],
    ids=["genuine", "abi", "plugin-as-library", "module-as-library", "weights-as-plugin",
         "missing", "name", "ops"],
)  # fmt: skip
def test_a_crafted_backend_record_never_loads_native_code_unasked(targets, record):
    plugin = fuzz.split_backend_input(fuzz.BACKEND_SEED.read_bytes())[2]
    assert targets.mln_backend(fuzz.backend_input(1, record, plugin)) is False


def test_the_watch_on_native_loads_is_live(targets):
    """What the targets rely on: a plugin handed to the dynamic loader, as the runtime hands it
    (/proc/self/fd/N of its memfd), is caught."""
    import ctypes

    with pytest.raises(fuzz.NativeCodeLoaded):
        ctypes.CDLL("/proc/self/fd/0")


def test_inspect_shows_crafted_kernel_records_escaped_and_without_a_traceback(mlp_mln, tmp_path):
    """The kernel report comes from the file: odd types count as unknown sizes, and names are
    shown escaped (no terminal escape sequence reaches the screen)."""

    def kernels(data: dict) -> None:
        data["variants"][0]["devices"][0]["kernels"] = [
            {"op": "matmul", "m": "64", "n": True, "k": -1, "kernel": None,
             "function": "f\x1b[2J", "reason": "odd"},
            {"op": "batch_matmul", "flops": "many", "function": "g", "reason": "r"},
        ]  # fmt: skip

    crafted = rewrite(mlp_mln, tmp_path / "kernels.mln", manifest=kernels)
    done = plex("inspect", crafted)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "\x1b" not in done.stdout
    assert "kernels: 0 of 2 contractions on sm_90a kernels" in done.stdout
    assert "f\\x1b[2J" in done.stdout
