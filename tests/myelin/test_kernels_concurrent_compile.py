"""Kernel nodes compile Triton kernels in threads at once: every compile succeeds, cold, and gives
the bytes a compile on its own gives.

Triton reads its cache folder from a process-global knob; PLeX used to swap that folder around
each compile, so concurrent kernel nodes removed one another's folder mid-compile (a cold build
failed 2 times in 3 with `No such file or directory: .../plex_matmul_tma.source`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton", reason="Triton is the `kernels` extra (build time only)")

# One process = one cold Triton cache: it compiles six kernels in three threads and prints each
# cubin's digest, then compiles the first again on its own (now warm) to compare.
CONCURRENT_COMPILES = """
import hashlib
from concurrent.futures import ThreadPoolExecutor
from myelin.kernels._triton import MatmulConfig, compile_matmul

configs = [
    MatmulConfig("f16", "f16", transposed, block_n=block_n, num_stages=stages)
    for transposed in (True, False) for block_n, stages in ((128, 3), (256, 3), (128, 4))
]
with ThreadPoolExecutor(3) as pool:
    cubins = list(pool.map(lambda c: compile_matmul(c).cubin, configs))
for cubin in cubins:
    print(hashlib.sha256(cubin).hexdigest())
"""

SERIAL_COMPILES = """
import hashlib
from myelin.kernels._triton import MatmulConfig, compile_matmul

for transposed in (True, False):
    for block_n, stages in ((128, 3), (256, 3), (128, 4)):
        cubin = compile_matmul(MatmulConfig("f16", "f16", transposed, block_n=block_n, num_stages=stages)).cubin
        print(hashlib.sha256(cubin).hexdigest())
"""


def _digests(script: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_CACHE_DIR"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done.stdout.split()


@pytest.mark.slow
def test_concurrent_cold_kernel_compiles_always_succeed_with_the_serial_bytes():
    serial = _digests(SERIAL_COMPILES)
    assert len(serial) == 6 and len(set(serial)) == 6
    for _ in range(3):
        assert _digests(CONCURRENT_COMPILES) == serial
