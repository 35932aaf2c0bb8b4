"""q4 matvecs on AVX2 CPUs: a C kernel (`q4_matvec_avx2.c`) linked into IREE's executable.

IREE 3.13's llvm-cpu codegen turns q4's grouped matvec (myelin.codecs._matvec) into float
FMAs, one per weight after unpacking and converting the 4-bit codes (0.77 instructions per
weight): compute-bound on an AVX2 core, slower than int8. It does not emit AVX2's integer dot
products (`vpmaddubsw`, `vpmaddwd`) from linalg, not even for an integer matvec written for
them. The kernel does what llama.cpp's Q4_0 x Q8_0 does: the activation quantized to 8 bits
once per call and group, the codes multiplied with it in integers, the group's factors applied
in f32 once per group and output (the C file says how).

How it reaches IREE, at its public boundary: the compile step of an llvm-cpu variant whose CPU
has AVX2 and FMA replaces each marked grouped-matvec region (`MARK`, set by the encode step on
a K-major q4 matvec) by a `flow.dispatch` of a `stream.executable` whose workgroups call the
kernel on their share of the outputs. The executable carries the kernel's object file
(`hal.executable.objects`, built here by gcc) and IREE's linker links it into the executable's
embedded ELF (the call is `hal.import.static`). The object is a file in the system temp dir,
named by its digest: IREE 3.13 links an object given as `data` as an empty file. The bindings
are the encoded parameters themselves (read in place from the .mln), the activation and the
consumer's init. Every other variant (cuda, vmvx, a CPU without AVX2, a shape the kernel does
not take, a build machine without gcc) keeps the grouped matvec. `hal.dispatch.extern` would
be the shorter spelling, but it crashes iree-compile 3.13 on llvm-cpu.
"""

from __future__ import annotations

import hashlib
import math
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from myelin.compiler.workgroup_split import workgroup_share
from myelin.errors import CompileError

if TYPE_CHECKING:
    from iree.compiler import ir

# On the grouped matvec's sum op: "kn" when its codes are stored K-major ([K / g, g, N]), "nk"
# otherwise (the kernel reads K-major codes only).
MARK = "plex.q4_matvec"
SOURCE = Path(__file__).with_name("q4_matvec_avx2.c")
SYMBOL = "plex_q4_matvec_avx2"
GROUP = 32  # the kernel's group (q4's default); other groups keep the grouped matvec
BLOCK = 64  # outputs per kernel block: N must be a multiple
MAX_K = 8192  # the kernel's stack holds the quantized activation
MAX_WORKGROUPS = 32  # each re-quantizes the activation (K operations): a few per worker
# Freestanding: the object is linked into an embedded ELF (no libc, no unwind tables, no
# stack protector, no loops turned into memset/memcpy calls).
CFLAGS = (
    "-O3",
    "-mavx2",
    "-mfma",
    "-fPIC",
    "-ffreestanding",
    "-fno-builtin",
    "-fno-stack-protector",
    "-fno-tree-loop-distribute-patterns",
    "-fno-asynchronous-unwind-tables",
    "-fno-ident",
)


def digest() -> str:
    """The kernel source's and flags' digest: part of the compile key (a new kernel recompiles)."""
    source = SOURCE.read_bytes() if SOURCE.exists() else b"(no kernel source)"
    text = source + " ".join(CFLAGS).encode()
    return hashlib.sha256(text).hexdigest()[:16]


def kernel_object() -> Path:
    """The kernel's x86-64 object file, compiled once per kernel digest into the system temp
    dir (again if something deleted it). IREE 3.13's llvm-cpu linker reads an object by
    `path` only: one given as `data` links as an empty file (undefined symbol), or crashes
    iree-compile when it has no path."""
    folder = Path(tempfile.gettempdir()) / "plex-kernels"
    target = folder / f"q4_matvec_avx2-{digest()}.o"
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="plex-q4-", dir=folder) as tmp:
        out = Path(tmp) / "q4.o"
        try:
            subprocess.run(
                ["gcc", *CFLAGS, "-c", str(SOURCE), "-o", str(out)],
                check=True,
                capture_output=True,
                text=True,
            )
        except FileNotFoundError as e:
            raise CompileError("the q4 AVX2 kernel needs gcc on the build machine") from e
        except subprocess.CalledProcessError as e:
            raise CompileError(f"gcc failed on {SOURCE.name}: {e.stderr.strip()[-800:]}") from e
        out.replace(target)  # atomic: concurrent compiles see a whole file or none
    return target


def applies(devices: Sequence[Any]) -> bool:
    """Whether a variant on these devices (TargetDevice) runs q4 matvecs in the kernel: one
    x86-64 llvm-cpu device with AVX2 and FMA (the host's CPU for `cpu = "host"`, else the
    features it names), built where gcc and the kernel's source are (else the grouped matvec,
    as before the kernel)."""
    from myelin import hostinfo

    if len(devices) != 1 or devices[0].target != "llvm-cpu" or hostinfo.machine() != "x86_64":
        return False
    if shutil.which("gcc") is None or not SOURCE.exists():
        return False
    device = devices[0]
    if device.cpu_features:
        named = set(device.cpu_features.split(","))
        return {"+avx2", "+fma"} <= named
    if (device.cpu or "host") != "host":
        return False
    return {"avx2", "fma"} <= hostinfo.cpu_flags()


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


def _executable_text(name: str, k: int, n: int, workgroups: int, obj: Path) -> str:
    dyn = "strided<[1], offset: ?>"
    # (binding, element type, elements) in the kernel's argument order; the codes are bytes
    bindings = [
        ("x", "f32", k),
        ("codes", "i8", k * n // 2),
        ("scale", "i8", k // GROUP * n),
        ("offset", "i8", k // GROUP * n),
        ("rs", "f32", n),
        ("ro", "f32", n),
        ("init", "f32", n),
        ("out", "f32", n),
    ]
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
    signature = ", ".join([*types, "index", "index", "index", "index"])
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
    func.func private @{SYMBOL}({signature}) attributes {{hal.import.static, llvm.bareptr = true}}
    func.func @{name}({args}) {{
      %c0 = arith.constant 0 : index
      {chr(10).join("      " + s for s in subspans).lstrip()}
      %k = arith.constant {k} : index
      %n = arith.constant {n} : index
      %blocks = arith.constant {n // BLOCK} : index
      %block = arith.constant {BLOCK} : index
      {workgroup_share("%blocks")}
      %n_begin = arith.muli %first, %block : index
      %n_count = arith.muli %count, %block : index
      func.call @{SYMBOL}({", ".join(pointers)}, %k, %n, %n_begin, %n_count)
          : ({signature}) -> ()
      return
    }}
  }}
}}
"""


def _operands(total: ir.Operation) -> dict[str, ir.Value] | None:
    """The grouped matvec's inputs, found from its sum op (myelin.codecs._matvec.emit_grouped):
    the activation, the codes, the four factor parts and the init; None if the IR is not the
    one emit_grouped builds."""
    if len(total.operands) != 7:
        return None
    p_op, xs_op = _producer(total.operands[0]), _producer(total.operands[1])
    if p_op is None or xs_op is None or p_op.name != "linalg.generic":
        return None
    unpack = _producer(p_op.operands[1])
    expand = _producer(xs_op.operands[0])
    if unpack is None or expand is None or expand.name != "tensor.expand_shape":
        return None
    return {
        "x": expand.operands[0],
        "codes": unpack.operands[0],
        "scale": total.operands[2],
        "offset": total.operands[3],
        "rs": total.operands[4],
        "ro": total.operands[5],
        "init": total.operands[6],
    }


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


def _regions(module: ir.Operation) -> list[tuple[ir.Operation, ir.Operation]]:
    from iree.compiler import ir

    found: list[tuple[ir.Operation, ir.Operation]] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if MARK in op.attributes:
            parent = op.parent
            if parent is not None and parent.operation.name == "flow.dispatch.region":
                found.append((parent.operation, op))
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    return found


def apply_kernel(module: ir.Operation, use: bool) -> list[str]:
    """Replace every marked q4 matvec region by a dispatch of the kernel if `use` (applies()),
    and drop the marks; returns the shapes placed (`K x N`), one per matvec."""
    from iree.compiler import ir

    placed: list[str] = []
    executables: dict[tuple[int, int], str] = {}
    body = module.regions[0].blocks[0]
    for region, total in _regions(module):
        orientation = ir.StringAttr(total.attributes[MARK]).value
        del total.attributes[MARK]
        if not use or orientation != "kn":
            continue
        found = _operands(total)
        if found is None:
            continue
        codes = _dims(found["codes"])
        if len(codes) != 3 or codes[1] != GROUP:
            continue
        groups, _, n = codes
        k = groups * GROUP
        if (
            n % BLOCK
            or k > MAX_K
            or math.prod(_dims(found["x"]) or [0]) != k
            or math.prod(_dims(found["init"]) or [0]) != n
            or _dims(found["scale"]) != [groups, n]
            or _dims(found["offset"]) != [groups, n]
        ):
            continue
        init = _hoisted_init(found["init"], region)
        if init is None:
            continue
        name = executables.get((k, n))
        if name is None:
            name = executables[(k, n)] = f"__plex_q4_matvec_{k}x{n}"
            workgroups = min(n // BLOCK, MAX_WORKGROUPS)
            helper = ir.Module.parse(_executable_text(name, k, n, workgroups, kernel_object()))
            for op in list(helper.body.operations):
                body.append(op.detach_from_parent())
        operands = [found[p] for p in ("x", "codes", "scale", "offset", "rs", "ro")] + [init]
        with ir.InsertionPoint(region), region.location:
            dispatch = _dispatch(name, operands, region.results[0].type)
        region.results[0].replace_all_uses_with(dispatch.results[0])
        region.erase()
        placed.append(f"{k}x{n}")
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
