"""benchmarks/gpu/payload.py: a .mln stripped of its parameters and rebuilt from the same seeded
weights is the built file, byte for byte (q4 parts, whose encoder searches per group, and a
parameter kept as it is); other weights are caught by the digests. One small CPU build."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from plex.builder import build

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "gpu"))
import payload  # noqa: E402

MODEL = """
import torch
from torch import nn


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(64, 128, bias=False)
        self.norm = nn.LayerNorm(128)
        self.down = nn.Linear(128, 64, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.norm(self.up(x))))


def _model(seed=0):
    torch.manual_seed(seed)
    return M().eval()


def build():
    return {"forward": (_model().forward, (torch.zeros(4, 64),))}


def weights(seed=0):
    return {n: p.detach().numpy() for n, p in _model(seed).named_parameters()}


def other_weights():
    return weights(seed=1)
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("payload")
    (folder / "model.py").write_text(MODEL)
    (folder / "plex.toml").write_text(
        '[package]\nname = "tiny"\nversion = "0.1.0"\ndescription = "payload test"\n'
        '[graph.tiny]\nsource = "model.py:build"\nfrontend = "torch"\n'
        'entrypoints = ["forward"]\n'
    )
    (folder / "app.toml").write_text(
        '[app]\nname = "tiny-q4"\npackages = ["."]\n[devices.cpu]\ntarget = "llvm-cpu"\n'
        'cpu = "generic"\n[weights.codec]\n"*" = "q4"\n'
    )
    out = folder / "tiny.mln"
    build(folder / "app.toml", out, cache_dir=folder / "cache")
    return folder, out


def test_a_stripped_mln_rebuilt_from_its_seed_is_the_built_file(built, tmp_path, monkeypatch):
    folder, mln = built
    monkeypatch.setattr(payload, "ROWS_PER_TASK", 24)  # several q4 tasks per matrix, one short
    skeleton = tmp_path / "skeleton"
    manifest = payload.strip(mln, skeleton)
    codecs = {p.get("codec") for p in manifest["parameters"]}
    assert "q4:g32" in codecs and len(codecs) > 1  # the norm's parameters stay as they are
    assert not any(f.name.startswith("param") for f in skeleton.iterdir())
    rebuilt = tmp_path / "rebuilt.mln"
    weights = payload.load_function(f"{folder / 'model.py'}:weights")
    assert payload.rebuild(skeleton, rebuilt, weights) == []
    assert rebuilt.read_bytes() == mln.read_bytes()


def test_other_weights_are_caught_by_the_digests(built, tmp_path):
    folder, mln = built
    skeleton = tmp_path / "skeleton"
    payload.strip(mln, skeleton)
    other = payload.load_function(f"{folder / 'model.py'}:other_weights")
    differ = payload.rebuild(skeleton, tmp_path / "other.mln", other)
    assert differ and all(name.startswith(payload.PARAMETER_PREFIX) for name in differ)


def test_a_placeholder_rebuild_keeps_the_module_and_zeroes_the_parameters(built, tmp_path):
    from myelin.mln import MlnReader

    _, mln = built
    skeleton = tmp_path / "skeleton"
    manifest = payload.strip(mln, skeleton)
    out = tmp_path / "placeholder.mln"
    assert payload.rebuild(skeleton, out, None) == []  # every module section as built
    with MlnReader(out) as reader, MlnReader(mln) as original:
        for s in manifest["sections"]:
            got = bytes(reader.section_view(s["name"]))
            if s["name"].startswith(payload.PARAMETER_PREFIX):
                assert got == bytes(len(got))
            else:
                assert got == bytes(original.section_view(s["name"]))


def test_graft_takes_the_module_and_keeps_the_parameter_digests(built, tmp_path):
    import json

    _, mln = built
    old, new = tmp_path / "old", tmp_path / "new"
    payload.strip(mln, old)
    payload.strip(mln, new)
    module = next(f for f in new.iterdir() if f.name != payload.MANIFEST)
    module.write_bytes(module.read_bytes() + b"\0")  # "a new compile" of the same graph
    manifest = json.loads((new / payload.MANIFEST).read_text())
    for s in manifest["sections"]:
        if s["name"].startswith(payload.PARAMETER_PREFIX):
            s["sha256"] = "0" * 64  # a stand-in encoder's parameters
        else:
            s["length"] += 1
    (new / payload.MANIFEST).write_text(json.dumps(manifest))
    out = tmp_path / "out"
    payload.graft(old, new, out)
    grafted = json.loads((out / payload.MANIFEST).read_text())
    params = [s for s in grafted["sections"] if s["name"].startswith(payload.PARAMETER_PREFIX)]
    olds = json.loads((old / payload.MANIFEST).read_text())["sections"]
    assert params == [s for s in olds if s["name"].startswith(payload.PARAMETER_PREFIX)]
    assert (out / module.name).read_bytes() == module.read_bytes()
    manifest["parameters"][0]["length"] += 2  # other parameters: refused
    (new / payload.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="different parameters"):
        payload.graft(old, new, tmp_path / "refused")
