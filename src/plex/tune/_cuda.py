"""CUDA candidates, compiled here for timing on a GPU machine that has only the runtime.

Each candidate is one SYNaPSe node whose step runs `iree-compile` in a process of its own: the
flag that applies a spec on CUDA (`--iree-codegen-transform-dialect-library`) is a global
command-line option, not a session one, and some configs (NV_WMMA + VectorDistribute) crash
the compiler. A failed compile is recorded (cached) as a result, not raised.
"""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from myelin.tuning.gate import SINGLE_THREADED_FLAG
from myelin.tuning.smt import iree_compile
from myelin.tuning.spec import CONFIG_DUMP_FLAG, count_marked, instrument_spec, spec_flag
from synapse import Job, NodeContext, step

CANDIDATE_VMFB = "candidate.vmfb"
FAILED = "failed"
MATCHED = "matched.txt"


@dataclass(frozen=True)
class CudaCandidateJob(Job):
    kind = "tune-cuda-candidate"
    step_module = "plex.tune._cuda"
    source: str  # the module's MLIR text
    spec: str | None  # None: IREE's default config (the reference)
    flags: tuple[str, ...]  # target flags


@step(CudaCandidateJob)
def run_cuda_candidate(job: CudaCandidateJob, ctx: NodeContext) -> None:
    compiler = iree_compile()
    with tempfile.TemporaryDirectory(prefix="plex-cuda-") as work:
        folder = Path(work)
        (folder / "model.mlir").write_text(job.source)
        command = [
            compiler,
            str(folder / "model.mlir"),
            *job.flags,
            "-o",
            str(ctx.out_dir / CANDIDATE_VMFB),
        ]
        if job.spec is not None:
            text, _ = instrument_spec(job.spec)
            (folder / "spec.mlir").write_text(text)
            command += [
                spec_flag("cuda", folder / "spec.mlir"),
                f"{CONFIG_DUMP_FLAG}={folder / 'conf'}",
                SINGLE_THREADED_FLAG,  # a spec's compile can deadlock otherwise
            ]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            (ctx.out_dir / CANDIDATE_VMFB).unlink(missing_ok=True)
            (ctx.out_dir / FAILED).write_text(done.stderr[-4000:])
            return
        matched = sum(count_marked(folder / "conf").values()) if job.spec is not None else 0
        (ctx.out_dir / MATCHED).write_text(f"{matched}\n")
