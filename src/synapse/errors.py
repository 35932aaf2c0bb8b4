"""Error types of SYNaPSe.

Each says what went wrong and where; a caller (the PLeX CLI) turns them into one line and an exit
code. `BuildFailed` keeps the action's own exception as `__cause__` and as `.error`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from synapse._executor import NodeResult


class SynapseError(Exception):
    """Base of every error SYNaPSe raises on purpose."""


class PlanError(SynapseError, ValueError):
    """The plan is malformed: a duplicate node id, a dependency on an unknown node, or a cycle."""


class CacheError(SynapseError):
    """The cache cannot be used: unwritable, locked for too long, or an entry cannot be stored."""


class BuildFailed(SynapseError):
    """A node's action raised; the build stopped after the nodes already running finished.

    `node_id` names the failed node, `error` is the action's exception (also `__cause__`), and
    `results` holds what every node of the plan ended as (hit, built, failed, cancelled, skipped).
    """

    def __init__(
        self,
        node_id: str,
        error: BaseException,
        results: Mapping[str, NodeResult] | None = None,
    ) -> None:
        self.node_id = node_id
        self.error = error
        self.results = dict(results or {})
        super().__init__(f"build node '{node_id}' failed: {type(error).__name__}: {error}")


class StepCrashed(SynapseError):
    """A step run in a worker process (`Node(isolate=True)`) did not return: the process died
    (a signal such as SIGSEGV, or an exit), or the step called `sys.exit`. The build goes on
    being one clear error naming the node instead of the whole process dying silently."""


class DiskFull(CacheError):
    """No space left on the device a step or the cache was writing to. `path` is where."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path
