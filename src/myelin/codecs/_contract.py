"""The codec contract: the table of codecs, what a codec gives for one parameter (`Layout`: its
stored parts and the scalar decode in MLIR) and the generic helpers every codec module shares.
Imports only numpy (and that lazily), so a manifest validates codec names without the compiler
installed."""

from __future__ import annotations

import functools
import importlib
import math
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

# codec name -> module implementing it
CODECS: dict[str, str] = {
    "fp32": "myelin.codecs.fp32",
    "fp16": "myelin.codecs.fp16",
    "bf16": "myelin.codecs.bf16",
    "int8": "myelin.codecs.int8",
    "q4": "myelin.codecs.q4",
}
NO_CODEC = "fp32"


def kernels_key(devices: tuple[Any, ...]) -> str:
    """The CPU matvec kernels a compile for these devices (TargetDevice) links into encoded
    matvecs (myelin.codecs._cpu_kernels), as part of the compile key: which kernel each form
    gets, every kernel's source and flags' digest, and the C compiler that builds them (a build
    machine without gcc keeps IREE's code: another artifact, so another key)."""
    return _kernels_key(tuple(devices))


@functools.cache
def _kernels_key(devices: tuple[Any, ...]) -> str:
    from myelin.backends import compiler_version
    from myelin.codecs._cpu_kernels import digest, selection_key

    return f"{selection_key(devices)} {digest()} {compiler_version() or '(no gcc)'}"


# Bump when a codec's stored bytes or its IR decode change: build caches key on it.
FORMAT_VERSION = 15
# How codec names read in messages: the options each codec takes, after ':'.
CODEC_FORMS = ("fp32", "fp16", "bf16", "int8", "q4", "q4:g<group size>")


@dataclass(frozen=True)
class StoredPart:
    """One tensor a codec stores for a parameter: its IR global and its bytes in the .mln.

    `index` says, per dim of the IR global, which element of the part the logical element
    (d0, d1, ...) reads: an affine expression over the logical dims, e.g. "d1 floordiv 32".
    """

    role: str  # "data" | "scale" | "zero"
    suffix: str  # appended to the parameter's key; "" for the data part
    element: str  # MLIR element type of the IR global: f32, f16, bf16, i8, i4
    shape: tuple[int, ...]  # shape of the IR global
    index: tuple[str, ...]
    storage_dtype: str  # as the .mln records it: float16, int8, uint4, ...
    storage_shape: tuple[int, ...]  # as the .mln records it (q4 data: its 4-bit values)

    @property
    def nbytes(self) -> int:
        bits = {"i4": 4, "i8": 8, "f16": 16, "bf16": 16, "f32": 32}[self.element]
        return math.prod(self.shape) * bits // 8


@dataclass(frozen=True)
class Layout:
    """How one parameter is stored (its parts) and decoded (`decode`: MLIR lines that compute
    `%r : f32` from `%p0`, `%p1`, ... the parts' scalars, in part order)."""

    codec: str  # the full codec name, options included: "q4:g32"
    logical_dtype: str  # numpy dtype name of the parameter the graph sees
    logical_shape: tuple[int, ...]
    reduce_axes: tuple[int, ...]  # the logical axes a consumer contracts (scales are per the rest)
    parts: tuple[StoredPart, ...]
    decode: tuple[str, ...]
    description: str  # one line for people: what is stored
    options: dict[str, Any] = field(default_factory=dict)
    # The logical axes in the order the data part stores them: the order its consumer reads
    # (a torch Linear's [out, in] weight is read as [in, out]), so the decode inside the
    # consumer's dispatch streams the stored bytes contiguously. () means the logical order.
    order: tuple[int, ...] = ()
    # (logical axis, group size) when parts are read per group along that axis (q4): the
    # decode then iterates the axis as (group, element in group), see _emit.emit_tensor_decode.
    split: tuple[int, int] | None = None
    # For a grouped codec (q4): (lines computing `%r : f32`, the element's code, from `%p0`;
    # lines computing the group's `%s` and `%b` from `%p1`, ... the other parts), so that
    # `decode` equals `%r * %s + %b`; a matvec then folds %s and %b in once per group
    # (myelin.codecs._matvec.emit_grouped).
    grouped: tuple[tuple[str, ...], tuple[str, ...]] | None = None
    # For a codec with one scale per output (int8): lines computing `%r : f32`, the code, from
    # `%p0`, so that `decode` equals `%r * %p1`; a matvec then scales each output once, after
    # the dot product (myelin.codecs._matvec.emit_scaled).
    scaled: tuple[str, ...] | None = None
    # (logical axis, block size) when the data part stores that axis in blocks outermost (the
    # K-major weights of fp16, int8 and q4: [N / B][K][B]), so that a block of outputs is one
    # contiguous stream: the decode iterates the axis as (block, element in block), like
    # `split` (q4 splits both axes).
    blocked: tuple[int, int] | None = None

    @property
    def stored_bytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    @property
    def logical_bytes(self) -> int:
        from myelin.dtypes import itemsize

        return math.prod(self.logical_shape) * itemsize(self.logical_dtype)


def codec_module(name: str) -> ModuleType:
    base = name.partition(":")[0]
    if base not in CODECS:
        raise ValueError(_unknown(name))
    return importlib.import_module(CODECS[base])


def _unknown(text: str) -> str:
    return f"unknown codec {text!r}; accepted: {', '.join(CODEC_FORMS)} (e.g. 'q4:g64')"


def parse_codec(text: str) -> tuple[str, dict[str, Any]]:
    """("q4", {"group": 64}) for "q4:g64"; raises ValueError naming the accepted forms."""
    if not isinstance(text, str):
        raise ValueError(_unknown(str(text)))
    base, sep, rest = text.partition(":")
    module = codec_module(base)
    try:
        options = module.parse_options(rest if sep else None)
    except ValueError as e:
        raise ValueError(f"invalid codec {text!r}: {e}") from None
    return base, options


def check_codec_name(text: str) -> str:
    """`text` if it names a codec (with valid options), else ValueError; for manifest checks."""
    parse_codec(text)
    return text


def choose_layout(
    codec: str,
    shape: tuple[int, ...],
    dtype: str,
    reduce_axes: tuple[int, ...],
    order: tuple[int, ...] | None = None,
) -> Layout | str:
    """The layout `codec` gives a parameter of this shape and dtype, or why it cannot.
    `order` asks for the data stored with its axes permuted (the order its consumer reads)."""
    base, options = parse_codec(codec)
    identity = tuple(range(len(shape)))
    options = {**options, "order": tuple(order) if order else identity}
    return codec_module(base).layout(tuple(shape), dtype, tuple(reduce_axes), options)


def permuted(
    shape: tuple[int, ...], order: tuple[int, ...]
) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(the IR shape, the index expressions) of data stored with its axes in `order`."""
    return tuple(shape[a] for a in order), tuple(f"d{a}" for a in order)


def output_block(
    shape: tuple[int, ...],
    reduce_axes: tuple[int, ...],
    order: tuple[int, ...],
    blocks: tuple[int, ...],
) -> tuple[int, int] | None:
    """(logical output axis, block) for a K-major rank-2 weight stored in blocks of outputs
    (`Layout.blocked`): the first of `blocks` that divides the outputs; else None."""
    if len(shape) != 2 or len(reduce_axes) != 1:
        return None
    out = 1 - reduce_axes[0]
    if tuple(order) != (reduce_axes[0], out):
        return None
    block = next((b for b in blocks if shape[out] % b == 0), None)
    return None if block is None else (out, block)


def to_storage(array: np.ndarray, layout: Layout) -> np.ndarray:
    """The data in its stored axis order (and blocks, for a blocked layout)."""
    import numpy as np

    stored = np.transpose(array, layout.order) if layout.order else array
    if layout.blocked is not None:
        outer, inner = stored.shape
        block = layout.blocked[1]
        stored = stored.reshape(outer, inner // block, block).transpose(1, 0, 2)
    return np.ascontiguousarray(stored)


def from_storage(array: np.ndarray, layout: Layout) -> np.ndarray:
    """Stored data back in the logical axis order."""
    import numpy as np

    if layout.blocked is not None:
        array = array.reshape(layout.parts[0].storage_shape)
        blocks, outer, block = array.shape
        array = array.transpose(1, 0, 2).reshape(outer, blocks * block)
    return np.transpose(array, np.argsort(layout.order)) if layout.order else array


def encode(array: np.ndarray, layout: Layout) -> list[np.ndarray]:
    import numpy as np

    return codec_module(layout.codec).encode(np.asarray(array), layout)


def decode(parts: list[np.ndarray], layout: Layout) -> np.ndarray:
    return codec_module(layout.codec).decode(parts, layout)


def identity_index(rank: int) -> tuple[str, ...]:
    return tuple(f"d{i}" for i in range(rank))


def no_options(text: str | None) -> dict[str, Any]:
    if text is not None:
        raise ValueError("this codec takes no options")
    return {}
