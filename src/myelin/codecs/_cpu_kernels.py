"""CPU matvec kernels: hand-written C matvecs linked into IREE's llvm-cpu executables.

IREE 3.13's llvm-cpu codegen turns an encoded matvec (myelin.codecs._matvec) into float FMAs on
decoded weights, one or more instructions per weight, and does not emit the integer dot
products (AVX2's `vpmaddubsw`, AVX-512 VNNI's `vpdpbusd`) from linalg, not even for an integer
matvec written for them. A decode step then reads its weights at 5-6 GB/s where llama.cpp
reads them at 11-19 GB/s on the same core. The kernels here do what llama.cpp does: q4 and int8
quantize the activation row to 8 bits per group of 32 once per call (its Q8_0) and multiply
the codes with it in integers, the factors applied in f32 once per group and output; fp16
converts and accumulates in f32, streaming the weight once (the C files say how).

`KERNELS` is the one table: per codec form (`q4`, `int8`, `fp16`), the kernels in order of
preference, each with the CPU features it needs and the output block it works in; a matvec
runs the first one its variant's CPU has that takes its shape.

How they reach IREE, at its public boundary: the encode step marks each K-major matvec of a
form (`MARK`, value: the form) on the op that yields its dispatch region's result; the compile
step of a one-device llvm-cpu variant replaces each marked region whose shapes the kernel takes
by a `flow.dispatch` of a `stream.executable` whose workgroups call the kernel on their share
of the outputs. The executable carries the kernel's object file (`hal.executable.objects`,
built here by gcc) and IREE's linker links it into the executable's embedded ELF (the call is
`hal.import.static`). The object is a file in the system temp dir, named by its digest: IREE
3.13 links an object given as `data` as an empty file. The bindings are the encoded parameters
themselves (read in place from the .mln), the activation and the consumer's init. A kernel that
quantizes the activation reads it packed (cpu_matvec.h, Q8_BYTES) from a one-workgroup dispatch
of its object's quantizer (`Kernel.quantizer`) placed before the first matvec of that
activation; the others of the same activation (a layer's Q, K and V; gate and up) read the
same packed buffer. Everything
else (cuda, vmvx, a CPU without the features, a shape no kernel takes, a build machine without
gcc) keeps IREE's code for the matvec. `hal.dispatch.extern` would be the shorter spelling,
but it crashes iree-compile 3.13 on llvm-cpu.

Only one activation row (M = 1, a decode step of batch 1): the encode step marks matvecs only
(myelin.codecs._matvec.matvec_loops); a batched decode's matmul keeps IREE's code.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from myelin.compiler.workgroup_split import workgroup_share
from myelin.errors import CompileError

if TYPE_CHECKING:
    from iree.compiler import ir

# On the op yielding a marked matvec region's result: the codec form ("q4", "int8", "fp16") of
# a matvec whose weight is stored K-major (the kernels read K-major weights only).
MARK = "plex.cpu_matvec"
GROUP = 32  # the activation's quantization group (and q4's: other q4 groups keep IREE's code)
MAX_K = 8192  # the largest K a quantizing kernel takes (the K measured; larger untested)
# How many workgroups split a kernel's outputs. Kernels that quantize the activation get one
# workgroup per BYTES_PER_QUANTIZING_WORKGROUP of weight read (at least one), chosen while each
# workgroup still quantized the activation itself (now their quantizer's dispatch does it once).
# Small shares balance IREE's workers: TinyLlama-1.1B q4 decode on Zen 4 (one process,
# interleaved) took 2 threads from 38.7 to 43.3 tok/s and 1 thread from 29.7 to 32.2 going
# from (32, 1 MiB) to (64, 32 KiB); int8 and fp16 moved within noise.
MAX_WORKGROUPS = 64
BYTES_PER_QUANTIZING_WORKGROUP = 32 << 10
HEADER = Path(__file__).with_name("cpu_matvec.h")
# The kernels' software prefetch distance down a weight's stream, in bytes, by the LLVM CPU the
# build targets; every other CPU gets 0, the hardware prefetchers alone. A decode step's weights
# read from memory on one core (docs/codecs.md, "Software prefetch by CPU"): on Zen 5, 4 KiB
# ahead took one-thread decode from 9.8 to 10.8 tok/s (fp16), 16.9 to 19.2 (int8) and 21.8 to
# 29.9 (q4); on Zen 4 the same prefetch made the step 1.29x (q4) to 1.50x (int8) slower.
PREFETCH_AHEAD_BYTES = {"znver5": 4096}
# Freestanding: the object is linked into an embedded ELF (no libc, no unwind tables, no
# stack protector, no loops turned into memset/memcpy calls).
CFLAGS = (
    "-O3",
    "-fPIC",
    "-ffreestanding",
    "-fno-builtin",
    "-fno-stack-protector",
    "-fno-tree-loop-distribute-patterns",
    "-fno-asynchronous-unwind-tables",
    "-fno-ident",
)


# The stored blocks of outputs of K-major weights, [N / B][K][B], B the first of these that
# divides N (`output_block`): a CPU matvec kernel walks one block down all K rows, one
# contiguous stream (docs/codecs.md, "CPU matvec kernels": the same walk over [K][N] rows steps
# a page a row and read weights from memory 1.4x slower). Here, with the kernels' table,
# which reads them without importing the codecs (and numpy). fp16's; int8's (256, else its
# kernel's 64).
FLOAT_BLOCKS = (256, 128)
INT8_BLOCKS = (256, 64)
# q4's (codes [N / B][K][B], two per byte along B; the group factors [N / B][K / g][B]): the
# AVX-512 kernel's 128 divides the first two, the AVX2 kernel's 64 all three, and the Hopper
# kernel's program takes one block (myelin.kernels._q4: its BN is the same first divisor).
Q4_BLOCKS = (256, 128, 64)


@dataclass(frozen=True)
class Kernel:
    """One C matvec kernel: `<name>.c` next to this module, its entry point `plex_<name>`."""

    form: str  # the codec form whose marked matvecs it takes
    name: str
    features: tuple[str, ...]  # the CPU features it needs, as LLVM names them (gcc: -m<name>)
    block: int  # outputs per kernel block: N must be a multiple
    quantizes: bool  # the activation to 8 bits per group: K a multiple of GROUP, <= MAX_K
    # Outputs of the weight's stored blocks where N is a multiple of it, else smaller ones
    # (the blocked layouts, `Layout.blocked`: `FLOAT_BLOCKS`, `INT8_BLOCKS`, `Q4_BLOCKS`; 0:
    # none): workgroups take whole stored blocks.
    wide_block: int = 0
    ahead_bytes: int = 0  # the software prefetch's distance (PREFETCH_AHEAD_BYTES; 0: none)

    @property
    def source(self) -> Path:
        return Path(__file__).with_name(f"{self.name}.c")

    @property
    def symbol(self) -> str:
        return f"plex_{self.name}"

    @property
    def quantizer(self) -> str:
        """The entry point, in the same object, that packs the activation for `symbol` (a
        kernel that `quantizes`): cpu_matvec.h, Q8_QUANTIZER."""
        return f"plex_{self.name}_quantize"

    @property
    def cflags(self) -> tuple[str, ...]:
        # the C side checks these against its own #defines (cpu_matvec.h)
        numbers = (
            f"-DPLEX_BLOCK={self.block}",
            f"-DPLEX_GROUP={GROUP}",
            f"-DPLEX_MAX_K={MAX_K}",
            f"-DPLEX_WIDE_BLOCK={self.wide_block}",
            f"-DPLEX_AHEAD_BYTES={self.ahead_bytes}",
        )
        return (*CFLAGS, *(f"-m{f}" for f in self.features), *numbers)


_AVX512_VNNI = ("avx512f", "avx512bw", "avx512vnni", "avx2", "fma")
# Per form, in order of preference (measured: benchmarks/probes/cpu_matvec.py).
KERNELS = (
    Kernel(
        "q4", "q4_matvec_avx512vnni", _AVX512_VNNI, 128, quantizes=True, wide_block=Q4_BLOCKS[0]
    ),
    Kernel("q4", "q4_matvec_avx2", ("avx2", "fma"), 64, quantizes=True, wide_block=Q4_BLOCKS[0]),
    Kernel(
        "int8",
        "int8_matvec_avx512vnni",
        _AVX512_VNNI,
        INT8_BLOCKS[-1],
        quantizes=True,
        wide_block=INT8_BLOCKS[0],
    ),
    Kernel(
        "fp16",
        "fp16_matvec_avx512",
        ("avx512f", "f16c", "fma"),
        FLOAT_BLOCKS[-1],
        quantizes=False,
        wide_block=FLOAT_BLOCKS[0],
    ),
)


def digest() -> str:
    """Every kernel's source, the shared header and the flags: part of the compile key."""
    text = HEADER.read_bytes() if HEADER.exists() else b"(no header)"
    for kernel in KERNELS:
        source = kernel.source.read_bytes() if kernel.source.exists() else b"(no source)"
        text += f"{kernel}".encode() + source + " ".join(kernel.cflags).encode()
    return hashlib.sha256(text).hexdigest()[:16]


def kernel_object(kernel: Kernel) -> Path:
    """The kernel's x86-64 object file, compiled once per kernel digest into the system temp
    dir (again if something deleted it). IREE 3.13's llvm-cpu linker reads an object by
    `path` only: one given as `data` links as an empty file (undefined symbol), or crashes
    iree-compile when it has no path."""
    folder = Path(tempfile.gettempdir()) / "plex-kernels"
    target = folder / f"{kernel.name}-ahead{kernel.ahead_bytes}-{digest()}.o"
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="plex-matvec-", dir=folder) as tmp:
        out = Path(tmp) / "kernel.o"
        try:
            subprocess.run(
                ["gcc", *kernel.cflags, "-c", str(kernel.source), "-o", str(out)],
                check=True,
                capture_output=True,
                text=True,
            )
        except FileNotFoundError as e:
            raise CompileError(f"the CPU matvec kernel {kernel.name} needs gcc") from e
        except subprocess.CalledProcessError as e:
            raise CompileError(
                f"gcc failed on {kernel.source.name}: {e.stderr.strip()[-800:]}"
            ) from e
        out.replace(target)  # atomic: concurrent compiles see a whole file or none
    return target


def _cpu_features(devices: Sequence[Any]) -> frozenset[str] | None:
    """The LLVM CPU features of the one x86-64 llvm-cpu device (TargetDevice) in `devices`: the
    ones it names, else the host's for `cpu = "host"`; None for anything else (another target,
    several devices, a CPU named without features)."""
    from myelin import hostinfo

    if len(devices) != 1 or devices[0].target != "llvm-cpu" or hostinfo.machine() != "x86_64":
        return None
    device = devices[0]
    if device.cpu_features:
        return frozenset(f.lstrip("+") for f in device.cpu_features.split(",") if f[:1] != "-")
    if (device.cpu or "host") != "host":
        return None
    return frozenset(f.replace("_", "") for f in hostinfo.cpu_flags())  # avx512_vnni: avx512vnni


def _ahead_bytes(devices: Sequence[Any]) -> int:
    """The prefetch distance (PREFETCH_AHEAD_BYTES) for the LLVM CPU of the one device
    `_cpu_features` read: the one it names, else the host's (myelin.hostinfo.llvm_cpu) for
    `cpu = "host"`."""
    from myelin import hostinfo

    cpu = devices[0].cpu or "host"
    named = hostinfo.llvm_cpu() if cpu == "host" else cpu
    return PREFETCH_AHEAD_BYTES.get(named or "", 0)


def select(devices: Sequence[Any]) -> dict[str, tuple[Kernel, ...]]:
    """Per form, the kernels a variant on these devices (TargetDevice) may run, in KERNELS'
    order: those whose features its CPU has, built where gcc and the kernel's source are, with
    that CPU's prefetch distance (PREFETCH_AHEAD_BYTES). A matvec runs the first that takes its
    shape; forms absent keep IREE's code."""
    features = _cpu_features(devices)
    if features is None or shutil.which("gcc") is None:
        return {}
    ahead = _ahead_bytes(devices)
    chosen: dict[str, tuple[Kernel, ...]] = {}
    for kernel in KERNELS:
        if set(kernel.features) <= features and kernel.source.exists():
            tuned = dataclasses.replace(kernel, ahead_bytes=ahead)
            chosen[kernel.form] = (*chosen.get(kernel.form, ()), tuned)
    return chosen


def selection_key(devices: Sequence[Any]) -> str:
    """What `select` chose, for the compile key: "fp16=fp16_matvec_avx512 q4=...,...", the
    prefetch distance ("ahead=4096") and the workgroup split ("workgroups=64/32768"), as each
    changes the executables a compile writes."""
    chosen = sorted(select(devices).items())
    if not chosen:
        return "(none)"
    kernels = " ".join(f"{f}={','.join(k.name for k in ks)}" for f, ks in chosen)
    split = f"workgroups={MAX_WORKGROUPS}/{BYTES_PER_QUANTIZING_WORKGROUP}"
    return f"{kernels} ahead={_ahead_bytes(devices)} {split}"


def _dims(value: ir.Value) -> list[int]:
    from iree.compiler import ir

    t = ir.RankedTensorType(value.type)
    return [t.get_dim_size(d) for d in range(t.rank)] if t.has_static_shape else []


def _producer(value: ir.Value) -> ir.Operation | None:
    from iree.compiler import ir

    owner = value.owner
    if isinstance(owner, ir.Block):
        return None
    return owner.operation if hasattr(owner, "operation") else owner


@dataclass
class Matvec:
    """A marked matvec's operands in its kernel's argument order (the activation first, the
    consumer's init last), and its sizes."""

    k: int
    n: int
    operands: list[tuple[str, ir.Value, str, int]]  # (binding, value, element type, elements)
    block: int = 0  # outputs of the weight's stored blocks, 0: not blocked

    def granule(self, kernel: Kernel) -> int:
        """Outputs a workgroup's share is counted in: whole stored blocks, else the kernel's."""
        return self.block or kernel.block


def _q4_matvec(total: ir.Operation) -> Matvec | None:
    """From the grouped matvec's sum op over the stored blocks (myelin.codecs._matvec.
    emit_grouped): the activation, the codes, the four factor parts and the init before its
    expansion; None if the IR is not the one emit_grouped builds or a shape the kernels do not
    take."""
    if len(total.operands) != 7:
        return None
    p_op, xs_op = _producer(total.operands[0]), _producer(total.operands[1])
    if p_op is None or xs_op is None or p_op.name != "linalg.generic":
        return None
    unpack = _producer(p_op.operands[1])
    expand = _producer(xs_op.operands[0])
    if unpack is None or expand is None or expand.name != "tensor.expand_shape":
        return None
    x, codes, init = expand.operands[0], unpack.operands[0], _unexpanded(total.operands[6])
    dims = _dims(codes)
    if len(dims) != 4 or dims[2] != GROUP or init is None:
        return None
    count, groups, _, block = dims  # [N / B, K / 32, 32, B]
    n, k = count * block, groups * GROUP
    if block != next((b for b in Q4_BLOCKS if n % b == 0), None):
        return None
    if any(_dims(total.operands[i]) != [count, groups, block] for i in (2, 3)):
        return None
    if any(_dims(total.operands[i]) != [count, block] for i in (4, 5)):
        return None
    if math.prod(_dims(init) or [0]) != n:
        return None
    return Matvec(
        k,
        n,
        [
            ("x", x, "f32", k),
            ("codes", codes, "i8", k * n // 2),  # two 4-bit codes a byte
            ("scale", total.operands[2], "i8", groups * n),
            ("offset", total.operands[3], "i8", groups * n),
            ("rs", total.operands[4], "f32", n),
            ("ro", total.operands[5], "f32", n),
            ("init", init, "f32", n),
        ],
        block,
    )


def _int8_matvec(scaled: ir.Operation) -> Matvec | None:
    """From int8's scaling op over the stored blocks (myelin.codecs._blocked, scaled: `dot *
    scale + init` after the contraction of the codes as floats): the activation, the codes, the
    scale and the init before its expansion."""
    if len(scaled.operands) != 4:
        return None
    contraction = _producer(scaled.operands[0])
    if contraction is None or len(contraction.operands) != 3:
        return None
    found = _blocked_weight(contraction, "i8", INT8_BLOCKS)
    init = _unexpanded(scaled.operands[2])
    if found is None or init is None:
        return None
    codes, x, k, n, block = found
    scale = scaled.operands[1]
    if math.prod(_dims(scale) or [0]) != n or math.prod(_dims(init) or [0]) != n:
        return None
    return Matvec(
        k,
        n,
        [
            ("x", x, "f32", k),
            ("codes", codes, "i8", k * n),
            ("scale", scale, "f32", n),
            ("init", init, "f32", n),
        ],
        block,
    )


def _fp16_matvec(contraction: ir.Operation) -> Matvec | None:
    """From fp16's contraction over the stored blocks (myelin.codecs._blocked): the
    activation, the weight and the init before its expansion."""
    if len(contraction.operands) != 3:
        return None
    found = _blocked_weight(contraction, "f16", FLOAT_BLOCKS)
    init = _unexpanded(contraction.operands[2])
    if found is None or init is None:
        return None
    w, x, k, n, block = found
    return Matvec(
        k, n, [("x", x, "f32", k), ("w", w, "f16", k * n), ("init", init, "f32", n)], block
    )


def _unexpanded(value: ir.Value) -> ir.Value | None:
    """The source of the tensor.expand_shape producing `value` (an init over the blocks)."""
    expand = _producer(value)
    return (
        expand.operands[0] if expand is not None and expand.name == "tensor.expand_shape" else None
    )


def _blocked_weight(
    contraction: ir.Operation, element: str, blocks: tuple[int, ...]
) -> tuple[ir.Value, ir.Value, int, int, int] | None:
    """(stored [N / B, K, B] data, activation, K, N, B) of a matvec contraction over the
    blocks one of whose inputs is a one-input decode of stored blocks with this element type,
    B the codec's block for N (`blocks`: the first that divides it, as the kernels read)."""
    from iree.compiler import ir

    for w_at in (0, 1):
        decode = _producer(contraction.operands[w_at])
        if decode is None or decode.name != "linalg.generic" or len(decode.operands) != 2:
            continue
        stored = decode.operands[0]
        if str(ir.RankedTensorType(stored.type).element_type) != element:
            continue
        dims = _dims(stored)
        if len(dims) != 3:
            return None
        count, k, block = dims
        n = count * block
        x = contraction.operands[1 - w_at]
        if math.prod(_dims(x) or [0]) != k or math.prod(_dims(contraction.operands[2]) or [0]) != n:
            return None
        if block != next((b for b in blocks if n % b == 0), None):
            return None
        return stored, x, k, n, block
    return None


# form -> how its marked op gives the matvec's operands
MATVECS: dict[str, Callable[[ir.Operation], Matvec | None]] = {
    "q4": _q4_matvec,
    "int8": _int8_matvec,
    "fp16": _fp16_matvec,
}


def _takes(kernel: Kernel, matvec: Matvec) -> bool:
    """Whether the kernel takes these sizes: whole blocks of outputs; for the ones that
    quantize the activation, whole groups and at most MAX_K."""
    if matvec.n % kernel.block:
        return False
    return not kernel.quantizes or (matvec.k % GROUP == 0 and matvec.k <= MAX_K)


_BYTES = {"f32": 4, "f16": 2, "i8": 1}


def _workgroups(kernel: Kernel, matvec: Matvec) -> int:
    """How many workgroups split the output blocks: up to MAX_WORKGROUPS, and for a kernel
    that quantizes the activation one per BYTES_PER_QUANTIZING_WORKGROUP of weight read."""
    count = min(matvec.n // matvec.granule(kernel), MAX_WORKGROUPS)
    if kernel.quantizes:
        weight = sum(
            size * _BYTES[t] for b, _, t, size in matvec.operands if b not in ("q8", "init")
        )
        count = min(count, max(1, weight // BYTES_PER_QUANTIZING_WORKGROUP))
    return count


def _bound(bindings: list[tuple[str, str, int]]) -> tuple[str, str, list[str], list[str]]:
    """For bindings (name, element type, elements): the function's arguments, their subspans
    as bare pointers and offsets, the call's operands and their types."""
    dyn = "strided<[1], offset: ?>"
    args = ", ".join(f"%b_{b}: !stream.binding" for b, _, _ in bindings)
    subspans, pointers, types = [], [], []
    for b, t, size in bindings:
        memref = f"memref<{size}x{t}, {dyn}>"
        subspans.append(
            f"%m_{b} = stream.binding.subspan %b_{b}[%c0] : !stream.binding -> {memref}\n"
            f"      %p_{b}, %o_{b}, %s_{b}, %st_{b} = memref.extract_strided_metadata %m_{b}\n"
            f"          : {memref} -> memref<{t}>, index, index, index"
        )
        pointers += [f"%p_{b}", f"%o_{b}"]
        types += [f"memref<{t}>", "index"]
    return args, "\n".join("      " + s for s in subspans).lstrip(), pointers, types


def _object_executable(
    name: str, obj: Path, workgroups: int, symbol: str, signature: str, func: str
) -> str:
    """A stream.executable linking `obj`, its export `name` run on `workgroups` workgroups,
    its module `func` (the export's function) and the import of `symbol`."""
    return f"""
stream.executable private @{name} attributes {{
  hal.executable.objects = #hal.executable.objects<{{
    #hal.executable.target<"llvm-cpu", "embedded-elf-x86_64"> = [
      #hal.executable.object<{{path = "{obj}"}}>
    ]
  }}>
}} {{
  stream.executable.export public @{name} workgroups() -> (index, index, index) {{
    %c1 = arith.constant 1 : index
    %w = arith.constant {workgroups} : index
    stream.return %w, %c1, %c1 : index, index, index
  }}
  builtin.module {{
    func.func private @{symbol}({signature})
        attributes {{hal.import.static, llvm.bareptr = true}}
    {func}
  }}
}}
"""


def _executable_text(name: str, kernel: Kernel, matvec: Matvec, obj: Path) -> str:
    bindings = [(b, t, size) for b, _, t, size in matvec.operands] + [("out", "f32", matvec.n)]
    args, subspans, pointers, types = _bound(bindings)
    signature = ", ".join([*types, "index", "index", "index", "index"])
    symbol = kernel.symbol
    func = f"""func.func @{name}({args}) {{
      %c0 = arith.constant 0 : index
      {subspans}
      %k = arith.constant {matvec.k} : index
      %n = arith.constant {matvec.n} : index
      %blocks = arith.constant {matvec.n // matvec.granule(kernel)} : index
      %block = arith.constant {matvec.granule(kernel)} : index
      {workgroup_share("%blocks")}
      %n_begin = arith.muli %first, %block : index
      %n_count = arith.muli %count, %block : index
      func.call @{symbol}({", ".join(pointers)}, %k, %n, %n_begin, %n_count)
          : ({signature}) -> ()
      return
    }}"""
    return _object_executable(name, obj, _workgroups(kernel, matvec), symbol, signature, func)


def q8_bytes(k: int) -> int:
    """Bytes of the packed quantized activation (cpu_matvec.h, Q8_BYTES)."""
    return k + 12 * (k // GROUP)


def _quantizer_text(name: str, kernel: Kernel, k: int, obj: Path) -> str:
    """The one-workgroup executable packing a K-element activation for `kernel`'s matvecs."""
    args, subspans, pointers, types = _bound([("x", "f32", k), ("q", "i8", q8_bytes(k))])
    signature = ", ".join([*types, "index"])
    func = f"""func.func @{name}({args}) {{
      %c0 = arith.constant 0 : index
      {subspans}
      %k = arith.constant {k} : index
      func.call @{kernel.quantizer}({", ".join(pointers)}, %k) : ({signature}) -> ()
      return
    }}"""
    return _object_executable(name, obj, 1, kernel.quantizer, signature, func)


def _hoisted_init(init: ir.Value, region: ir.Operation) -> ir.Value | None:
    """`init`, built inside `region` (the dispatch region rebuilds its consumer's init),
    rebuilt before it: the ops from its `tensor.empty` on, cloned. None if it reads a value of
    the region other than its own chain."""
    from iree.compiler import ir

    chain: list[ir.Operation] = []
    value = init
    while True:
        op = _producer(value)
        parent = op.parent if op is not None else None
        if op is None or parent is None or parent.operation != region:
            break  # defined outside the region already (a function argument or an op there)
        chain.append(op)
        if op.name == "tensor.empty":
            break
        if not op.name.startswith("linalg.") or len(op.results) != 1:
            return None
        value = op.operands[len(op.operands) - 1]
    mapping: list[tuple[ir.Value, ir.Value]] = []  # (in the region, its clone's)
    result = init
    for op in reversed(chain):
        clone = op.clone(ip=ir.InsertionPoint(region))
        for i, operand in enumerate(op.operands):
            new = next((b for a, b in mapping if a == operand), None)
            if new is not None:
                clone.operands[i] = new
                continue
            owner = _producer(operand)
            parent = owner.parent if owner is not None else None
            if parent is not None and parent.operation == region:
                clone.erase()  # reads something else computed in the region
                return None
        mapping.append((op.results[0], clone.results[0]))
        result = clone.results[0]
    return result


def _outside(value: ir.Value, region: ir.Operation) -> bool:
    owner = _producer(value)
    parent = owner.parent if owner is not None else None
    return parent is None or parent.operation != region


def _regions(module: ir.Operation) -> list[tuple[ir.Operation, ir.Operation]]:
    from iree.compiler import ir

    found: list[tuple[ir.Operation, ir.Operation]] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if MARK in op.attributes:
            parent = op.parent
            if parent is not None and parent.operation.name == "flow.dispatch.region":
                found.append((parent.operation, op))
            else:
                del op.attributes[MARK]
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    return found


def apply_kernels(module: ir.Operation, kernels: dict[str, tuple[Kernel, ...]]) -> list[str]:
    """Replace every marked matvec region by a dispatch of the first kernel of its form in
    `kernels` (select()) that takes it, and drop the marks; returns what was placed
    ("q4_matvec_avx2 2048x256": the kernel, K x N), one per matvec."""
    from iree.compiler import ir

    placed: list[str] = []
    added: set[str] = set()  # the executables appended to the module
    # (kernel, activation, the op holding the region, its packed form): the matvecs of one
    # activation (a layer's Q, K and V) share one quantizer dispatch
    packed: list[tuple[str, ir.Value, ir.Operation, ir.Value]] = []
    body = module.regions[0].blocks[0]

    def add(name: str, text: str) -> None:
        helper = ir.Module.parse(text)  # held while its ops move: freed, it would free them
        for op in list(helper.body.operations):
            body.append(op.detach_from_parent())
        added.add(name)

    for region, marked in _regions(module):
        form = ir.StringAttr(marked.attributes[MARK]).value
        del marked.attributes[MARK]
        if form not in kernels or len(region.results) != 1:
            continue
        matvec = MATVECS[form](marked)
        kernel = next((k for k in kernels[form] if matvec and _takes(k, matvec)), None)
        if matvec is None or kernel is None:
            continue
        if not all(_outside(v, region) for b, v, _, _ in matvec.operands if b != "init"):
            continue
        init = _hoisted_init(matvec.operands[-1][1], region)
        if init is None:
            continue
        if kernel.quantizes:
            x, holder = matvec.operands[0][1], region.parent.operation
            q8 = next((q for n, v, h, q in packed if (n, v, h) == (kernel.name, x, holder)), None)
            if q8 is None:
                q_name = f"__plex_{kernel.name}_quantize_{matvec.k}"
                if q_name not in added:
                    add(q_name, _quantizer_text(q_name, kernel, matvec.k, kernel_object(kernel)))
                with ir.InsertionPoint(region), region.location:
                    i8 = ir.IntegerType.get_signless(8)
                    q_type = ir.RankedTensorType.get([q8_bytes(matvec.k)], i8)
                    q8 = _dispatch(q_name, [x], q_type).results[0]
                packed.append((kernel.name, x, holder, q8))
            matvec.operands[0] = ("q8", q8, "i8", q8_bytes(matvec.k))
        name = f"__plex_{kernel.name}_{matvec.k}x{matvec.n}"
        if name not in added:
            add(name, _executable_text(name, kernel, matvec, kernel_object(kernel)))
        operands = [v for _, v, _, _ in matvec.operands[:-1]] + [init]
        with ir.InsertionPoint(region), region.location:
            dispatch = _dispatch(name, operands, region.results[0].type)
        region.results[0].replace_all_uses_with(dispatch.results[0])
        region.erase()
        placed.append(f"{kernel.name} {matvec.k}x{matvec.n}")
    return placed


def _dispatch(name: str, operands: list[ir.Value], result_type: ir.Type) -> ir.Operation:
    """`flow.dispatch @name::@name(operands)` -> result_type (static shapes, no workload; the
    entry point is named as its executable: IREE links the executables of a module into one,
    where entry points must differ)."""
    from iree.compiler import ir

    context = result_type.context
    return ir.Operation.create(
        "flow.dispatch",
        results=[result_type],
        operands=operands,
        attributes={
            "entry_points": ir.ArrayAttr.get(
                [ir.SymbolRefAttr.get([name, name], context)], context
            ),
            "operandSegmentSizes": ir.DenseI32ArrayAttr.get([0, len(operands), 0, 0], context),
        },
    )
