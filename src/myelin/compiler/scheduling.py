"""`[scheduling] favor` as IREE sees it: Stream's partitioning preference, one table.

The compiler C API does not register `--iree-stream-partitioning-favor` (the iree-compile tool
does), so the preference travels as the `stream.partitioning` module attribute, set on the
imported module right before it compiles (`myelin.compiler.pipeline.compile_module`).
"""

from __future__ import annotations

from myelin.errors import CompileError

# favor -> module attributes (name -> attribute text)
_FAVOR_ATTRIBUTES: dict[str, dict[str, str]] = {
    "min-memory": {},  # IREE's default is min-peak-memory
    "max-concurrency": {"stream.partitioning": '#stream.partitioning_config<"max-concurrency">'},
    "debug": {"stream.partitioning": '#stream.partitioning_config<"debug">'},
}
FAVORS: tuple[str, ...] = tuple(_FAVOR_ATTRIBUTES)
DEFAULT_FAVOR = "min-memory"


def favor_attributes(favor: str) -> dict[str, str]:
    """The module attributes that make Stream partition as `favor` asks."""
    try:
        return dict(_FAVOR_ATTRIBUTES[favor])
    except KeyError:
        raise CompileError(
            f"unknown scheduling favor {favor!r}; accepted: {', '.join(FAVORS)}"
        ) from None
