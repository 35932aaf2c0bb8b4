"""Tuning specs in IREE 3.13: the flag that applies one per target, the marker that proves it
applied, and specs written from (matcher, config) pairs.

Verified against the pinned compiler (docs/tuning.md):
- `--iree-codegen-tuning-spec-path` is honoured on llvm-cpu and ROCm (a missing file is an
  error there) and *silently ignored* on CUDA (only the ROCm target plumbs it in).
- `--iree-codegen-transform-dialect-library` (MaterializeUserConfigs) applies the same file on
  every target, but a missing file is only a message and the compile succeeds untuned.
So each target gets the flag that is both honoured and strict where one exists.

IREE reports nothing about what a spec matched: `compilation_info` is consumed when the config
is materialized, and its strategy-notification flag fires for every function. PLeX therefore
adds its own marker (`plex.tuned`) next to every `compilation_info` a spec sets, and counts the
marked ops in the dumped executable configurations.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from myelin.tuning.gate import LIBRARY_FLAG

MARKER = "plex.tuned"

# target -> the flag that applies a spec file there (see the module docstring)
SPEC_FLAGS: dict[str, str] = {
    "llvm-cpu": "--iree-codegen-tuning-spec-path",
    "rocm": "--iree-codegen-tuning-spec-path",
    "cuda": "--iree-codegen-transform-dialect-library",
    "vulkan-spirv": "--iree-codegen-transform-dialect-library",
    "metal-spirv": "--iree-codegen-transform-dialect-library",
    "vmvx": "--iree-codegen-transform-dialect-library",
}
CONFIG_DUMP_FLAG = "--iree-hal-dump-executable-configurations-to"

_ANNOTATE = re.compile(
    r'^(?P<indent>[ \t]*)transform\.annotate\s+(?P<op>%[\w.$-]+)\s+"compilation_info"\s*=\s*'
    r"%[\w.$-]+\s*:\s*!transform\.any_op\s*,\s*!transform\.any_param[ \t]*$",
    re.MULTILINE,
)
_MARKED_OP = re.compile(rf"\b{re.escape(MARKER)}\b")


def spec_is_process_wide(target: str) -> bool:
    """Whether `target`'s spec flag is one IREE 3.13 takes only on its once-per-process global
    command line (myelin.tuning.gate): a compile with such a spec needs a process of its own."""
    return SPEC_FLAGS.get(target) == LIBRARY_FLAG


def spec_flag(target: str, path: Path) -> str:
    """The compiler flag that applies the spec file at `path` on `target`."""
    return f"{SPEC_FLAGS[target]}={path}"


def instrument_spec(text: str) -> tuple[str, int]:
    """The spec with PLeX's marker set wherever it sets a `compilation_info`, and how many such
    places there are (0: matches cannot be counted; the spec is still applied as written)."""
    count = 0

    def add_marker(m: re.Match[str]) -> str:
        nonlocal count
        count += 1
        marker = f'transform.annotate {m.group("op")} "{MARKER}" : !transform.any_op'
        return f"{m.group(0)}\n{m.group('indent')}{marker}"

    return _ANNOTATE.sub(add_marker, text), count


def count_marked(dump_dir: Path) -> dict[str, int]:
    """Dispatch -> number of ops a spec configured, from a folder written by
    `--iree-hal-dump-executable-configurations-to` (`configured_<module>_<dispatch>.mlir`)."""
    found: dict[str, int] = {}
    if not dump_dir.is_dir():
        return found
    for path in sorted(dump_dir.glob("*.mlir")):
        n = sum(
            1
            for line in path.read_text(errors="replace").splitlines()
            if _MARKED_OP.search(line) and "transform." not in line
        )
        if n:
            found[path.stem.removeprefix("configured_")] = n
    return found


@dataclass(frozen=True)
class ContractionMatch:
    """What a matcher checks about one contraction: operand element types, indexing maps and
    the sizes of its batch/M/N/K dimensions (None: dynamic, which `dims_equal` cannot match, as
    IREE reports a dynamic size as INT64_MIN)."""

    lhs_type: str
    rhs_type: str
    out_type: str
    indexing_maps: tuple[str, ...]
    batch: tuple[int | None, ...]
    m: tuple[int | None, ...]
    n: tuple[int | None, ...]
    k: tuple[int | None, ...]

    @property
    def loops(self) -> int:
        return len(self.batch) + len(self.m) + len(self.n) + len(self.k)

    def describe(self) -> str:
        def dims(ds: tuple[int | None, ...]) -> str:
            return "x".join("?" if d is None else str(d) for d in ds) or "-"

        return (
            f"contraction b={dims(self.batch)} m={dims(self.m)} n={dims(self.n)} "
            f"k={dims(self.k)} {self.lhs_type}*{self.rhs_type}->{self.out_type}"
        )

    def fingerprint(self) -> str:
        """A stable id for this op (shapes, dtypes, layout through the maps)."""
        text = f"{self.describe()} maps={';'.join(self.indexing_maps)}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_json(self) -> dict:
        return {
            "lhs_type": self.lhs_type,
            "rhs_type": self.rhs_type,
            "out_type": self.out_type,
            "indexing_maps": list(self.indexing_maps),
            "batch": list(self.batch),
            "m": list(self.m),
            "n": list(self.n),
            "k": list(self.k),
        }

    @classmethod
    def from_json(cls, data: dict) -> ContractionMatch:
        return cls(
            data["lhs_type"],
            data["rhs_type"],
            data["out_type"],
            tuple(data["indexing_maps"]),
            *(tuple(data[key]) for key in ("batch", "m", "n", "k")),
        )


@dataclass(frozen=True)
class SpecEntry:
    """One matcher and the `#iree_codegen.compilation_info<...>` it applies."""

    name: str  # a symbol-safe name, unique in the spec
    match: ContractionMatch
    compilation_info: str
    comment: str = ""


def _matcher(entry: SpecEntry) -> str:
    m = entry.match
    maps = ", ".join(m.indexing_maps)
    lines = [
        f"  // {entry.comment or m.describe()}",
        f"  transform.named_sequence @match_{entry.name}(%op: !transform.any_op "
        "{transform.readonly}) -> (!transform.any_op, !transform.any_param) {",
        f"    %b, %m, %n, %k = transform.iree.match.contraction %op, lhs_type = {m.lhs_type}, "
        f"rhs_type = {m.rhs_type}, output_type = {m.out_type}, indexing_maps = [{maps}] "
        ": !transform.any_op -> !transform.param<i64>",
    ]
    for var, dims in (("b", m.batch), ("m", m.m), ("n", m.n), ("k", m.k)):
        if all(d is not None for d in dims):
            sizes = ", ".join(str(d) for d in dims)
            lines.append(
                f"    transform.iree.match.dims_equal %{var}, [{sizes}] : !transform.param<i64>"
            )
    lines += [
        f"    %config = transform.param.constant {entry.compilation_info} -> !transform.any_param",
        "    transform.yield %op, %config : !transform.any_op, !transform.any_param",
        "  }",
    ]
    return "\n".join(lines)


def render_spec(entries: Sequence[SpecEntry], header: str = "") -> str:
    """A tuning spec in the default-entrypoint format IREE 3.13 accepts on every target: one
    `foreach_match` over all matchers (two would fail its verifier), each applying its config
    and PLeX's marker."""
    if not entries:
        raise ValueError("a tuning spec needs at least one entry")
    pairs = ", ".join(f"@match_{e.name} -> @apply_op_config" for e in entries)
    body = "\n".join(_matcher(e) for e in entries)
    comment = "".join(f"// {line}\n" for line in header.splitlines())
    return _SPEC_TEMPLATE.format(comment=comment, body=body, pairs=pairs)


_SPEC_TEMPLATE = """{comment}module attributes {{iree_codegen.tuning_spec_with_default_entrypoint, transform.with_named_sequence}} {{
  transform.named_sequence @apply_op_config(%op: !transform.any_op {{transform.readonly}}, %config: !transform.any_param {{transform.readonly}}) {{
    transform.annotate %op "compilation_info" = %config : !transform.any_op, !transform.any_param
    transform.yield
  }}
{body}
  transform.named_sequence @__kernel_config(%variant_op: !transform.any_op {{transform.consumed}}) -> !transform.any_op
      attributes {{iree_codegen.tuning_spec_entrypoint}} {{
    %res = transform.foreach_match in %variant_op {pairs} : (!transform.any_op) -> !transform.any_op
    transform.yield %res : !transform.any_op
  }}
}}
"""  # noqa: E501
