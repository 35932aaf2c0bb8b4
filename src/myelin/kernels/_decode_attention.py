"""Split-KV (flash-decoding) attention for decode as IREE external dispatches: two Triton kernels
for sm_90a and the wrapper that chains them.

Decode attention has few query rows per (batch, head) (one new token per sequence, up to 16) and
a long key sequence: one program per batch-head would leave most SMs idle and read the cache at a
fraction of the memory bandwidth. So the keys are split across programs:

1. `plex_decode_attention`: one program per (key chunk of `split` keys, batch-head); the online
   softmax over its chunk in blocks of `block_n` keys (f32, exp2, scale folded into log2 units),
   writing its normalized partial output [M, D] and its log-sum-exp [M] (f32) to a workspace.
2. `plex_decode_combine`: one program per batch-head; combines the chunks' partials weighted by
   their log-sum-exps (no atomics, deterministic).

The keys come in two parts, K1 [bh, N1, D] and K2 [bh, N2, D] (V alike): a decoder that appends
the new token to its cache with `torch.cat` before `scaled_dot_product_attention` has a
`tensor.concat` of (cache, new) feeding the attention; the kernel reads both parts where they are,
so the concatenated copy of the cache is never made (`_attention.find_attention` finds it). Without
a concat the wrapper passes K and V twice with N2 = 0. M, N1, N2 are i32 push constants.

A masked config (`masked=True`) also reads an additive mask [bh, M, N1 + N2] of Q's dtype (what
`scaled_dot_product_attention(q, k, v, attn_mask=float_mask)` gives `iree_linalg_ext.attention`:
0 where a key counts, -inf where it does not, e.g. a cache's empty slots), added to the scores
before the softmax. A chunk whose keys are all masked contributes nothing (log-sum-exp -inf).
Without a mask the kernel has no mask parameter at all (a constexpr None).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from myelin.kernels._triton import CompiledKernel, compile_triton

_TYPES = {"f16": "fp16", "bf16": "bf16"}
_LOG2E = 1.4426950408889634
MAX_QUERY_ROWS = 16  # the decode kernel's row block: M <= 16 query rows per batch-head


@dataclass(frozen=True)
class DecodeAttentionConfig:
    """One split-KV decode attention: M <= 16 query rows per batch-head, with or without an
    additive mask."""

    dtype: str  # "f16" | "bf16"
    head_dim: int
    scale: float  # the softmax scale, baked into the kernel
    masked: bool = False  # reads an additive mask [bh, M, keys] of `dtype`
    block_m: int = MAX_QUERY_ROWS
    block_n: int = 64
    split: int = 256  # keys per program (a multiple of block_n)
    num_warps: int = 4
    num_stages: int = 3

    @property
    def name(self) -> str:
        scale = struct.pack(">f", self.scale).hex()
        return (
            f"plex_decode_attention_{'mask_' if self.masked else ''}{self.dtype}_"
            f"d{self.head_dim}_m{self.block_m}_"
            f"{self.block_n}x{self.split}_w{self.num_warps}s{self.num_stages}_s{scale}"
        )

    @property
    def combine_name(self) -> str:
        return f"plex_decode_combine_{self.dtype}_d{self.head_dim}_m{self.block_m}"

    def splits(self, keys: int) -> int:
        """How many key chunks (programs per batch-head) `keys` keys take."""
        return -(-keys // self.split)

    def workspace_elements(self, bh: int, m: int, keys: int) -> int:
        """f32 elements of the workspace: partial outputs [bh, splits, M, D], then LSEs
        [bh, splits, M]."""
        return bh * self.splits(keys) * m * (self.head_dim + 1)


def _split_fn():
    from myelin.kernels._decode_triton import plex_decode_attention

    return plex_decode_attention


def _combine_fn():
    from myelin.kernels._decode_triton import plex_decode_combine

    return plex_decode_combine


def split_constants(config: DecodeAttentionConfig) -> dict:
    """The split kernel's compile-time constants (also what the interpreter test passes; the
    mask pointer, a constexpr None without a mask, is passed by position there)."""
    return {
        "D": config.head_dim,
        "BM": config.block_m,
        "BN": config.block_n,
        "SPLIT": config.split,
        "QK_SCALE": config.scale * _LOG2E,
        "HAS_MASK": config.masked,
    }


def combine_constants(config: DecodeAttentionConfig) -> dict:
    return {"D": config.head_dim, "BM": config.block_m}


def compile_decode_attention(
    config: DecodeAttentionConfig, arch: str = "sm_90a"
) -> dict[str, CompiledKernel]:
    """Both kernels, by their export names."""
    t = _TYPES[config.dtype]
    split_sig = {
        "q_ptr": f"*{t}", "k1_ptr": f"*{t}", "v1_ptr": f"*{t}", "k2_ptr": f"*{t}",
        "v2_ptr": f"*{t}", "mask_ptr": f"*{t}" if config.masked else "constexpr",
        "ws_ptr": "*fp32", "M": "i32", "N1": "i32", "N2": "i32",
        "D": "constexpr", "BM": "constexpr", "BN": "constexpr", "SPLIT": "constexpr",
        "QK_SCALE": "constexpr", "HAS_MASK": "constexpr",
    }  # fmt: skip
    constants = split_constants(config)
    if not config.masked:
        constants["mask_ptr"] = None
    combine_sig = {
        "ws_ptr": "*fp32", "o_ptr": f"*{t}", "M": "i32", "S": "i32",
        "D": "constexpr", "BM": "constexpr",
    }  # fmt: skip
    # IREE's bindings are 16-byte aligned (at least: it allocates with larger alignment).
    pointers = (0, 1, 2, 3, 4, 5, 6) if config.masked else (0, 1, 2, 3, 4, 6)
    aligned = {(i,): [["tt.divisibility", 16]] for i in pointers}
    split = compile_triton(
        _split_fn, split_sig, constants, aligned,
        num_warps=config.num_warps, num_stages=config.num_stages, name=config.name, arch=arch,
    )  # fmt: skip
    combine = compile_triton(
        _combine_fn, combine_sig, combine_constants(config),
        {(i,): [["tt.divisibility", 16]] for i in range(2)},
        num_warps=4, num_stages=1, name=config.combine_name, arch=arch,
    )  # fmt: skip
    return {split.name: split, combine.name: combine}


def _object(kernel: CompiledKernel) -> str:
    data = f'dense<"0x{kernel.cubin.hex().upper()}"> : vector<{len(kernel.cubin)}xi8>'
    return f"""objects({{
      #hal.executable.target<"cuda", "cuda-nvptx-fb"> ordinal(0) = [
        #hal.executable.object<{{path = "{kernel.name}.cubin", data = {data}}}>
      ]
    }})
    <{{workgroup_size = [{kernel.threads} : index, 1 : index, 1 : index],
       workgroup_local_memory = {kernel.shared_bytes} : index}}>"""


def wrapper_text(
    name: str,
    config: DecodeAttentionConfig,
    kernels: dict[str, CompiledKernel],
    types: tuple[str, str, str, str],  # Q, K1/V1, K2/V2, O (rank 3 each)
    shape: tuple[int, int, int, int],  # (bh, M, N1, N2)
    mask_type: str | None = None,  # the mask [bh, M, N1 + N2], with a masked config
) -> str:
    """(Q, K1, V1, K2, V2[, mask]) -> O: the split kernel over (splits, bh) into an f32
    workspace, then the combine kernel over bh."""
    qt, t1, t2, ot = types
    assert (mask_type is not None) == config.masked
    mask_arg = f", %mask: {mask_type}" if mask_type else ""
    mask_use = ", %mask" if mask_type else ""
    mask_t = f", {mask_type}" if mask_type else ""
    bh, m, n1, n2 = shape
    splits = config.splits(n1 + n2)
    ws = f"tensor<{config.workspace_elements(bh, m, n1 + n2)}xf32>"
    binding = "#hal.pipeline.binding<storage_buffer"
    ro = f"{binding}, ReadOnly>"
    split, combine = kernels[config.name], kernels[config.combine_name]
    return f"""
util.func private @{name}(%q: {qt}, %k1: {t1}, %v1: {t1}, %k2: {t2}, %v2: {t2}{mask_arg}) -> {ot} {{
  %splits = arith.constant {splits} : index
  %bh = arith.constant {bh} : index
  %m_i32 = arith.constant {m} : i32
  %n1_i32 = arith.constant {n1} : i32
  %n2_i32 = arith.constant {n2} : i32
  %s_i32 = arith.constant {splits} : i32
  %ws = hal.dispatch.extern "{split.name}"[%splits, %bh]
      (%m_i32, %n1_i32, %n2_i32, %q, %k1, %v1, %k2, %v2{mask_use})
      : (i32, i32, i32, {qt}, {t1}, {t1}, {t2}, {t2}{mask_t}) -> {ws}
    count(%device: !hal.device, %ws_: index, %wbh: index) -> (index, index, index) {{
      %one = arith.constant 1 : index
      hal.return %ws_, %wbh, %one : index, index, index
    }}
    layout(#hal.pipeline.layout<constants = 3, bindings = [
      {ro}, {ro}, {ro}, {ro}, {ro},{f" {ro}," if mask_type else ""} {binding}>]>)
    {_object(split)}
  %r = hal.dispatch.extern "{combine.name}"[%bh](%m_i32, %s_i32, %ws)
      : (i32, i32, {ws}) -> {ot}
    count(%device: !hal.device, %wbh: index) -> (index, index, index) {{
      %one = arith.constant 1 : index
      hal.return %wbh, %one, %one : index, index, index
    }}
    layout(#hal.pipeline.layout<constants = 2, bindings = [{ro}, {binding}>]>)
    {_object(combine)}
  util.return %r : {ot}
}}
"""
