"""Weight codecs: how a parameter is stored in the .mln and how the compiled graph decodes it.

A codec is one module here, registered in CODECS by name. It provides:

- `layout(shape, dtype, reduce_axes, options) -> Layout | str`: the stored tensors ("parts") for
  one parameter and the scalar decode in MLIR, or a reason it does not apply;
- `encode(array, layout) -> list[np.ndarray]`: the parts' bytes, one array per part;
- `decode(parts, layout) -> np.ndarray`: the numpy reference of the IR decode (tests and
  accuracy reports compare against it);
- `parse_options(text) -> dict` for the part after ':' in a codec name (`q4:g64`).

Everything else is generic and lives in private modules, one idea each, each importing only
those listed before it:

- `_contract`: the codec table, `Layout`/`StoredPart`, the helpers codec modules share;
- `_policy`: which codec each parameter gets; `_rows`: a .mln's bytes per codec, for reports;
- on the imported IR (the compiler's bindings): `_uses` (where each use of a parameter ends
  up), `_emit` (building decode IR from templates), `_regions` (decode and consumer in one
  dispatch region), `_forms` (two forms of one contraction until a variant chooses),
  `_chunked` (q4 contractions over a long axis), `_gather` (embedding lookups),
  `_loadtime` (decode at load under data tiling), `_cpu_kernels` (the C matvec kernels),
  `_matvec` (matvecs), `_q4_gpu` (q4's Hopper kernel form and the kernel's contract),
  `_rewrite` (one parameter's rewrite, ordering the above), `_apply` (a graph's encode step);
- `_finalize`: `finalize(module, devices)`, the choices left open for a variant, which the
  compile step, the check and the kernels step all make through it;
- `_check`: the no-materialization check on dispatch-creation IR.

This module imports only what the manifest needs (no numpy, no compiler), so a manifest can
validate codec names without the compiler installed; the IR side loads on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from myelin.codecs._check import Materialization, check_encoded_module
from myelin.codecs._contract import (
    CODEC_FORMS,
    CODECS,
    FORMAT_VERSION,
    NO_CODEC,
    Layout,
    StoredPart,
    check_codec_name,
    choose_layout,
    codec_module,
    decode,
    encode,
    from_storage,
    identity_index,
    kernels_key,
    no_options,
    parse_codec,
    permuted,
    to_storage,
)
from myelin.codecs._policy import CodecPolicy, CodecRule, choose, device_limits
from myelin.codecs._rows import ParameterRow, bytes_by_codec, parameter_rows

# Names whose modules import the compiler's bindings or numpy: loaded on first use
# (`__getattr__`), so that planning a build and checking a codec name stay light.
# public name -> (module, its name there)
_LAZY: dict[str, tuple[str, str]] = {
    "EncodedGraph": ("myelin.codecs._apply", "EncodedGraph"),
    "ParameterInput": ("myelin.codecs._apply", "ParameterInput"),
    "ParameterRecord": ("myelin.codecs._apply", "ParameterRecord"),
    "StoredTensor": ("myelin.codecs._apply", "StoredTensor"),
    "encode_graph": ("myelin.codecs._apply", "encode_graph"),
    "FinalForms": ("myelin.codecs._finalize", "FinalForms"),
    "decodes_at_load": ("myelin.codecs._finalize", "decodes_at_load"),
    "finalize": ("myelin.codecs._finalize", "finalize"),
    # the q4 kernel contract the kernel library (myelin.kernels) implements
    "Q4_KERNEL_GROUP": ("myelin.codecs._q4_gpu", "KERNEL_GROUP"),
    "Q4_BLOCKS": ("myelin.codecs._cpu_kernels", "Q4_BLOCKS"),  # the stored blocks it reads
    "Q4_KERNEL_MAX_M": ("myelin.codecs._q4_gpu", "KERNEL_MAX_M"),
    "Q4_MATMUL_ATTRIBUTE": ("myelin.codecs._q4_gpu", "Q4_MATMUL_ATTRIBUTE"),
    "q4_kernel_covers": ("myelin.codecs._q4_gpu", "kernel_covers"),
    "q4_kernel_forms": ("myelin.codecs._q4_gpu", "kernel_forms"),
    # use analysis, for the weight layout rewrite (myelin.tuning.layout)
    "classify_use": ("myelin.codecs._uses", "classify"),
    "follow_use": ("myelin.codecs._uses", "follow"),
    "module_globals": ("myelin.codecs._uses", "module_globals"),
    "symbol_users": ("myelin.codecs._uses", "symbol_users"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attribute = _LAZY[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'myelin.codecs' has no attribute {name!r}")


__all__ = [
    "CODECS",
    "CODEC_FORMS",
    "FORMAT_VERSION",
    "NO_CODEC",
    "CodecPolicy",
    "CodecRule",
    "Layout",
    "Materialization",
    "ParameterRow",
    "StoredPart",
    "bytes_by_codec",
    "check_codec_name",
    "check_encoded_module",
    "choose",
    "choose_layout",
    "codec_module",
    "decode",
    "device_limits",
    "encode",
    "from_storage",
    "identity_index",
    "kernels_key",
    "no_options",
    "parameter_rows",
    "parse_codec",
    "permuted",
    "to_storage",
    *_LAZY,
]
