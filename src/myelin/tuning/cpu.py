"""The llvm-cpu search space: tile sizes and loop peeling of one contraction, every constraint
checked before a candidate is compiled.

IREE 3.13 accepts many inconsistent CPU configs silently and compiles them into slow code (an N
vector tile that is not a multiple of the SIMD width: hundreds of insert/extract ops; vector
tiles whose accumulators exceed the register file: spills in the hot loop; a dynamic M without
loop peeling: a fully masked main loop). `CpuTiles.violations` rejects those up front.

Knobs (for a contraction with one M, N and K dimension, plus batch dimensions tiled by 1):
  distribution     [dm, dn, 0]   workgroup tile, M and N; dm in DM, dn in DN
  vector tiles     [vm, vn, 0]   register tile; vn a multiple of the SIMD width
  vector_reduction [0, 0, vk]    K unroll
  peel             enable_loop_peeling in translation_info
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from myelin.tuning.spec import ContractionMatch

DM = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256)  # multiples of 6 and 12 too
DN = (8, 16, 32, 64, 128, 256)
VM = (1, 2, 4, 6, 8, 12, 16)
VN_LANES = (1, 2, 4)  # vn = lanes * SIMD width
VK = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class CpuTarget:
    """What the constraints need to know about the CPU: read from the executable target."""

    native_vector_bytes: int  # IREE's native_vector_size

    @property
    def vector_registers(self) -> int:
        return 32 if self.native_vector_bytes >= 64 else 16  # AVX-512: zmm0-31; AVX2: ymm0-15

    def lanes(self, element_bytes: int) -> int:
        return max(1, self.native_vector_bytes // element_bytes)


@dataclass(frozen=True)
class CpuTiles:
    dm: int
    dn: int
    vm: int
    vn: int
    vk: int
    peel: bool

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> CpuTiles:
        return cls(**data)

    def describe(self) -> str:
        peel = " peel" if self.peel else ""
        return f"dist {self.dm}x{self.dn} vec {self.vm}x{self.vn}x{self.vk}{peel}"

    def violations(self, op: ContractionMatch, target: CpuTarget) -> list[str]:
        """Why this config would not compile to sensible code for `op` (empty: it may)."""
        why = []
        if len(op.m) != 1 or len(op.n) != 1 or len(op.k) != 1:
            return ["only contractions with one M, N and K dimension are tuned"]
        lanes = target.lanes(element_bytes(op.out_type))
        (m,), (n,), (k,) = op.m, op.n, op.k
        if self.vm > self.dm or self.dm % self.vm:
            why.append(f"vector M tile {self.vm} does not divide distribution {self.dm}")
        if self.vn > self.dn or self.dn % self.vn:
            why.append(f"vector N tile {self.vn} does not divide distribution {self.dn}")
        if self.vn % lanes:
            why.append(f"vector N tile {self.vn} is not a multiple of the SIMD width {lanes}")
        # accumulators plus the broadcast A element (B can be an FMA memory operand): 16x32 and
        # 8x64 on AVX-512 (33 zmm) spilled in the hot loop, 8x32 (17) did not
        registers = self.vm * (self.vn // lanes) + 1
        if registers > target.vector_registers:
            why.append(
                f"{registers} vector registers needed (accumulators + broadcast), "
                f"{target.vector_registers} exist: it would spill"
            )
        if m is None and not self.peel:
            why.append("a dynamic M needs loop peeling (else the main loop is fully masked)")
        for name, size, dist, vec in (("M", m, self.dm, self.vm), ("N", n, self.dn, self.vn)):
            if size is None:
                continue
            if dist > _ceil_pow2(size):
                why.append(f"distribution {dist} exceeds {name} = {size}")
            if size % vec and not self.peel:
                why.append(f"{name} = {size} is not a multiple of {vec}: needs peeling")
        if k is not None and self.vk > k:
            why.append(f"K unroll {self.vk} exceeds K = {k}")
        return why

    def compilation_info(self, op: ContractionMatch) -> str:
        """The `#iree_codegen.compilation_info` attribute for `op` (loops in d0..dN order)."""
        roles = loop_roles(op)
        dist = [{"b": 1, "m": self.dm, "n": self.dn, "k": 0}[r] for r in roles]
        vec = [{"b": 1, "m": self.vm, "n": self.vn, "k": 0}[r] for r in roles]
        red = [self.vk if r == "k" else 0 for r in roles]
        peel = ", {enable_loop_peeling}" if self.peel else ""
        return (
            "#iree_codegen.compilation_info<lowering_config = #iree_cpu.lowering_config<"
            f"distribution = {dist}, vector_common_parallel = {vec}, vector_reduction = {red}>, "
            "translation_info = #iree_codegen.translation_info<pipeline = "
            f"#iree_cpu.pipeline<DoubleTilingExpert>{peel}>>"
        )


def space() -> dict[str, tuple]:
    """The knobs and their values (the search parametrization is built from this)."""
    return {"dm": DM, "dn": DN, "vm": VM, "vn_lanes": VN_LANES, "vk": VK, "peel": (True, False)}


def tiles_from_choice(choice: dict, op: ContractionMatch, target: CpuTarget) -> CpuTiles:
    lanes = target.lanes(element_bytes(op.out_type))
    return CpuTiles(
        choice["dm"],
        choice["dn"],
        choice["vm"],
        choice["vn_lanes"] * lanes,
        choice["vk"],
        bool(choice["peel"]),
    )


def _ceil_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def element_bytes(type_name: str) -> int:
    bits = re.search(r"(\d+)$", type_name)
    return max(1, int(bits.group(1)) // 8) if bits else 4


# --- reading the contractions out of configured IR ------------------------------------------

_FUNC = re.compile(r"func\.func @([\w$.-]+)\(")
# The root op of a dispatch is the one whose lowering_config distributes it.
_ROOT = re.compile(r"(linalg\.(?:batch_)?matmul|linalg\.generic)\b.*\bdistribution = ")
# on GPU targets the root op is the one IREE gave a workgroup tile
_GPU_ROOT = re.compile(
    r"(linalg\.(?:batch_)?matmul|linalg\.generic)\b.*\blowering_config = #iree_gpu\.lowering_config"
    r"<\{[^}]*\bworkgroup = "
)
_ALIAS = re.compile(r"^(#[\w.$-]+) = (.*)$", re.MULTILINE)
_TENSOR = re.compile(r"tensor<([^>]*)>")
_MAP = re.compile(r"affine_map<\(([^)]*)\)\s*->\s*\(([^)]*)\)>")
_NATIVE_VECTOR = re.compile(r"native_vector_size\s*=\s*(\d+)")
_DEFAULT_MAPS = {
    "linalg.matmul": (
        "affine_map<(d0, d1, d2) -> (d0, d2)>",
        "affine_map<(d0, d1, d2) -> (d2, d1)>",
        "affine_map<(d0, d1, d2) -> (d0, d1)>",
    ),
    "linalg.batch_matmul": (
        "affine_map<(d0, d1, d2, d3) -> (d0, d1, d3)>",
        "affine_map<(d0, d1, d2, d3) -> (d0, d3, d2)>",
        "affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>",
    ),
}


@dataclass(frozen=True)
class ConfiguredContraction:
    """A dispatch whose root op is a contraction, as IREE configured it."""

    dispatch: str
    match: ContractionMatch
    default_config: str  # IREE's lowering_config, for the report


def loop_roles(op: ContractionMatch) -> list[str]:
    """Each loop's role ("b", "m", "n", "k") in d0..dN order, from the indexing maps."""
    lhs, rhs, out = (_map_results(m) for m in op.indexing_maps[:3])
    roles = []
    for d in range(op.loops):
        a, b, c = d in lhs, d in rhs, d in out
        roles.append("b" if a and b and c else "m" if a and c else "n" if b and c else "k")
    return roles


def _map_results(text: str) -> list[int]:
    m = _MAP.search(text)
    if m is None:
        return []
    return [int(x.strip()[1:]) for x in m.group(2).split(",") if x.strip().startswith("d")]


def _tensor(text: str) -> tuple[list[int | None], str]:
    *dims, element = text.split("x")
    return [None if d == "?" else int(d) for d in dims], element


def configured_contractions(ir_text: str, *, gpu: bool = False) -> list[ConfiguredContraction]:
    """Dispatches of configured IR (`executable-configurations` phase) whose root op is a
    matmul-like contraction with projected-permutation maps (`gpu`: IR of a GPU target)."""
    root = _GPU_ROOT if gpu else _ROOT
    found = []
    ir_text = expand_aliases(ir_text)
    funcs = list(_FUNC.finditer(ir_text))
    for i, f in enumerate(funcs):
        body = ir_text[f.end() : funcs[i + 1].start() if i + 1 < len(funcs) else len(ir_text)]
        line = next((ln for ln in body.splitlines() if root.search(ln)), None)
        if line is None:
            continue
        op_name = root.search(line).group(1)
        if " ins(" not in line:
            continue
        ins = line[line.index(" ins(") :]
        tensors = [_tensor(t) for t in _TENSOR.findall(ins)]
        if len(tensors) < 3:
            continue
        maps = tuple(f"affine_map<({d}) -> ({r})>" for d, r in _MAP.findall(line)[:3])
        if op_name in _DEFAULT_MAPS and len(maps) < 3:
            maps = _DEFAULT_MAPS[op_name]
        if len(maps) != 3 or ("reduction" not in line and op_name == "linalg.generic"):
            continue
        (a_shape, a_t), (b_shape, b_t), (c_shape, c_t) = tensors[0], tensors[1], tensors[-1]
        loops = len(_MAP.search(maps[0]).group(1).split(","))
        sizes: list[int | None] = [None] * loops
        for shape, m in ((a_shape, maps[0]), (b_shape, maps[1]), (c_shape, maps[2])):
            for pos, d in enumerate(_map_results(m)):
                if pos < len(shape) and shape[pos] is not None:
                    sizes[d] = shape[pos]
        roles = loop_roles(ContractionMatch(a_t, b_t, c_t, maps, (None,) * loops, (), (), ()))
        dims = {r: tuple(sizes[d] for d in range(loops) if roles[d] == r) for r in "bmnk"}
        if not dims["m"] or not dims["n"] or not dims["k"]:
            continue
        config = re.search(r"lowering_config = (#iree_(?:cpu|gpu)\.lowering_config<[^>]*>)", line)
        found.append(
            ConfiguredContraction(
                dispatch=f.group(1),
                match=ContractionMatch(
                    a_t, b_t, c_t, maps, dims["b"], dims["m"], dims["n"], dims["k"]
                ),
                default_config=config.group(1) if config else "",
            )
        )
    return found


def expand_aliases(ir_text: str) -> str:
    """IR text with its attribute aliases (`#config1 = ...`, `#map = ...`) written out, so that
    each op's line says everything about it."""
    aliases = dict(_ALIAS.findall(ir_text))
    if not aliases:
        return ir_text
    pattern = re.compile(
        "|".join(re.escape(a) + r"(?![\w.$-])" for a in sorted(aliases, key=len, reverse=True))
    )
    body = _ALIAS.sub("", ir_text)
    for _ in range(4):  # aliases may refer to aliases
        body = pattern.sub(lambda m: aliases[m.group(0)], body)
    return body


def cpu_target_of(ir_text: str) -> CpuTarget:
    m = _NATIVE_VECTOR.search(ir_text)
    return CpuTarget(int(m.group(1)) if m else 16)
