"""The q4 Hopper kernel (myelin.kernels._q4) through IREE on the GPU: every projection of
benchmarks/gpu/q4kernel (built with q4 weights and `kernels = "triton"`; the build sends each one
to the kernel) against numpy on the weights decoded from the .mln's stored parts, in float32.
Tolerance: max error at most 2e-3 of the largest output (the kernel's f16 activations and f32
accumulation against float32; the result is narrowed to float16, 4.9e-4 relative)."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_helpers import artifact

pytestmark = pytest.mark.gpu


def _decoded(mln, key: str) -> np.ndarray:
    from myelin.codecs import choose_layout, decode
    from myelin.mln import MlnReader

    with MlnReader(mln) as reader:
        records = {p["key"]: p for p in reader.manifest["parameters"]}
        data = records[key]
        layout = choose_layout(
            data["codec"],
            tuple(data["shape"]),
            data["dtype"],
            tuple(data["reduce_axes"]),
            tuple(data["order"]),
        )
        parts = []
        for part in layout.parts:
            r = records[key + part.suffix]
            view = reader.section_view(r["section"])[r["offset"] : r["offset"] + r["length"]]
            parts.append(
                np.frombuffer(
                    view, np.dtype(r["storage"]["dtype"].replace("uint4", "uint8"))
                ).copy()
            )
    return decode(parts, layout)  # [out, in], as the torch Linear has it


def test_each_q4_projection_matches_numpy_on_the_decoded_weights(artifacts):
    import myelin

    mln = artifact(artifacts, "q4kernel.mln")
    model = myelin.Instance().load(mln)
    assert model.variant["devices"][0]["driver"] == "cuda"
    up, down = _decoded(mln, "up.weight"), _decoded(mln, "down.weight")
    rng = np.random.default_rng(0)
    cases = [("up8", (8, 1024), up), ("up1", (1, 1024), up), ("down8", (8, 2816), down)]
    cases.append(("down_b8", (8, 1, 2816), down))
    with model.session() as s:
        for name, shape, w in cases:
            x = rng.standard_normal(shape).astype(np.float16)
            want = x.astype(np.float32) @ w.T.astype(np.float32)
            got = np.asarray(s.call(name, x), np.float32)
            err = np.abs(got - want).max() / np.abs(want).max()
            print(f"{name}: max error / max |out| = {err:.2e}")
            assert err <= 2e-3, f"{name}: {err:.2e}"
