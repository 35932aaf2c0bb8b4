"""Parameters are mapped, not copied: a model with 256 MiB of fp32 weights loads and runs its
first call with less than 32 MiB of new anonymous memory."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

ROWS, COLS = 4096, 16384  # 4096 x 16384 x 4 B = 256 MiB

PROBE = textwrap.dedent("""
    import sys
    import numpy as np

    def anon_kib():
        for line in open("/proc/self/smaps_rollup"):
            if line.startswith("Anonymous:"):
                return int(line.split()[1])

    import myelin
    from myelin.mln import MlnReader
    inst = myelin.Instance()
    x = np.random.default_rng(0).standard_normal((1, 4096)).astype(np.float32)
    before = anon_kib()
    model = inst.load(sys.argv[1])
    session = model.session()
    y = session.call("forward", x)
    after = anon_kib()
    with MlnReader(sys.argv[1], verify=False) as r:
        w = np.frombuffer(r.section_view("param/big/w"), np.float32).reshape(4096, 16384)
        err = float(np.abs(y - x @ w).max() / np.abs(x @ w).max())
    print(before, after, err)
""")


@pytest.fixture(scope="module")
def big_mln(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from safetensors.numpy import save_file

    from tests.conftest import build_app

    root = tmp_path_factory.mktemp("big")
    pkg = root / "big"
    pkg.mkdir()
    w = np.random.default_rng(0).standard_normal((ROWS, COLS), dtype=np.float32)
    save_file({"w": w}, str(pkg / "w.safetensors"))
    del w
    (pkg / "big.mlir").write_text(
        textwrap.dedent(f"""\
        module @big {{
          util.global private @w = #flow.parameter.named<"big"::"w"> : tensor<{ROWS}x{COLS}xf32>
          func.func @forward(%x: tensor<1x{ROWS}xf32>) -> tensor<1x{COLS}xf32> {{
            %w = util.global.load @w : tensor<{ROWS}x{COLS}xf32>
            %zero = arith.constant 0.0 : f32
            %init = tensor.empty() : tensor<1x{COLS}xf32>
            %acc = linalg.fill ins(%zero : f32) outs(%init : tensor<1x{COLS}xf32>) -> tensor<1x{COLS}xf32>
            %y = linalg.matmul ins(%x, %w : tensor<1x{ROWS}xf32>, tensor<{ROWS}x{COLS}xf32>)
                               outs(%acc : tensor<1x{COLS}xf32>) -> tensor<1x{COLS}xf32>
            return %y : tensor<1x{COLS}xf32>
          }}
        }}
        """)
    )
    (pkg / "plex.toml").write_text(
        '[package]\nname = "big"\n\n[graph.big]\nsource = "big.mlir"\nweights = "w"\n\n'
        '[weights.w]\nsource = "w.safetensors"\nscope = "big"\n'
    )
    # data tiling pinned off: it would pack the weights into copies (docs/platforms.md)
    (root / "app.toml").write_text(
        '[app]\nname = "big"\npackages = ["big"]\n\n'
        '[devices.cpu]\ntarget = "llvm-cpu"\ndata_tiling = false\n'
    )
    return build_app(root / "app.toml", root / "big.mln")


@pytest.mark.slow
def test_256_mib_of_weights_load_and_run_zero_copy(big_mln: Path) -> None:
    assert big_mln.stat().st_size > 256 * 2**20
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(big_mln)], capture_output=True, text=True, check=True
    ).stdout.split()
    before, after, err = int(out[0]), int(out[1]), float(out[2])
    added_mib = (after - before) / 1024
    print(f"anonymous memory added by load + first call: {added_mib:.1f} MiB")
    assert added_mib < 32, f"{added_mib:.1f} MiB of anonymous memory: weights were copied"
    assert err < 1e-4
