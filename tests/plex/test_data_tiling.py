"""`[devices.<cpu>] data_tiling`: IREE's data tiling on llvm-cpu, chosen for the host unless
pinned, recorded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import myelin
from myelin.compiler.targets import data_tiling_choice
from plex.builder import build
from plex.errors import ManifestError
from tests.models import mlp_reference

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

APP = """\
[app]
name = "tiled"
packages = ["{pkg}"]

[devices.{device}]
{options}
"""


def write_app(folder: Path, device: str, options: str) -> Path:
    app = folder / "app.toml"
    app.write_text(APP.format(pkg=EXAMPLES / "mlp", device=device, options=options))
    return app


def test_data_tiling_compiles_with_the_flag_and_computes_the_same(tmp_path, mlp_weights):
    app = write_app(tmp_path, "cpu", 'target = "llvm-cpu"\ndata_tiling = true')
    out = build(app, tmp_path / "tiled.mln").output
    model = myelin.Instance().load(out)
    variant = model.manifest["variants"][0]
    assert "--iree-global-opt-data-tiling" in variant["flags"]
    assert variant["devices"][0]["options"]["data_tiling"] is True
    x = np.random.default_rng(3).standard_normal((5, 16)).astype(np.float32)
    with model.session() as s:
        y = s.call("forward", x)
    _, want = mlp_reference(mlp_weights, x)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    model.close()


def test_data_tiling_is_chosen_for_the_host_by_default(tmp_path):
    app = write_app(tmp_path, "cpu", 'target = "llvm-cpu"')  # data_tiling left unset
    model = myelin.Instance().load(build(app, tmp_path / "host.mln").output)
    variant = model.manifest["variants"][0]
    chosen = data_tiling_choice("host", "").value
    assert ("--iree-global-opt-data-tiling" in variant["flags"]) is chosen
    assert variant["devices"][0]["host_chosen"]["data_tiling"]["value"] is chosen
    model.close()


def test_data_tiling_on_a_gpu_device_is_refused(tmp_path):
    app = write_app(tmp_path, "gpu", 'target = "cuda"\ndata_tiling = true')
    with pytest.raises(ManifestError, match=r"\[devices\.gpu\] data_tiling: does not apply to"):
        build(app, tmp_path / "x.mln")
