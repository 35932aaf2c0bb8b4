"""`plex build`: manifest -> plan (pure data) -> SYNaPSe executor -> one .mln.

The plan's nodes (weights, import, compile per variant, compose) and what each fingerprint covers
are in `plex.build.plan`; the node actions are in `plex.build.steps`; the file assembly is in
`plex.build.compose`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from plex.build.plan import BuildRequest, plan_build
from plex.build.versions import fingerprint_salt
from plex.errors import BuildError, PlexError
from plex.manifest import AppSpec, load_app, write_lock
from synapse import BuildFailed, Cache, Event, Executor, Plan, RunResult

__all__ = ["BuildResult", "build", "default_cache_dir", "plan_for"]


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


def plan_for(app_path: Path, output: Path) -> tuple[AppSpec, Plan]:
    app = load_app(app_path)
    return app, plan_build(app, BuildRequest(output=output.resolve()))


def build(
    app_path: Path,
    output: Path,
    *,
    jobs: int | None = None,
    cache_dir: Path | None = None,
    use_cache: bool = True,
    on_event: Callable[[Event], None] | None = None,
) -> BuildResult:
    """Build `app_path` into `output`. Nothing is written at `output` unless the build succeeds."""
    start = time.perf_counter()
    app, plan = plan_for(app_path, output)
    cache = Cache(cache_dir or default_cache_dir(app)) if use_cache else None
    executor = Executor(
        cache, jobs=jobs or app.build.jobs, salt=fingerprint_salt(), on_event=on_event
    )
    try:
        results = executor.run(plan)
    except BuildFailed as e:
        cause = e.__cause__
        if isinstance(cause, PlexError):
            raise cause from None
        raise BuildError(f"{e}") from e
    lock_path = write_lock(app)
    return BuildResult(app, output, results, time.perf_counter() - start, lock_path)
