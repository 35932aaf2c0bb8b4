"""Build orchestration: manifest -> plan (jobs, pure data) -> SYNaPSe executor -> one .mln.

`plan` turns the resolved app into nodes holding jobs (`jobs`); the executor runs each job's
registered step (`steps`: weights, import, encode, compile; `link`: decisions from their
records; `compose`: packing). This module only wires them together. Named `builder`, not
`build`, so that tools and people do not take it for build output.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from myelin.compiler.phases import RESUMABLE_PHASES, read_phase_file
from myelin.errors import CompileError
from plex.builder.plan import BuildRequest, plan_build
from plex.builder.versions import fingerprint_salt
from plex.errors import BuildError, PlexError
from plex.extras import require_for_app
from plex.manifest import AppSpec, load_app, parse_executor, write_lock
from synapse import BuildFailed, Cache, Event, Executor, Plan, RunResult, SynapseError
from synapse.errors import DiskFull

__all__ = [
    "BuildResult",
    "build",
    "check_phase",
    "default_cache_dir",
    "make_executor",
    "plan_for",
]


def default_cache_dir(app: AppSpec | None = None) -> Path:
    """`[build] cache`, else $PLEX_CACHE_DIR, else the user cache folder."""
    if app is not None and app.build.cache is not None:
        return app.build.cache
    env = os.environ.get("PLEX_CACHE_DIR")
    if env:
        return Path(env)
    return Path(platformdirs.user_cache_dir("plex")) / "synapse"


@dataclass
class BuildResult:
    app: AppSpec
    output: Path
    results: RunResult
    seconds: float
    lock_path: Path

    @property
    def hits(self) -> int:
        return sum(1 for r in self.results.values() if r.status == "hit")

    @property
    def built(self) -> int:
        return sum(1 for r in self.results.values() if r.status == "built")


def check_phase(phase: str | None) -> None:
    """Refuse a phase name `--compile-to` cannot stop at, listing the ones it can."""
    if phase is not None and phase not in RESUMABLE_PHASES:
        raise BuildError(f"unknown compile phase {phase!r}; phases: {', '.join(RESUMABLE_PHASES)}")


def plan_for(
    app_path: Path,
    output: Path,
    *,
    dump_phases: Path | None = None,
    compile_to: str | None = None,
    resume_from: Sequence[Path] = (),
    strict: bool = False,
) -> tuple[AppSpec, Plan]:
    """Load the app and plan its build (see `build` for the options); runs nothing."""
    check_phase(compile_to)
    try:
        resume = tuple(read_phase_file(Path(path).resolve()) for path in resume_from)
    except CompileError as e:
        raise BuildError(str(e)) from None
    app = load_app(app_path)
    request = BuildRequest(
        output=output.resolve(),
        dump_phases=dump_phases.resolve() if dump_phases is not None else None,
        compile_to=compile_to,
        resume=resume,
        strict=strict,
    )
    return app, plan_build(app, request)


def make_executor(
    spec: str,
    cache: Cache | None,
    *,
    jobs: int,
    salt: str,
    on_event: Callable[[Event], None] | None,
    memory_budget: int | None,
) -> Executor:
    """The SYNaPSe executor `spec` names (see plex.manifest's executor grammar). Ray is imported
    only for a Ray executor, and only here. On Ray, builders share the cache folder
    $PLEX_CLUSTER_CACHE on the head node (default ~/.cache/synapse/cluster; "none": no sharing)."""
    try:
        choice = parse_executor(spec)
    except ValueError as e:
        raise BuildError(str(e)) from None
    if choice.kind == "local":
        return Executor(
            cache,
            jobs=jobs,
            salt=salt,
            on_event=on_event,
            memory_budget=memory_budget,
            # nodes the plan isolates run in worker processes unless this debugging switch
            # says otherwise (a step in a thread can be stepped through with pdb)
            isolate=os.environ.get("PLEX_BUILD_ISOLATE", "1") != "0",
        )
    try:
        from synapse._ray import DEFAULT_SHARED_CACHE, RayExecutor
    except ImportError:
        raise BuildError(
            "the ray executor needs Ray: pip install -e '.[ray]' (ray==2.60.0)"
        ) from None
    # jobs is per machine; a cluster queues tasks by their resources, so it is not passed.
    shared = os.environ.get("PLEX_CLUSTER_CACHE", DEFAULT_SHARED_CACHE)
    return RayExecutor(
        cache,
        salt=salt,
        on_event=on_event,
        address=choice.address,
        shared_cache=None if shared == "none" else shared,
    )


def build(
    app_path: Path,
    output: Path,
    *,
    jobs: int | None = None,
    cache_dir: Path | None = None,
    use_cache: bool = True,
    on_event: Callable[[Event], None] | None = None,
    dump_phases: Path | None = None,
    compile_to: str | None = None,
    resume_from: Sequence[Path] = (),
    strict: bool = False,
    executor: str | None = None,
) -> BuildResult:
    """Build `app_path` into `output`. Nothing is written at `output` unless the build succeeds.

    dump_phases: also write every module's IR at every compile phase under this folder.
    compile_to: stop compiling after this phase and write the IR to `output` (a folder, or one
        `.mlir` file) instead of a .mln.
    resume_from: phase files (from `dump_phases`/`compile_to`, maybe edited) to compile their
        module from, instead of from the graph source; a file whose recorded phase, module,
        flags or source do not match is refused.
    strict: a weight decode that IREE did not fuse into its consumer (the codec check) fails the
        build instead of warning.
    executor: where steps run (`local`, `ray`, `ray=ADDRESS`; default `[build] executor`).
        On Ray, cache misses run as tasks on the cluster and the .mln is written here.
    Weights steps run in batches whose temporary memory fits `[build] temp_memory`.
    """
    start = time.perf_counter()
    app, plan = plan_for(
        app_path,
        output,
        dump_phases=dump_phases,
        compile_to=compile_to,
        resume_from=resume_from,
        strict=strict,
    )
    require_for_app(app, executor)  # a missing extra fails now, not after the other steps ran
    cache = Cache(cache_dir or default_cache_dir(app)) if use_cache else None
    runner = make_executor(
        executor or app.build.executor,
        cache,
        jobs=jobs or app.build.jobs,
        salt=fingerprint_salt(),
        on_event=on_event,
        memory_budget=app.build.temp_memory,
    )
    try:
        results = runner.run(plan)
    except BuildFailed as e:
        cause = e.__cause__
        if isinstance(cause, PlexError):
            raise cause from None
        if isinstance(cause, DiskFull):
            raise BuildError(
                f"{cause} (`plex cache gc --max-size 2GiB` shrinks it; PLEX_CACHE_DIR moves it)"
            ) from e
        raise BuildError(f"{e}") from e
    except SynapseError as e:  # e.g. the Ray cluster cannot be reached
        raise BuildError(str(e)) from e
    lock_path = write_lock(app)
    return BuildResult(app, output, results, time.perf_counter() - start, lock_path)
