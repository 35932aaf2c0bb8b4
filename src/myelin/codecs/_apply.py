"""Encode one imported graph: choose a codec per parameter, rewrite the IR, encode the data.

The input is the graph at IREE's `input` phase (any frontend: torch, ONNX, JAX, MLIR) and the
raw values of the parameters it reads; the output is the same graph reading the stored parts
instead, plus those parts' bytes and one record per parameter (what it got and why).
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import numpy as np

from myelin.codecs._contract import NO_CODEC, Layout, choose_layout, encode
from myelin.codecs._policy import Choice, CodecPolicy, choose
from myelin.errors import CompileError

# Parameters encode in parallel threads (numpy releases the GIL): q4's search is seconds a matrix.
_ENCODE_WORKERS = min(4, os.cpu_count() or 1)
# The session only hosts the rewrite; no target-specific pass runs.
_SESSION_FLAGS = (
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
)


@dataclass(frozen=True)
class ParameterInput:
    """A parameter the imported graph reads (as `myelin.compiler.parameters.ParameterRef`)."""

    scope: str
    key: str
    dtype: str
    shape: tuple[int, ...]
    global_name: str


@dataclass
class StoredTensor:
    """One part as the .mln stores it: `data` holds its exact bytes (q4 data as packed uint8)."""

    scope: str
    key: str
    data: np.ndarray


@dataclass
class ParameterRecord:
    """What one parameter got, for the build record, `plex inspect` and the check."""

    scope: str
    key: str
    codec: str  # the codec actually applied ("fp32" when kept)
    reason: str  # why: the rule that chose it, or why a requested codec did not apply
    dtype: str  # logical
    shape: list[int]  # logical
    layout: str = "dense"
    reduce_axes: list[int] = field(default_factory=list)
    order: list[int] = field(default_factory=list)  # data axes in storage order ([]: logical)
    uses: list[str] = field(default_factory=list)
    parts: list[dict] = field(default_factory=list)  # key, role, dtype, shape, nbytes (storage)

    @property
    def stored_bytes(self) -> int:
        return sum(p["nbytes"] for p in self.parts)

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class EncodedGraph:
    module_bytecode: bytes
    stored: list[StoredTensor]
    records: list[ParameterRecord]  # every parameter the graph reads, encoded or not
    warnings: list[str]


def encode_graph(
    module_bytecode: bytes,
    parameters: list[ParameterInput],
    load_value: Callable[[ParameterInput], np.ndarray | None],
    policy: CodecPolicy,
    *,
    what: str = "graph",
) -> EncodedGraph:
    """Apply `policy` to the graph's parameters. `load_value` returns a parameter's array (None
    when its data is not known here; such a parameter is left as it is)."""

    from myelin.codecs._rewrite import rewrite
    from myelin.codecs._uses import analyze, reduce_axes_of, storage_order_of
    from myelin.compiler.session import CompilerSession

    choices: dict[ParameterInput, Choice] = {
        p: choose(p.scope, p.key, p.dtype, p.shape, policy) for p in parameters
    }
    records = {p: _kept(p, choices[p].reason) for p in parameters}
    wanted = [p for p in parameters if choices[p].codec != NO_CODEC]
    problems: dict[tuple[str, str], list[str]] = {}  # (codec, reason) -> parameters
    stored: list[StoredTensor] = []
    taken = {(p.scope, p.key) for p in parameters}
    replaced: dict[tuple[str, str], list[str]] = {}  # (codec, instead) -> parameters
    for p in parameters:
        if choices[p].not_applied:  # a device cannot decode it: one build note per codec
            key = (choices[p].not_applied, choices[p].codec)
            replaced.setdefault(key, []).append(f"{p.scope}::{p.key}")

    # Encoding is numpy work that releases the GIL (q4's search is seconds per matrix): it runs
    # in threads while this loop rewrites the IR, which must stay on one thread.
    pending: list[tuple[ParameterInput, Layout, Future]] = []
    with (
        ThreadPoolExecutor(_ENCODE_WORKERS, thread_name_prefix="encode") as pool,
        CompilerSession(_SESSION_FLAGS) as session,
    ):
        module = session.parse(module_bytecode, what=what)
        with session.context:
            analysis = analyze(module, [p.global_name for p in wanted])
            for p in wanted:
                codec = choices[p].codec
                uses = analysis[p.global_name]
                if isinstance(uses, str):
                    problems.setdefault((codec, uses), []).append(f"{p.scope}::{p.key}")
                    continue
                axes = reduce_axes_of(uses, len(p.shape))
                order = storage_order_of(uses, len(p.shape))
                layout = choose_layout(codec, p.shape, p.dtype, axes, order)
                if isinstance(layout, str):
                    problems.setdefault((codec, layout), []).append(f"{p.scope}::{p.key}")
                    records[p].reason = f"kept fp32: {layout} ({choices[p].reason})"
                    continue
                value = load_value(p)
                if value is None:
                    continue  # compose reports the unbound parameter
                for part in layout.parts[1:]:
                    if (p.scope, p.key + part.suffix) in taken:
                        raise CompileError(
                            f"{what}: encoding {p.scope}::{p.key} as {codec} needs the key "
                            f"'{p.key}{part.suffix}' for its {part.role}, which the graph already "
                            "uses; rename that parameter or keep this one fp32"
                        )
                    taken.add((p.scope, p.key + part.suffix))
                array = np.asarray(value).reshape(p.shape)
                pending.append((p, layout, pool.submit(encode, array, layout)))
                report = rewrite(module, p.global_name, p.scope, p.key, layout, session.context)
                records[p] = _encoded(p, layout, choices[p].reason, report)
            for p, layout, future in pending:  # in graph order: the same .mln every time
                stored += [
                    StoredTensor(p.scope, p.key + part.suffix, np.ascontiguousarray(a))
                    for part, a in zip(layout.parts, future.result(), strict=True)
                ]
            if not module.verify():
                raise CompileError(f"{what}: the encoded graph does not verify (internal error)")
            buffer = io.BytesIO()
            module.write_bytecode(buffer)
    why_not = {codec: why for codec, _, why in policy.unsupported}
    warnings = [
        f"{codec} not applied to {len(names)} parameter(s) ({_names(names)}): "
        f"{why_not[codec.split(':', 1)[0]]}; they are stored {instead} instead"
        for (codec, instead), names in replaced.items()
    ] + [
        f"{codec} not applied to {len(names)} parameter(s) ({_names(names)}): {reason}; "
        "they stay fp32"
        for (codec, reason), names in problems.items()
    ]
    return EncodedGraph(buffer.getvalue(), stored, [records[p] for p in parameters], warnings)


def _names(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _kept(p: ParameterInput, reason: str) -> ParameterRecord:
    from myelin.dtypes import itemsize

    nbytes = int(np.prod(p.shape, dtype=np.int64)) * itemsize(p.dtype)
    return ParameterRecord(
        p.scope,
        p.key,
        NO_CODEC,
        reason,
        p.dtype,
        list(p.shape),
        parts=[
            {
                "key": p.key,
                "role": "data",
                "dtype": p.dtype,
                "shape": list(p.shape),
                "nbytes": nbytes,
            }
        ],
    )


def _encoded(p: ParameterInput, layout: Layout, reason: str, uses: list[str]) -> ParameterRecord:
    return ParameterRecord(
        p.scope,
        p.key,
        layout.codec,
        reason,
        p.dtype,
        list(p.shape),
        layout.description,
        list(layout.reduce_axes),
        list(layout.order),
        uses,
        [
            {
                "key": p.key + part.suffix,
                "role": part.role,
                "dtype": part.storage_dtype,
                "shape": list(part.storage_shape),
                "nbytes": part.nbytes,
            }
            for part in layout.parts
        ],
    )
