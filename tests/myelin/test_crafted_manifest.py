"""Manifests crafted with a valid hash: the hash only says the bytes are the ones written, so
every field is checked on load and each inconsistency is an ArtifactError naming the field.

The first half crafts the container (fake module bytes, no IREE); the second crafts a real
artifact, where the recorded signatures are checked against the modules' own reflection.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest

import myelin
from myelin.errors import ArtifactError
from myelin.mln import MAX_TENSOR_BYTES, ArtifactManifest, ManifestInvalid, MlnReader
from tests.myelin.test_mln_format import (
    ENTRY,
    W0,
    _delete,
    _set,
    build,
    demo_manifest,
    manifest_of,
    refused,
    replace_manifest,
)

MEMORY = (*ENTRY, "memory")
GOOD_MEMORY = {
    "transient": ["mul", ["dim", 0, 0], 128],
    "results": ["mul", ["dim", 0, 0], 32],
    "parameters": [["model", "w0"]],
    "schedule": {"executes": 1, "dispatches": 2, "concurrent": []},
}
POLICIES = {"residency": "resident", "memory_budget": None, "favor": "min-memory", "profile": None}


def _with(memory=None, policies=None):
    """A mutation that first installs a valid memory plan and policies, then applies `then`."""

    def install(m):
        m["variants"][0]["entrypoints"][0]["memory"] = copy.deepcopy(memory or GOOD_MEMORY)
        m["policies"] = copy.deepcopy(policies or POLICIES)

    return install


def _steps(*mutations):
    def mutate(m):
        for f in mutations:
            f(m)

    return mutate


def _overlap(m):
    """parameters[1] (b0) moved into w0's section, over w0's bytes."""
    m["parameters"][1].update(section=W0, offset=480)


CASES = [
    # dtypes
    (
        _set((*ENTRY, "inputs", 0, "dtype"), "float99"),
        "variants[0].entrypoints[0].inputs[0].dtype",
        "unknown dtype 'float99'",
    ),
    (_set(("parameters", 0, "dtype"), "float99"), "parameters[0].dtype", "unknown dtype 'float99'"),
    # size formulas
    (
        _steps(_with(), _set((*MEMORY, "transient"), ["pow", 2, 3])),
        "variants[0].entrypoints[0].memory.transient",
        "unknown size formula op 'pow'",
    ),
    (
        _steps(_with(), _set((*MEMORY, "results"), "lots")),
        "variants[0].entrypoints[0].memory.results",
        "must be a size formula",
    ),
    (
        _steps(_with(), _set((*MEMORY, "transient"), ["dim", 3, 0])),
        "variants[0].entrypoints[0].memory.transient",
        "reads input 3, but the entrypoint has 1 input(s)",
    ),
    (
        _steps(_with(), _set((*MEMORY, "transient"), ["dim", 0, 5])),
        "variants[0].entrypoints[0].memory.transient",
        "reads axis 5 of input 0, which is of rank 2",
    ),
    (
        _steps(_with(), _set((*MEMORY, "transient"), ["add", 1])),
        "variants[0].entrypoints[0].memory.transient",
        "takes 2 operands",
    ),
    (
        _steps(_with(), _set((*MEMORY, "transient"), True)),
        "variants[0].entrypoints[0].memory.transient",
        "must be a size formula",
    ),
    (
        _steps(_with(), _delete((*MEMORY, "results"))),
        "variants[0].entrypoints[0].memory.results",
        "is missing",
    ),
    (
        _steps(_with(), _set((*MEMORY, "parameters"), ["model"])),
        "variants[0].entrypoints[0].memory.parameters[0]",
        "must be [scope, key]",
    ),
    (
        _steps(_with(), _set((*MEMORY, "schedule", "executes"), -2)),
        "variants[0].entrypoints[0].memory.schedule.executes",
        "integer >= 0",
    ),
    # policies
    (
        _steps(_with(), _set(("policies", "memory_budget"), "abc")),
        "policies.memory_budget",
        "must be an integer >= 0, got 'abc'",
    ),
    (
        _steps(_with(), _set(("policies", "memory_budget"), -1)),
        "policies.memory_budget",
        "must be an integer >= 0, got -1",
    ),
    (_steps(_with(), _set(("policies",), "fast")), "policies", "must be an object, got 'fast'"),
    (_steps(_with(), _set(("policies",), [1])), "policies", "must be an object"),
    (
        _steps(_with(), _set(("policies", "residency"), "sometimes")),
        "policies.residency",
        "unknown residency 'sometimes'",
    ),
    (_steps(_with(), _set(("policies", "residency"), 3)), "policies.residency", "non-empty string"),
    (_steps(_with(), _set(("policies", "profile"), [1])), "policies.profile", "must be an object"),
    (
        _steps(_with(), _set(("policies", "profile"), {"device_timing": "yes"})),
        "policies.profile.device_timing",
        "must be true or false",
    ),
    # signatures
    (_set((*ENTRY, "outputs"), []), "variants[0].entrypoints[0].outputs", "is empty"),
    (
        _set((*ENTRY, "inputs", 0, "dims"), ["batch", 15]),
        "variants[0].entrypoints[0].inputs[0].dims[1]",
        "is 15 but shape[1] is 16",
    ),
    (
        _set(("variants", 0, "devices"), []),
        "variants[0].devices",
        "is empty; the entrypoints need a device",
    ),
    # parameters
    (_overlap, "parameters[1]", "byte range overlaps parameters[0] in section 'param/model/w0'"),
    (
        _set(("parameters", 0, "length"), 256),
        "parameters[0].length",
        "is 256 bytes but float32[16, 8] needs 512",
    ),
    (_set(("parameters", 1, "section"), W0), "parameters[1]", "overlaps parameters[0]"),
    # limits: sizes no allocation may be derived from
    (
        _set((*ENTRY, "inputs", 0, "shape"), [99999999999, 99999999999]),
        "variants[0].entrypoints[0].inputs[0].shape",
        f"(more than the {MAX_TENSOR_BYTES}-byte limit)",
    ),
    (
        _set((*ENTRY, "inputs", 0, "shape"), [1] * 65),
        "variants[0].entrypoints[0].inputs[0].shape",
        "has rank 65; at most 64",
    ),
    (
        _set(("parameters", 0, "shape"), [2**64, 1]),
        "parameters[0].shape[0]",
        "must be at most 9223372036854775807",
    ),
    (_set(("sections", 1, "length"), 2**70), "sections[1].length", "must be at most"),
]


@pytest.mark.parametrize(("mutate", "field", "problem"), CASES)
def test_crafted_manifest_is_refused_naming_the_field(tmp_path, mutate, field, problem):
    path = build(tmp_path / "demo.mln")
    manifest = manifest_of(path)
    mutate(manifest)
    replace_manifest(path, manifest)
    refused(path, f"manifest field {field}: ", problem)


def test_a_valid_memory_plan_and_policies_load(tmp_path):
    """The control for the cases above: the same installation, unmutated, is accepted."""
    path = build(tmp_path / "demo.mln")
    manifest = manifest_of(path)
    _with()(manifest)
    replace_manifest(path, manifest)
    with MlnReader(path) as reader:
        (entry,) = reader.artifact_manifest.variants[0].entrypoints
        assert entry.memory is not None and entry.memory.transient == ("mul", ("dim", 0, 0), 128)
        assert reader.artifact_manifest.runtime_policies.favor == "min-memory"


def test_deep_formula_is_refused_without_recursion_error(tmp_path):
    path = build(tmp_path / "demo.mln")
    manifest = manifest_of(path)
    _with()(manifest)
    formula: object = 1
    for _ in range(200):
        formula = ["add", formula, 1]
    manifest["variants"][0]["entrypoints"][0]["memory"]["transient"] = formula
    replace_manifest(path, manifest)
    refused(path, "size formula nests deeper than 64")


def test_compose_style_manifest_parses_without_format_and_sections():
    """A build composing its manifest has no section table yet: the records still check every
    field, and give the dict back unchanged."""
    composed = demo_manifest()
    record = ArtifactManifest.from_json(composed)
    assert record.sections is None and record.format_version is None
    assert record.to_json() == composed
    bad = demo_manifest()
    bad["parameters"][0]["dtype"] = "float99"
    with pytest.raises(ManifestInvalid, match=r"parameters\[0\]\.dtype: unknown dtype"):
        ArtifactManifest.from_json(bad)


# --- real artifacts: the recorded signature is the function's own --------------------------------


def crafted_copy(source: Path, target: Path, mutate) -> Path:
    shutil.copy(source, target)
    manifest = manifest_of(target)
    mutate(manifest)
    replace_manifest(target, manifest)
    return target


def _entry(m, name="forward"):
    return next(e for e in m["variants"][0]["entrypoints"] if e["name"] == name)


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (
            lambda m: _entry(m).update(function="hidden"),
            "manifest field variants[0].entrypoints[0].outputs: records (float32[?, 8]) but "
            "mlp.hidden returns (float32[?, 32]) by its iree.abi.declaration",
        ),
        (
            lambda m: _entry(m)["outputs"][0].update(shape=[None, 9], dims=["n", 9]),
            "records (float32[?, 9]) but mlp.forward returns (float32[?, 8])",
        ),
        (
            lambda m: _entry(m)["inputs"][0].update(dtype="int32"),
            "inputs: records (int32[?, 16]) but mlp.forward takes (float32[?, 16])",
        ),
        (
            lambda m: _entry(m)["inputs"].append(copy.deepcopy(_entry(m)["inputs"][0])),
            "takes (float32[?, 16])",
        ),
        (
            lambda m: _entry(m).update(function="__init"),
            "mlp.__init has no iree.abi.declaration reflection",
        ),
        (
            lambda m: _entry(m).update(function="nope"),
            "entrypoint 'forward' names missing function mlp.nope",
        ),
    ],
    ids=[
        "other-function",
        "output-shape",
        "input-dtype",
        "extra-input",
        "no-reflection",
        "missing",
    ],
)
@pytest.mark.parametrize("verify", [True, False])
def test_entrypoint_signature_is_checked_against_the_module(
    mlp_mln, tmp_path, mutate, problem, verify
):
    crafted = crafted_copy(mlp_mln, tmp_path / "crafted.mln", mutate)
    with pytest.raises(ArtifactError) as caught:
        myelin.Instance().load(crafted, verify=verify)
    assert str(crafted) in str(caught.value)
    assert problem in str(caught.value)


def test_crafted_policies_are_refused_at_load(mlp_mln, tmp_path):
    crafted = crafted_copy(
        mlp_mln, tmp_path / "budget.mln", _set(("policies", "memory_budget"), "abc")
    )
    with pytest.raises(ArtifactError, match=r"manifest field policies\.memory_budget: must be"):
        myelin.Instance().load(crafted)


def test_built_manifests_round_trip_through_the_records(mlp_mln):
    """`to_json()` gives back exactly what the build wrote, so a build that composes through
    the records writes the same bytes."""
    with MlnReader(mlp_mln) as reader:
        assert reader.artifact_manifest.to_json() == reader.manifest
        composed = {k: v for k, v in reader.manifest.items() if k not in ("format", "sections")}
    assert ArtifactManifest.from_json(composed).to_json() == composed


def test_codec_manifest_round_trips_through_the_records(tmp_path):
    """Encoded parameters (int8 and q4 parts, with storage, role, of, rule, order) too."""
    from plex.builder import build as build_app
    from tests.plex.test_codec_build import write_app

    artifact = tmp_path / "lm.mln"
    build_app(write_app(tmp_path), artifact)
    with MlnReader(artifact) as reader:
        assert reader.artifact_manifest.to_json() == reader.manifest
        parts = {p.key: p for p in reader.artifact_manifest.parameters}
    assert parts["emb"].storage is not None and parts["emb"].storage.dtype == "uint4"
    assert parts["emb"].length == parts["emb"].stored_bytes
    assert parts["proj.weight.scale"].of == "proj.weight"
