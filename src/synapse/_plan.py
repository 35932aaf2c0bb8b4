"""Nodes and plans: what the build is made of. Pure data; nothing here runs a step (file
contents are read only to fingerprint a job's `InputFile` fields)."""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from synapse._job import Job, Output, job_inputs, job_outputs
from synapse.errors import PlanError


@dataclass(frozen=True, eq=False)
class Node:
    """One unit of build work: an id and a job (synapse._job), plus scheduling hints.

    The job is the whole description of the work: its kind, its dependencies (its `Output`
    fields) and its fingerprints (`inputs`, one per keyed field) all come from it, so the cache
    key cannot miss anything the step reads.
    """

    id: str
    job: Job
    label: str = ""
    cacheable: bool = True  # False: always runs (e.g. the final compose writing the user's file)
    heavy: bool = False  # e.g. compiles; progress shows these while they run
    # Estimated peak temporary memory of the step, in bytes (0: negligible or unknown). The
    # executor runs such nodes together only while their estimates fit its memory budget. A
    # scheduling hint, not part of the cache key.
    memory: int = 0
    # Run the step in a worker process (synapse._worker) so that a crash in native code or a
    # sys.exit is one error naming the node, not the end of the build process. Not part of the
    # key: where a step runs does not change what it writes.
    isolate: bool = False
    # With `isolate`: the step sets process-wide state that no other step may inherit or meet
    # (IREE's once-per-process global command line), so it runs in a worker started for it and
    # retired after it. Not part of the key either.
    fresh_process: bool = False
    inputs: Mapping[str, str] = field(init=False, compare=False, hash=False, repr=False)
    deps: tuple[str, ...] = field(init=False, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        if not self.id or not isinstance(self.id, str):
            raise PlanError(f"node id must be a non-empty string, got {self.id!r}")
        if not isinstance(self.job, Job):
            raise PlanError(
                f"node '{self.id}': its job must be a synapse.Job dataclass, "
                f"got {type(self.job).__name__}"
            )
        object.__setattr__(self, "inputs", MappingProxyType(job_inputs(self.job)))
        object.__setattr__(self, "deps", job_outputs(self.job))
        if not isinstance(self.memory, int) or self.memory < 0:
            raise PlanError(
                f"node '{self.id}': memory must be a byte count >= 0, got {self.memory!r}"
            )

    @property
    def kind(self) -> str:
        return self.job.kind


@dataclass
class NodeContext:
    """What a step sees while it runs.

    `out_dir` is an empty folder owned by this run of the step; it may be moved into the cache
    afterwards, so outputs must not embed its absolute path. `cancelled` is set when the build is
    stopping (another node failed, or Ctrl-C): long steps may poll it and raise; a step that
    returns after it was set has its outputs discarded.
    """

    node: Node
    out_dir: Path
    dep_outputs: Mapping[str, Path]
    cancelled: threading.Event
    key: str = ""
    _log: Callable[[str], None] | None = field(default=None, repr=False)

    def output(self, ref: Output) -> Path:
        """The output folder of the dependency `ref` names."""
        return self.dep_outputs[ref.node_id]

    def log(self, msg: str) -> None:
        """Report a progress message for this node (becomes a "log" event)."""
        if self._log is not None:
            self._log(msg)


class Plan:
    """A validated DAG of nodes: unique ids, known dependencies, no cycles."""

    def __init__(self, nodes: Iterable[Node]) -> None:
        by_id: dict[str, Node] = {}
        for node in nodes:
            if node.id in by_id:
                raise PlanError(f"duplicate node id '{node.id}'")
            by_id[node.id] = node
        for node in by_id.values():
            for dep in node.deps:
                if dep not in by_id:
                    raise PlanError(f"node '{node.id}' depends on unknown node '{dep}'")
        self.nodes: dict[str, Node] = by_id
        self._order = _topological_order(by_id)
        dependents: dict[str, list[str]] = {node_id: [] for node_id in by_id}
        for node in by_id.values():
            for dep in dict.fromkeys(node.deps):
                dependents[dep].append(node.id)
        self._dependents = MappingProxyType({k: tuple(v) for k, v in dependents.items()})

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self):
        return (self.nodes[node_id] for node_id in self._order)

    def topological_order(self) -> list[str]:
        """Node ids, every node after its dependencies; ties keep the order nodes were given."""
        return list(self._order)

    def dependents(self, node_id: str) -> tuple[str, ...]:
        """Ids of the nodes that list `node_id` as a direct dependency."""
        return self._dependents[node_id]

    def describe(self) -> str:
        """A text table of the plan in execution order, for `plex build --plan`."""
        headers = ("node", "kind", "flags", "deps")
        rows = [headers, *((n.id, n.kind, _flags(n), ", ".join(n.deps) or "-") for n in self)]
        widths = [max(len(row[i]) for row in rows) for i in range(len(headers))]
        count = len(rows) - 1
        lines = [f"plan: {count} node{'' if count == 1 else 's'}"]
        for row in rows:
            cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
            lines.append("  " + "  ".join(cells).rstrip())
        return "\n".join(lines)


def _flags(node: Node) -> str:
    flags = [name for name, on in (("heavy", node.heavy), ("uncached", not node.cacheable)) if on]
    if node.memory:
        flags.append(f"mem={_size(node.memory)}")
    return ",".join(flags) or "-"


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}GiB"


def _topological_order(nodes: Mapping[str, Node]) -> list[str]:
    """Kahn's algorithm, stable in the given order; a leftover means a cycle, which we name."""
    position = {node_id: i for i, node_id in enumerate(nodes)}
    waiting = {node_id: len(set(node.deps)) for node_id, node in nodes.items()}
    users: dict[str, list[str]] = {node_id: [] for node_id in nodes}
    for node in nodes.values():
        for dep in set(node.deps):
            users[dep].append(node.id)
    ready = [position[i] for i, n in waiting.items() if n == 0]
    heapq.heapify(ready)
    ids = list(nodes)
    order: list[str] = []
    while ready:
        node_id = ids[heapq.heappop(ready)]
        order.append(node_id)
        for user in users[node_id]:
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, position[user])
    if len(order) != len(nodes):
        cycle = _find_cycle(nodes, {i for i, n in waiting.items() if n > 0})
        raise PlanError(f"dependency cycle: {' -> '.join(cycle)}")
    return order


def _find_cycle(nodes: Mapping[str, Node], candidates: set[str]) -> list[str]:
    """Walk dependencies from a node left in a cycle until a node repeats."""
    node_id = next(i for i in nodes if i in candidates)
    path: list[str] = []
    seen: dict[str, int] = {}
    while node_id not in seen:
        seen[node_id] = len(path)
        path.append(node_id)
        node_id = next(d for d in nodes[node_id].deps if d in candidates)
    # Print in dependency-user order: "a -> b" reads "a needs b".
    return [*path[seen[node_id] :], node_id]
