"""Placement: which named device runs each graph and entrypoint, said in terms IREE honours.

IREE 3.13 honours `stream.affinity` on a module or a function, `iree.abi.affinity` on the
arguments and results of a public function, and explicit `flow.tensor.transfer`s; it ignores
affinity on single ops (measured on IREE 3.13.0). Where the sources of one dispatch disagree
(arguments on two devices, a transfer inside a function placed elsewhere), Stream silently
picks one device. So placement happens in two steps, one per phase:

1. `apply_placement` (at the `input` phase): module and function affinities, and ABI affinities
   on the placed functions' tensor arguments and results, so that their buffers are imported on
   and exported from the placed device.
2. `resolve_dispatch_affinities` (at the `dispatch-creation` phase, the first at which dispatches
   exist as ops): each `flow.dispatch.workgroups` gets the one affinity its sources agree on, as
   its own `stream.affinity` (IREE honours it on the dispatch from there on); a dispatch whose
   sources disagree is a CompileError naming the ops and their source locations.

Then the official pipeline resumes from `dispatch-creation` (see `pipeline.compile_imported`).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from iree.compiler import ir

from myelin.errors import CompileError

# The phase at which dispatches are outlined ops; PLeX's dispatch pass runs on IR at this phase
# and the compile resumes from it (resuming from another phase silently miscompiles).
PLACEMENT_PHASE = "dispatch-creation"

AFFINITY = "stream.affinity"
ABI_AFFINITY = "iree.abi.affinity"

# Ops whose tensor results live where their tensor operands live: looked through when finding
# where a dispatch's operand comes from.
_SAME_PLACE_OPS = frozenset(
    {
        "flow.tensor.tie_shape",
        "flow.tensor.reshape",
        "flow.tensor.bitcast",
        "flow.tensor.clone",
        "flow.tensor.slice",
        "flow.tensor.update",
        "flow.tensor.encode",
        "hal.tensor.barrier",
        "tensor.cast",
    }
)
# Ops inside a dispatch that do not name it (a fill initializes, the others are region parts).
_NOT_ROOT_OPS = frozenset({"linalg.fill", "linalg.yield", "linalg.index"})
_DEVICE = re.compile(r"@([\w.$-]+)")
_LOCATION = re.compile(r'"([^"]+)":(\d+):(\d+)')


@dataclass(frozen=True)
class Placement:
    """Where one graph's code runs in one variant: a device for the whole module and/or for
    single public functions; anything unplaced runs on the variant's first device."""

    module_device: str | None = None
    function_devices: Mapping[str, str] = field(default_factory=dict)

    def device_of(self, function: str, default: str) -> str:
        return self.function_devices.get(function) or self.module_device or default

    @property
    def empty(self) -> bool:
        return self.module_device is None and not self.function_devices


# `(function glob or None, device)`: None places the whole module.
PlacementRule = tuple[str | None, str]


def resolve_placement(
    rules: Sequence[PlacementRule],
    functions: Sequence[str],
    devices: Sequence[str],
    *,
    what: str = "graph",
) -> Placement:
    """Placement of one graph from the rules that name it: `(None, device)` places the graph,
    `(function_glob, device)` places its matching public functions.

    A function rule beats a graph rule; among rules of one kind the first listed wins. Rules
    for devices this variant lacks are skipped (a CPU-only fallback variant runs everything on
    its device). A function rule that matches no function is an error: it is a typo.
    """
    module_device = None
    function_devices: dict[str, str] = {}
    for glob, device in rules:
        if glob is None:
            if module_device is None and device in devices:
                module_device = device
            continue
        matched = [f for f in functions if fnmatch.fnmatchcase(f, glob)]
        if not matched:
            raise CompileError(
                f"{what}: placement of functions {glob!r} matches none; the graph's functions "
                f"are: {', '.join(functions) or 'none'}"
            )
        if device in devices:
            for f in matched:
                function_devices.setdefault(f, device)
    return Placement(module_device, function_devices)


# -- step 1: input phase ---------------------------------------------------------------------------


def _promise(device: str) -> ir.Attribute:
    return ir.Attribute.parse(f"#hal.device.promise<@{device}>")


def _top_level(module: ir.Operation) -> Iterator[ir.Operation]:
    for op in module.regions[0].blocks[0].operations:
        yield op.operation


def _function_name(op: ir.Operation) -> str:
    return ir.StringAttr(op.attributes["sym_name"]).value


def _is_public(op: ir.Operation) -> bool:
    attrs = op.attributes
    return "sym_visibility" not in attrs or ir.StringAttr(attrs["sym_visibility"]).value == "public"


def apply_placement(module: ir.Operation, placement: Placement) -> None:
    """Set module/function affinities and the ABI affinities of placed public functions.

    Call inside the module's context. Affinities the source already states are kept: if they
    contradict the placement, the dispatch pass reports the dispatches that read both.
    """
    if placement.empty:
        return
    if placement.module_device is not None:
        module.attributes[AFFINITY] = _promise(placement.module_device)
    for op in _top_level(module):
        if op.name not in ("util.func", "func.func") or not _is_public(op):
            continue
        device = placement.function_devices.get(_function_name(op), placement.module_device)
        if device is None:
            continue
        if _function_name(op) in placement.function_devices:
            op.attributes[AFFINITY] = _promise(device)
        _set_abi_affinities(op, device)


def _set_abi_affinities(op: ir.Operation, device: str) -> None:
    ftype = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
    attr = _promise(device)
    for key, types in (("arg_attrs", ftype.inputs), ("res_attrs", ftype.results)):
        old = list(ir.ArrayAttr(op.attributes[key])) if key in op.attributes else []
        new = []
        for i, t in enumerate(types):
            entries = {}
            if i < len(old):
                d = ir.DictAttr(old[i])
                entries = {d[j].name: d[j].attr for j in range(len(d))}
            if isinstance(t, ir.RankedTensorType) and ABI_AFFINITY not in entries:
                entries[ABI_AFFINITY] = attr
            new.append(ir.DictAttr.get(entries))
        if types:
            op.attributes[key] = ir.ArrayAttr.get(new)


# -- step 2: dispatch-creation phase ---------------------------------------------------------------


@dataclass(frozen=True)
class _Source:
    """Something that says where a dispatch should run."""

    what: str  # for people: "function @f", "argument 'input0'", "flow.tensor.transfer"
    affinity: ir.Attribute
    location: str

    @property
    def key(self) -> str:
        # IREE prints a resolved promise as #hal.device.affinity<@d>; compare by what it names.
        return str(self.affinity).replace("#hal.device.promise<", "#hal.device.affinity<")

    def describe(self) -> str:
        where = f" at {self.location}" if self.location else ""
        return f"{self.what} on {_device_name(self.affinity)}{where}"


@dataclass(frozen=True)
class DispatchAffinity:
    """The outcome for one dispatch: which function it is in and where it runs (None: the
    sources name no device, IREE's default applies)."""

    function: str
    index: int  # position among the function's dispatches; IREE names it <function>_dispatch_<i>
    root: str  # the main op inside, e.g. linalg.matmul
    device: str | None


def _device_name(affinity: ir.Attribute) -> str:
    m = _DEVICE.search(str(affinity))
    return f"@{m.group(1)}" if m else str(affinity)


def short_location(loc: ir.Location) -> str:
    """`file:line:col` of the first file location in `loc` (fused and call-site locations
    hold several); empty when there is none."""
    m = _LOCATION.search(str(loc))
    return f"{m.group(1)}:{m.group(2)}:{m.group(3)}" if m else ""


def _sources_of(value: ir.Value, seen: dict) -> list[_Source]:
    """Placement sources that reach `value` through ops that keep data in place."""
    key = value  # ir.Value hashes by identity of the underlying SSA value
    if key in seen:
        return seen[key]
    seen[key] = []
    owner = value.owner
    if not isinstance(owner, ir.Operation | ir.OpView):
        return []  # a block argument: no placement of its own
    op = owner.operation if isinstance(owner, ir.OpView) else owner
    found: list[_Source] = []
    if op.name == "flow.tensor.transfer" and "target" in op.attributes:
        found.append(
            _Source("flow.tensor.transfer", op.attributes["target"], short_location(op.location))
        )
    elif op.name == "hal.tensor.import" and "affinity" in op.attributes:
        name = ir.StringAttr(op.attributes["name"]).value if "name" in op.attributes else "?"
        found.append(
            _Source(f"argument '{name}'", op.attributes["affinity"], short_location(op.location))
        )
    elif op.name in _SAME_PLACE_OPS:
        for operand in op.operands:
            if isinstance(operand.type, ir.RankedTensorType):
                found.extend(_sources_of(operand, seen))
    seen[key] = found
    return found


def _root_op(dispatch: ir.Operation) -> ir.Operation:
    """The op a person would name the dispatch by: its first linalg op that is not a fill."""
    first = None
    for op in walk_region(dispatch.regions[0]):
        if first is None and not op.name.startswith(("iree_tensor_ext.", "arith.", "tensor.")):
            first = op
        if op.name.startswith("linalg.") and op.name not in _NOT_ROOT_OPS:
            return op
    return first or dispatch


def walk_region(region: ir.Region) -> Iterator[ir.Operation]:
    """Every op in `region`, nested ones included, in order (IR passes of PLeX share it)."""
    for block in region.blocks:
        for op in block.operations:
            op = op.operation
            yield op
            for inner in op.regions:
                yield from walk_region(inner)


def find_ops(root: ir.Operation, keep: Callable[[ir.Operation], bool]) -> list[ir.Operation]:
    """Every op nested in `root` that `keep` accepts, in IR order: collected whole before the
    caller rewrites any of them (a rewrite while walking would skip or revisit ops)."""
    return [op for region in root.regions for op in walk_region(region) if keep(op)]


def resolve_dispatch_affinities(
    module: ir.Operation, *, what: str = "module"
) -> list[DispatchAffinity]:
    """Copy each dispatch's single resolved affinity onto it; raise for mixed sources.

    A dispatch's sources are its function's affinity (else the module's) and, through its
    operands, the transfers and the arguments with affinities that produce them. Results of
    other dispatches and calls are not sources: Stream moves them where the consumer runs.
    Call inside the module's context, on IR at PLACEMENT_PHASE.
    """
    for op in _top_level(module):
        if op.name == "flow.executable":
            raise CompileError(
                f"{what}: the dispatch pass got IR past the '{PLACEMENT_PHASE}' phase "
                "(it holds flow.executable ops); resuming from it would silently miscompile"
            )
    module_affinity = module.attributes.get(AFFINITY, None)
    outcomes: list[DispatchAffinity] = []
    mixed: list[str] = []
    for fn in _top_level(module):
        if fn.name not in ("util.func", "util.initializer"):
            continue
        fn_name = _function_name(fn) if "sym_name" in fn.attributes else "initializer"
        if not _is_public(fn) and fn_name.startswith("_"):
            fn_name = fn_name[1:]  # the ABI pass renames the body of public @f to private @_f
        fn_affinity = fn.attributes.get(AFFINITY, module_affinity)
        seen: dict = {}
        index = 0
        for op in (o for region in fn.regions for o in walk_region(region)):
            if op.name != "flow.dispatch.workgroups":
                continue
            sources = []
            if fn_affinity is not None:
                scope = "function" if AFFINITY in fn.attributes else "module"
                where = short_location(fn.location) if scope == "function" else ""
                sources.append(_Source(f"{scope} @{fn_name}", fn_affinity, where))
            for operand in op.operands:
                sources.extend(_sources_of(operand, seen))
            root = _root_op(op)
            distinct = {s.key: s for s in sources}
            if len(distinct) > 1:
                loc = short_location(root.location) or short_location(op.location)
                mixed.append(
                    f"dispatch {index} of @{fn_name} ({root.name}"
                    f"{' at ' + loc if loc else ''}) reads from sources on different devices: "
                    + "; ".join(s.describe() for s in _unique(sources))
                )
            device = None
            if len(distinct) == 1:
                source = next(iter(distinct.values()))
                op.attributes[AFFINITY] = source.affinity
                device = _device_name(source.affinity).lstrip("@")
            outcomes.append(DispatchAffinity(fn_name, index, root.name, device))
            index += 1
    if mixed:
        more = f" (and {len(mixed) - 1} more)" if len(mixed) > 1 else ""
        raise CompileError(
            f"{what}: {mixed[0]}{more}; IREE would silently run it on one of them. Make the "
            "sources agree: place the function on one device and move other operands there "
            "with flow.tensor.transfer"
        )
    return outcomes


def _unique(sources: list[_Source]) -> list[_Source]:
    out: list[_Source] = []
    for s in sources:
        if all(s.describe() != o.describe() for o in out):
            out.append(s)
    return out
