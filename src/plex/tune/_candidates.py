"""Candidate builds: one SYNaPSe node per candidate spec, each built by `plex build` in a process
of its own.

A process per candidate, for two reasons verified on IREE 3.13: the tuning-spec option is
process-wide (candidates with different specs could not compile concurrently in one process),
and some configs crash the compiler (a segfault must fail one candidate, not the tuner). The
candidate's build shares the user's build cache, so its weights and import nodes are hits and
only its compile node runs. That process is the isolation, so its build runs its steps in
threads (PLEX_BUILD_ISOLATE=0) rather than starting a worker process of its own.

A candidate build that runs past CANDIDATE_TIMEOUT_S is killed with its process group and tried
once more, then counted as failed for this run: IREE 3.13's compiler can deadlock in the
tuning-spec pass (`MaterializeTuningSpecsPass` waiting forever on the library lock of
`IREECodegenDialect`, seen intermittently under load), and one hung compile must not hang the
tuner. A timeout is transient, unlike a compile error: the tuner drops such a result from the
cache (`TIMED_OUT` marks it), so the next run builds that candidate again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from synapse import Job, NodeContext, keyless, step

CANDIDATE_MLN = "candidate.mln"
BUILD_LOG = "build.log"
FAILED = "failed"
TIMED_OUT = "timed-out"
# A candidate's build compiles one module: seconds to a few minutes on a loaded 2-core machine.
CANDIDATE_TIMEOUT_S = 900
ATTEMPTS = 2


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
    # weight layouts (parameter glob, "nk" | "kn"): myelin.tuning.layout
    layouts: tuple[tuple[str, str], ...] = ()
    # kernel configs: a tuning.json text whose kernel-config entries the kernels node reads
    kernels: str | None = None


def candidate_app(
    app_toml: str,
    folder: Path,
    spec: str | None,
    layouts: tuple[tuple[str, str], ...],
    target: str,
    kernels: str | None = None,
) -> str:
    """The app text that builds with this spec, these weight layouts and these kernel configs:
    a package written into `folder` holds them as one `[tuning.candidate]` table, which the app
    selects."""
    import tomli_w

    if spec is None and not layouts and kernels is None:
        return app_toml
    package = folder / "candidate"
    package.mkdir()
    table: dict = {"target": target}
    if spec is not None:
        (package / "spec.mlir").write_text(spec, encoding="utf-8")
        table["path"] = "spec.mlir"
    if layouts:
        table["layouts"] = dict(layouts)
    if kernels is not None:
        (package / "tuning.json").write_text(kernels, encoding="utf-8")
        table["kernels"] = "tuning.json"
    (package / "plex.toml").write_text(
        tomli_w.dumps({"package": {"name": "plex_tune_candidate"}, "tuning": {"candidate": table}})
    )
    app_text = app_toml.replace("packages = [", f'packages = ["{package}", ', 1)
    return app_text + '\n[myelin]\ntuning = "plex_tune_candidate:candidate"\n'


@step(CandidateJob)
def run_candidate(job: CandidateJob, ctx: NodeContext) -> None:
    with tempfile.TemporaryDirectory(prefix="plex-tune-") as work:
        folder = Path(work)
        app_text = candidate_app(
            job.app_toml, folder, job.spec, job.layouts, job.target, job.kernels
        )
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
        env = {**os.environ, "PYTHONWARNINGS": "default", "PLEX_BUILD_ISOLATE": "0"}
        log, outcome = [], "exit 1"
        for attempt in range(1, ATTEMPTS + 1):
            returncode, output = _run_bounded(command, env, CANDIDATE_TIMEOUT_S)
            log.append(output)
            if returncode == 0:
                outcome = ""
                break
            if returncode is not None:
                outcome = f"exit {returncode}"
                break
            outcome = f"timed out after {CANDIDATE_TIMEOUT_S} s ({attempt} attempts)"
            log.append(f"\n[plex tune] attempt {attempt}: {outcome}; killed\n")
        (ctx.out_dir / BUILD_LOG).write_text("".join(log))
        if outcome:
            # A failed candidate is a result (cached: the same spec fails the same way), not an
            # error that would stop the other candidates' builds.
            (ctx.out_dir / CANDIDATE_MLN).unlink(missing_ok=True)
            (ctx.out_dir / FAILED).write_text(f"{outcome}\n")
            if returncode is None:
                (ctx.out_dir / TIMED_OUT).write_text(f"{outcome}\n")


def _run_bounded(
    command: list[str], env: dict[str, str], timeout_s: float
) -> tuple[int | None, str]:
    """Run `command` in a session of its own; past `timeout_s`, kill the whole group (the
    compiler's threads and any process it started). (returncode or None on timeout, output)."""
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout_s)
        return process.returncode, output
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        return None, output
    except BaseException:  # Ctrl-C: the candidate's compile must not outlive the tuner
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise


def _main(argv: list[str]) -> int:
    """`python -m plex.tune._candidates APP OUT CACHE`: one candidate build."""
    from plex.builder import build

    app, out, cache = argv
    build(Path(app), Path(out), cache_dir=Path(cache), jobs=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
