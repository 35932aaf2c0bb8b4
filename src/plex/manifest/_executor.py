"""Where a build's steps run: `[build] executor` and `plex build --executor`, one grammar.

    local            this process's thread pool (the default)
    ray              a Ray cluster this machine already knows (RAY_ADDRESS, or `ray start`)
    ray=ADDRESS      the Ray cluster at ADDRESS (HOST:PORT of its head, or ray://HOST:PORT)
    ray://HOST:PORT  the same as ray=ray://HOST:PORT (Ray Client)

Parsing only: choosing `ray` imports nothing here; the builder loads the Ray executor when it
runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

EXECUTOR_FORMS = "local | ray | ray=ADDRESS | ray://HOST:PORT"


@dataclass(frozen=True)
class ExecutorChoice:
    kind: Literal["local", "ray"]
    address: str | None = None  # ray: None means the cluster Ray finds on its own ("auto")


def parse_executor(text: str) -> ExecutorChoice:
    """The executor `text` names; ValueError (with the accepted forms) for anything else."""
    if text == "local":
        return ExecutorChoice("local")
    if text == "ray":
        return ExecutorChoice("ray")
    if text.startswith("ray=") and text[4:].strip():
        return ExecutorChoice("ray", text[4:].strip())
    if text.startswith("ray://") and len(text) > len("ray://"):
        return ExecutorChoice("ray", text)
    raise ValueError(f"unknown executor {text!r}; expected {EXECUTOR_FORMS}")
