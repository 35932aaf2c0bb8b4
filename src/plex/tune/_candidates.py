"""Candidate builds: one SYNaPSe node per candidate spec, each built by `plex build` in a process
of its own.

A process per candidate, for two reasons verified on IREE 3.13: the tuning-spec option is
process-wide (candidates with different specs could not compile concurrently in one process),
and some configs crash the compiler (a segfault must fail one candidate, not the tuner). The
candidate's build shares the user's build cache, so its weights and import nodes are hits and
only its compile node runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from synapse import Job, NodeContext, keyless, step

CANDIDATE_MLN = "candidate.mln"
BUILD_LOG = "build.log"
FAILED = "failed"


@dataclass(frozen=True)
class CandidateJob(Job):
    """Build the app restricted to the tuned device, with one candidate spec."""

    kind = "tune-candidate"
    step_module = "plex.tune._candidates"
    app_toml: str  # the derived app (absolute package paths, one variant), without the spec
    spec: str | None  # the spec text; None: the untuned reference build
    target: str
    packages: tuple[str, ...]  # fingerprints of the app's packages: their content is the model
    cache_dir: Path = keyless("the inner build's cache; a place, not an input")


@step(CandidateJob)
def run_candidate(job: CandidateJob, ctx: NodeContext) -> None:
    with tempfile.TemporaryDirectory(prefix="plex-tune-") as work:
        folder = Path(work)
        app_text = job.app_toml
        if job.spec is not None:
            package = folder / "candidate"
            package.mkdir()
            (package / "spec.mlir").write_text(job.spec, encoding="utf-8")
            (package / "plex.toml").write_text(
                '[package]\nname = "plex_tune_candidate"\n\n[tuning.candidate]\n'
                f'path = "spec.mlir"\ntarget = "{job.target}"\n'
            )
            app_text = app_text.replace("packages = [", f'packages = ["{package}", ', 1)
            app_text += '\n[myelin]\ntuning = "plex_tune_candidate:candidate"\n'
        app = folder / "app.toml"
        app.write_text(app_text, encoding="utf-8")
        command = [
            sys.executable,
            "-m",
            "plex.tune._candidates",
            str(app),
            str(ctx.out_dir / CANDIDATE_MLN),
            str(job.cache_dir),
        ]
        env = {**os.environ, "PYTHONWARNINGS": "default"}
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        (ctx.out_dir / BUILD_LOG).write_text(done.stdout + done.stderr)
        if done.returncode != 0:
            # A failed candidate is a result (cached: the same spec fails the same way), not an
            # error that would stop the other candidates' builds.
            (ctx.out_dir / CANDIDATE_MLN).unlink(missing_ok=True)
            (ctx.out_dir / FAILED).write_text(f"exit {done.returncode}\n")


def _main(argv: list[str]) -> int:
    """`python -m plex.tune._candidates APP OUT CACHE`: one candidate build."""
    from plex.builder import build

    app, out, cache = argv
    build(Path(app), Path(out), cache_dir=Path(cache), jobs=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
