"""Jobs for the process-isolation tests: module-level, so that a worker process imports this
module by name (`step_module`) and finds the same steps."""

from __future__ import annotations

import ctypes
import os
import sys
import time
import warnings
from dataclasses import dataclass

from synapse import Job, NodeContext, step


@dataclass(frozen=True)
class WorkJob(Job):
    """Writes the worker's pid, after doing `what`: "ok", "segfault", "exit", "os_exit",
    "raise", "sleep", "warn" or "log"."""

    kind = "work"
    step_module = "tests.synapse.isolation_helpers"
    what: str
    tag: str = ""


@step(WorkJob)
def run_work(job: WorkJob, ctx: NodeContext) -> None:
    if job.what == "segfault":
        ctypes.string_at(0)  # reads address 0: SIGSEGV, as a buggy extension would
    elif job.what == "exit":
        sys.exit(3)
    elif job.what == "os_exit":
        os._exit(5)
    elif job.what == "raise":
        raise ValueError(f"bad input in {job.tag}")
    elif job.what == "sleep":
        time.sleep(60)
    elif job.what == "warn":
        warnings.warn(f"careful with {job.tag}", UserWarning, stacklevel=1)
    elif job.what == "log":
        ctx.log(f"half way through {job.tag}")
    (ctx.out_dir / "pid").write_text(str(os.getpid()))
