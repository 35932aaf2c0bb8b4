"""Small real plans for the SYNaPSe tests (importable by spawned worker processes too)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path

from synapse import Node, NodeContext, Plan, bytes_digest


class Recorder:
    """Thread-safe log of which actions ran, when, and how many ran at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.runs: list[str] = []
        self.spans: dict[str, tuple[float, float]] = {}
        self.active = 0
        self.max_active = 0

    def __enter__(self) -> Recorder:
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.active -= 1

    def record(self, node_id: str, start: float, end: float) -> None:
        with self._lock:
            self.runs.append(node_id)
            self.spans[node_id] = (start, end)


def concat_action(text: str, recorder: Recorder | None = None, sleep_s: float = 0.0):
    """An action whose output `out.txt` is its text plus its dependencies' outputs."""

    def action(ctx: NodeContext) -> None:
        start = time.monotonic()
        if recorder is not None:
            recorder.__enter__()
        try:
            time.sleep(sleep_s)
            parts = [text] + [(ctx.dep_outputs[d] / "out.txt").read_text() for d in ctx.node.deps]
            (ctx.out_dir / "out.txt").write_text("(" + " ".join(parts) + ")")
        finally:
            if recorder is not None:
                recorder.__exit__()
                recorder.record(ctx.node.id, start, time.monotonic())

    return action


def diamond_plan(
    sources: Mapping[str, str] | None = None,
    recorder: Recorder | None = None,
    sleep_s: float = 0.0,
) -> Plan:
    """resolve -> (import, weights) -> compile -> compose (uncached), like a PLeX build.

    `sources` overrides the text (and so the input fingerprint) of any node.
    """
    text = {"resolve": "r", "import": "i", "weights": "w", "compile": "c", "compose": "x"}
    text.update(sources or {})

    def node(node_id: str, deps: tuple[str, ...] = (), **kw: object) -> Node:
        return Node(
            node_id,
            kind=node_id,
            action=concat_action(text[node_id], recorder, sleep_s),
            deps=deps,
            inputs={"source": bytes_digest(text[node_id].encode())},
            **kw,
        )

    return Plan(
        [
            node("resolve"),
            node("import", ("resolve",)),
            node("weights", ("resolve",)),
            node("compile", ("import", "weights"), heavy=True),
            node("compose", ("compile",), cacheable=False),
        ]
    )


def run_diamond_in_process(cache_root: str, barrier, queue) -> None:
    """Target of a spawned process: wait for the sibling process, then build the diamond."""
    from synapse import Cache, Executor

    barrier.wait(timeout=60)
    results = Executor(Cache(Path(cache_root)), jobs=2, salt="test").run(diamond_plan(sleep_s=0.05))
    queue.put(
        {node_id: (r.status, (r.out_dir / "out.txt").read_text()) for node_id, r in results.items()}
    )
