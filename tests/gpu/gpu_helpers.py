"""Helpers of the GPU tests (conftest.py says how they run): CUDA probe, artifacts, tolerance."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
DEFAULT_ARTIFACTS = REPO / "benchmarks" / "gpu" / "artifacts"


def cuda_unavailable() -> str | None:
    """None when IREE's CUDA driver has a device here, else why not (for the skip reason)."""
    import iree.runtime as rt

    if "cuda" not in rt.query_available_drivers():
        return "this IREE runtime has no CUDA driver"
    try:
        driver = rt.get_driver("cuda")
        if not driver.query_available_devices():
            return "IREE's CUDA driver finds no GPU"
    except Exception as e:  # a missing libcuda.so is a RuntimeError from the driver
        return f"no CUDA here: {str(e).strip().splitlines()[0]}"
    return None


PREPARE = "python benchmarks/gpu/prepare.py"


def artifact(folder: Path, name: str, build: str = PREPARE) -> Path:
    """`folder/name`, or a skip naming the command that builds it (`build`)."""
    path = folder / name
    if not path.is_file():
        pytest.skip(f"{path} is missing: build it with `{build}`")
    return path


def assert_close_fp16(got: np.ndarray, want: np.ndarray, what: str, rtol: float = 2e-2) -> float:
    """Max error relative to the largest reference magnitude, within float16 tolerance."""
    got = np.asarray(got, np.float32)
    want = np.asarray(want, np.float32)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    error = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-6))
    assert error <= rtol, f"{what}: relative error {error:.3e} > {rtol}"
    return error
