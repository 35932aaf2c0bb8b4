"""Property tests over what PLeX reads from outside (the CI-sized sibling of tools/fuzz.py): any
damaged or crafted .mln file, any manifest JSON put back into an artifact with a valid hash, any
plex.toml/app.toml, is either accepted or refused with the documented error type
(ArtifactError and the other MyelinErrors; ManifestError), never another exception or a crash.
The checks are tools/fuzz.py's own targets; the committed fuzz corpus, including every input the
fuzzer once found a defect with, is replayed first."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import REPO

_spec = importlib.util.spec_from_file_location("plex_fuzz_tool", REPO / "tools" / "fuzz.py")
assert _spec is not None and _spec.loader is not None
fuzz = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fuzz)

# Bounded for CI: each example loads a file through IREE (about 2 ms) or parses a manifest.
BOUNDED = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    database=None,  # nothing written into the checkout
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory):
    return fuzz.Targets(tmp_path_factory.mktemp("fuzz"))


@pytest.mark.parametrize(
    "seed",
    sorted(p for p in (REPO / "tools" / "fuzz_corpus").glob("*/*") if p.is_file()),
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_the_fuzz_corpus_replays_cleanly(targets, seed: Path) -> None:
    target = {
        "mln": targets.mln,
        "mln-manifest": targets.mln_manifest,
        "manifest": targets.manifest,
        "mln-backend": targets.mln_backend,
    }[seed.parent.name]
    target(seed.read_bytes())


ARTIFACT = (REPO / "tools" / "fuzz_corpus" / "mln" / "mlp-as-is").read_bytes()[1:]


@st.composite
def damaged_artifacts(draw: st.DrawFn) -> bytes:
    """The example artifact with bytes flipped, ranges overwritten, cut short or spliced; the
    first byte asks the target to repair the manifest hash, so half the cases reach the typed
    records and the loader."""
    data = bytearray(ARTIFACT)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "overwrite", "truncate", "splice"]))
        at = draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "overwrite":
            chunk = draw(st.binary(min_size=1, max_size=16))
            data[at : at + len(chunk)] = chunk
        elif kind == "truncate":
            del data[at:]
            if not data:
                break
        else:
            other = draw(st.integers(0, len(data) - 1))
            length = draw(st.integers(1, 256))
            data[at : at + length] = data[other : other + length]
    return bytes([draw(st.integers(0, 1))]) + bytes(data)


@BOUNDED
@given(damaged_artifacts())
def test_a_damaged_artifact_is_loaded_or_refused_with_artifact_error(targets, data) -> None:
    targets.mln(data)


MANIFEST = json.loads(fuzz.split_manifest(ARTIFACT))


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*prefix, i))


PATHS = [p for p in _paths(MANIFEST) if p]
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True)
    | st.sampled_from(["", "float99", "int64", "dim", "add", "resident", "cpu", "mlp", "x" * 300])
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=8,
)


@st.composite
def crafted_manifests(draw: st.DrawFn) -> bytes:
    """The example's manifest with one to three fields replaced or removed: structure-aware, so
    the cases reach every typed record instead of failing JSON parsing."""
    manifest = json.loads(json.dumps(MANIFEST))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS))
        parent = manifest
        try:
            for key in path[:-1]:
                parent = parent[key]
            if draw(st.booleans()) and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = draw(JSON_VALUES)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier replacement removed the path
    return json.dumps(manifest).encode()


@BOUNDED
@given(crafted_manifests())
def test_a_crafted_manifest_with_a_valid_hash_is_loaded_or_refused(targets, data) -> None:
    targets.mln_manifest(data)


TOML_SEEDS = sorted((REPO / "tools" / "fuzz_corpus" / "manifest").iterdir())
TOML_VALUES = ['""', "-1", "1e999", "true", "[]", "{}", '"../../etc/passwd"', '"*"', "[[1]]",
               '"llvm-cpu"', '{ 0 = "x" }', '"999999999999999999999TiB"', "nan", '"\\u0000"']  # fmt: skip


@st.composite
def damaged_tomls(draw: st.DrawFn) -> bytes:
    seed = draw(st.sampled_from(TOML_SEEDS)).read_bytes()
    kind, lines = seed[:1], seed[1:].decode().splitlines()
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        choice = draw(st.sampled_from(["value", "delete", "duplicate", "text"]))
        if choice == "value" and "=" in lines[i]:
            lines[i] = lines[i].split("=", 1)[0] + "= " + draw(st.sampled_from(TOML_VALUES))
        elif choice == "delete":
            del lines[i]
        elif choice == "duplicate":
            lines.insert(i, lines[i])
        else:
            lines[i] = draw(st.text(max_size=20))
        if not lines:
            lines = [""]
    return kind + "\n".join(lines).encode()


@BOUNDED
@given(damaged_tomls())
def test_a_damaged_manifest_is_read_or_refused_with_manifest_error(targets, data) -> None:
    targets.manifest(data)


def test_the_targets_accept_what_is_valid(targets) -> None:
    """A target that refused everything would pass every property: the undamaged seeds load,
    and the example manifests read."""
    assert targets.mln(b"\x00" + ARTIFACT)
    assert targets.mln(b"\x01" + ARTIFACT)
    assert targets.mln_manifest(fuzz.split_manifest(ARTIFACT))
    seeds = {p.name: p.read_bytes() for p in TOML_SEEDS}
    assert targets.manifest(seeds["plex-mlp"]) and targets.manifest(seeds["app-mlp"])


def test_load_without_verify_still_hashes_the_module_sections(tmp_path: Path) -> None:
    """verify=False skips hashing parameters, not the VM bytecode IREE is given: damaged bytecode
    can make IREE's loader hang (the fuzzer found 4 bytes that made it allocate 2.7 GB)."""
    import myelin
    from myelin.errors import ArtifactError
    from myelin.mln import MlnReader

    original = tmp_path / "mlp.mln"
    original.write_bytes(ARTIFACT)
    with MlnReader(original) as reader:
        sections = list(reader.sections.values())
    module = next(s for s in sections if s.kind == "module")
    parameter = next(s for s in sections if s.kind == "parameter")
    for section, refused in ((module, True), (parameter, False)):
        data = bytearray(ARTIFACT)
        data[section.offset + section.length // 2] ^= 0xFF
        damaged = tmp_path / f"{section.kind}.mln"
        damaged.write_bytes(bytes(data))
        if refused:
            with pytest.raises(ArtifactError, match="is corrupt \\(sha256 mismatch\\)"):
                myelin.Instance().load(damaged, verify=False)
        else:
            myelin.Instance().load(damaged, verify=False).close()  # parameters: not hashed
