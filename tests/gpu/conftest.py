"""GPU tests: they run on a machine with an NVIDIA GPU and skip, with the reason, everywhere else.

They need only iree-base-runtime, numpy and src/ on PYTHONPATH (the GPU machine has no IREE
compiler): the .mln files are built beforehand on a build machine by
`python benchmarks/gpu/prepare.py` into benchmarks/gpu/artifacts (or $PLEX_GPU_ARTIFACTS), and
`benchmarks/gpu/run_on_device.sh` runs these tests there. Each test compares the CUDA variant with
the CPU variant of the same .mln (or with numpy / torch), at float16-level tolerance.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from gpu_helpers import DEFAULT_ARTIFACTS, cuda_unavailable


@pytest.fixture(scope="session")
def cuda() -> None:
    reason = cuda_unavailable()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def artifacts(cuda) -> Path:
    """The folder of prebuilt .mln files: $PLEX_GPU_ARTIFACTS or benchmarks/gpu/artifacts."""
    return Path(os.environ.get("PLEX_GPU_ARTIFACTS", DEFAULT_ARTIFACTS))
