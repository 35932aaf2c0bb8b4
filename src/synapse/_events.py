"""Events: what the executor tells progress displays and tools while a plan runs."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

EventKind = Literal["plan", "start", "finish", "log", "error", "cache", "done"]


@dataclass(frozen=True)
class Event:
    """One thing that happened during a run.

    kinds:
      plan    once, before anything runs: `total` nodes, `hits` already in the cache
      cache   a node was found in the cache (status "hit"), or a corrupt entry was discarded
      start   a node's action started (`heavy` says whether it is a compile-class node)
      log     a message from a running action (`NodeContext.log`)
      finish  a node's action ended: status "built" or "cancelled", `seconds` it took
      error   a node's action raised: status "failed", `message` is the error
      done    once, at the end of a run (also after a failure or interrupt); `status` is
              "ok", "failed" or "interrupted"
    `done`/`total`/`hits` are the run's counters at the time of the event. `worker` names the
    machine and process a step ran on when it did not run in this process (`RayExecutor`).
    """

    kind: EventKind
    node_id: str = ""
    message: str = ""
    time: float = field(default_factory=time.time)
    status: str = ""
    key: str = ""
    done: int = 0
    total: int = 0
    hits: int = 0
    label: str = ""
    heavy: bool = False
    seconds: float = 0.0
    worker: str = ""  # where the step ran, for executors that run steps elsewhere (Ray)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


EventSink = Callable[[Event], None]
