"""The manifest as typed, frozen records: parsed and checked once, read everywhere.

`ArtifactManifest.from_json` is the manifest's one schema. It checks every field's type and
range (dtypes, size formulas, policies, limits on shapes and sizes) and every cross-reference
(sections, modules, devices, parameter byte ranges), and raises ManifestInvalid naming the first
bad field. The reader runs it on what it reads, the writer on what it is about to write, so the
writer cannot produce a file the reader rejects, and the runtime, `plex inspect` and profiling
read records instead of walking dicts.

`to_json()` gives back the dict the build wrote: the same keys and values, so a manifest that
goes through the records is written byte for byte as before. Keys a record does not know (a newer
minor version's fields) are kept in its `extras` and written back.
"""

from __future__ import annotations

import copy
import itertools
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from myelin.dtypes import MLIR_TO_NUMPY
from myelin.mln._layout import FORMAT_MINOR, MIN_ALIGNMENT, SECTION_ALIGNMENT, SectionEntry
from myelin.mln._manifest import ManifestInvalid
from myelin.signature import Signature, TensorSpec
from myelin.size_formulas import SIZE_OPS
from myelin.untrusted import FILE_NAME_PATTERN, relative_path_problem

# --- vocabularies and limits (docs/mln-format.md) ------------------------------------------------

RESIDENCY_MODES = ("resident", "streamed", "prefetch")
TENSOR_DTYPES = frozenset(MLIR_TO_NUMPY.values())
# Bits per element of every dtype a parameter may be stored as (`storage.dtype`).
STORAGE_BITS: Mapping[str, int] = {
    "bool": 8,
    "int4": 4,
    "uint4": 4,
    "int8": 8,
    "uint8": 8,
    "int16": 16,
    "uint16": 16,
    "int32": 32,
    "uint32": 32,
    "int64": 64,
    "uint64": 64,
    "float16": 16,
    "bfloat16": 16,
    "float32": 32,
    "float64": 64,
    "float8_e4m3fn": 8,
    "float8_e4m3fnuz": 8,
    "float8_e5m2": 8,
    "float8_e5m2fnuz": 8,
}

# Limits: an artifact that declares more is refused at load, before anything is sized from it.
MAX_COUNT = 2**63 - 1  # every integer field fits the int64 / u64 that IREE and numpy use
MAX_RANK = 64
MAX_TENSOR_BYTES = 2**44  # 16 TiB: the static part of one argument or result
MAX_FORMULA_DEPTH = 64

SizeFormula = int | tuple  # an integer, ("dim", input, axis) or (op, formula, formula)

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


# --- reading one JSON object ---------------------------------------------------------------------


def _show(value: Any) -> str:
    text = "null" if value is None else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


class _Object:
    """One JSON object being parsed: typed getters that name the field they read, and the keys
    no getter read (the record's extras)."""

    def __init__(self, value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise ManifestInvalid(where, f"must be an object, got {_show(value)}")
        self.data = value
        self.where = where
        self._read: set[str] = set()

    def path(self, key: str) -> str:
        return _join(self.where, key)

    def has(self, key: str) -> bool:
        return key in self.data

    def value(self, key: str) -> Any:
        self._read.add(key)
        if key not in self.data:
            raise ManifestInvalid(self.path(key), "is missing")
        return self.data[key]

    def optional(self, key: str, parse: Callable[[Any, str], Any]) -> Any:
        self._read.add(key)
        return parse(self.data[key], self.path(key)) if key in self.data else None

    def required(self, key: str, parse: Callable[[Any, str], Any]) -> Any:
        return parse(self.value(key), self.path(key))

    def string(self, key: str) -> str:
        return self.required(key, _string)

    def count(self, key: str) -> int:
        return self.required(key, _count)

    def objects(self, key: str) -> Iterator[_Object]:
        items = self.required(key, _list)
        for i, item in enumerate(items):
            yield _Object(item, f"{self.path(key)}[{i}]")

    def extras(self) -> dict[str, Any]:
        return {k: v for k, v in self.data.items() if k not in self._read}


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise ManifestInvalid(where, f"must be a list, got {_show(value)}")
    return value


def _dict(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ManifestInvalid(where, f"must be an object, got {_show(value)}")
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ManifestInvalid(where, f"must be a non-empty string, got {_show(value)}")
    return value


def _file_name(value: Any, where: str) -> str:
    """A name that becomes one file name (plex profile writes `<scope>.irpa`, `<module>.vmfb`,
    `<backend>-plugin.so`): refused at load unless it is a plain file name."""
    name = _string(value, where)
    if not re.fullmatch(FILE_NAME_PATTERN, name):
        raise ManifestInvalid(where, f"must match {FILE_NAME_PATTERN}, got {_show(name)}")
    return name


def _file_names(value: Any, where: str) -> tuple[str, ...]:
    return tuple(_file_name(item, f"{where}[{i}]") for i, item in enumerate(_list(value, where)))


def _relative_path(value: Any, where: str) -> str:
    text = _string(value, where)
    problem = relative_path_problem(text)
    if problem is not None:
        raise ManifestInvalid(where, f"{problem}, got {_show(text)}")
    return text


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def _count(value: Any, where: str) -> int:
    if not _is_count(value):
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_COUNT:
            raise ManifestInvalid(where, f"must be at most {MAX_COUNT}, got {_show(value)}")
        raise ManifestInvalid(where, f"must be an integer >= 0, got {_show(value)}")
    return value


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ManifestInvalid(where, f"must be true or false, got {_show(value)}")
    return value


def _strings(value: Any, where: str) -> tuple[str, ...]:
    return tuple(_string(item, f"{where}[{i}]") for i, item in enumerate(_list(value, where)))


def _counts(value: Any, where: str) -> tuple[int, ...]:
    return tuple(_count(item, f"{where}[{i}]") for i, item in enumerate(_list(value, where)))


def _string_map(value: Any, where: str) -> dict[str, str]:
    return {k: _string(v, f"{where}[{k!r}]") for k, v in _dict(value, where).items()}


def _dtype(value: Any, where: str, known: frozenset[str] = TENSOR_DTYPES) -> str:
    name = _string(value, where)
    if name not in known:
        raise ManifestInvalid(
            where, f"unknown dtype {_show(name)} (expected one of {', '.join(sorted(known))})"
        )
    return name


def _unique(name: Any, seen: set, where: str, what: str) -> None:
    if name in seen:
        raise ManifestInvalid(where, f"duplicate {what} {_show(name)}")
    seen.add(name)


def _json_copy(value: Any) -> Any:
    return copy.deepcopy(value)


def _with_extras(data: dict[str, Any], extras: Mapping[str, Any]) -> dict[str, Any]:
    return {**data, **_json_copy(dict(extras))}


# --- size formulas -------------------------------------------------------------------------------


def parse_size_formula(
    value: Any, where: str, inputs: tuple[TensorSpec, ...], depth: int = 0
) -> SizeFormula:
    """A size formula checked against the entrypoint's inputs: every `dim` names an axis that
    exists, every operator is known and takes two operands."""
    if depth > MAX_FORMULA_DEPTH:
        raise ManifestInvalid(where, f"size formula nests deeper than {MAX_FORMULA_DEPTH}")
    if isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > MAX_COUNT:
            raise ManifestInvalid(where, f"size {value} is out of range")
        return value
    if not isinstance(value, list) or not value or not isinstance(value[0], str):
        raise ManifestInvalid(
            where,
            'must be a size formula (an integer, ["dim", input, axis] or [op, x, y]), '
            f"got {_show(value)}",
        )
    op = value[0]
    if op == "dim":
        if len(value) != 3:
            raise ManifestInvalid(
                where, f'["dim", input, axis] takes 2 operands, got {_show(value)}'
            )
        arg, axis = _count(value[1], f"{where}[1]"), _count(value[2], f"{where}[2]")
        if arg >= len(inputs):
            raise ManifestInvalid(
                where, f"reads input {arg}, but the entrypoint has {len(inputs)} input(s)"
            )
        shape = inputs[arg].shape
        if shape is None or axis >= len(shape):
            rank = "a scalar" if shape is None else f"of rank {len(shape)}"
            raise ManifestInvalid(where, f"reads axis {axis} of input {arg}, which is {rank}")
        return ("dim", arg, axis)
    if op not in SIZE_OPS:
        raise ManifestInvalid(
            where, f"unknown size formula op {_show(op)} (expected dim, {', '.join(SIZE_OPS)})"
        )
    if len(value) != 3:
        raise ManifestInvalid(where, f"[{op!r}, x, y] takes 2 operands, got {len(value) - 1}")
    return (
        op,
        parse_size_formula(value[1], f"{where}[1]", inputs, depth + 1),
        parse_size_formula(value[2], f"{where}[2]", inputs, depth + 1),
    )


def size_formula_json(formula: SizeFormula | None) -> Any:
    """The JSON form of a formula: nested lists."""
    if formula is None or isinstance(formula, int):
        return formula
    return [item if isinstance(item, str | int) else size_formula_json(item) for item in formula]


# --- the records ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class AppRecord:
    name: str
    version: str
    extras: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, o: _Object) -> AppRecord:
        return cls(o.string("name"), o.string("version"), o.extras())

    def to_json(self) -> dict[str, Any]:
        return _with_extras({"name": self.name, "version": self.version}, self.extras)


@dataclass(frozen=True)
class DeviceRequirements:
    """What a device must offer for the code compiled for it (`requires`)."""

    cpu_flags: tuple[str, ...] | None = None
    machine: str | None = None
    # CUDA code compiled for one arch: `sm_90a` runs on compute capability 9.0 only, `sm_90` on
    # 9.0 and later (library kernels, myelin.kernels)
    cuda_arch: str | None = None
    extras: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, o: _Object) -> DeviceRequirements:
        return cls(
            o.optional("cpu_flags", _strings),
            o.optional("machine", _string),
            o.optional("cuda_arch", _cuda_arch),
            o.extras(),
        )

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        if self.cpu_flags is not None:
            data["cpu_flags"] = list(self.cpu_flags)
        if self.machine is not None:
            data["machine"] = self.machine
        if self.cuda_arch is not None:
            data["cuda_arch"] = self.cuda_arch
        return _with_extras(data, self.extras)


def _cuda_arch(value: Any, where: str) -> str:
    arch = _string(value, where)
    if not re.fullmatch(r"sm_\d{2,3}a?", arch):
        raise ManifestInvalid(where, f"must be a CUDA arch such as 'sm_90a', got {_show(arch)}")
    return arch


@dataclass(frozen=True)
class BackendRecord:
    """The external backend a device hosts (myelin.backends): its executable plugin and the
    vendor libraries that plugin links, as `backend` sections loaded in the listed order."""

    name: str
    abi: int  # PLeX's backend ABI version the plugin was built for
    ops: tuple[str, ...]
    plugin: str  # section
    libraries: tuple[str, ...]  # sections, loaded before the plugin
    extras: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, o: _Object) -> BackendRecord:
        return cls(
            o.required("name", _file_name),
            o.count("abi"),
            o.required("ops", _strings),
            o.string("plugin"),
            o.required("libraries", _strings),
            o.extras(),
        )

    def to_json(self) -> dict[str, Any]:
        data = {
            "name": self.name,
            "abi": self.abi,
            "ops": list(self.ops),
            "plugin": self.plugin,
            "libraries": list(self.libraries),
        }
        return _with_extras(data, self.extras)


@dataclass(frozen=True)
class DeviceRecord:
    """One device of a variant: the compiler target it was built for, the HAL driver it needs."""

    name: str
    target: str
    driver: str
    options: Mapping[str, Any] | None = None  # target options (`cpu`, `arch`, ...)
    requires: DeviceRequirements | None = None
    # with `kernels` in the options: every matmul of the variant, with the library kernel it
    # went to or why it stayed IREE codegen (plain records: module, function, op, m, n, k, ...)
    kernels: tuple[Mapping[str, Any], ...] | None = None
    extras: Mapping[str, Any] = field(default_factory=dict)
    backend: BackendRecord | None = None  # the device of an external backend

    @property
    def cpu_flags(self) -> frozenset[str]:
        flags = self.requires.cpu_flags if self.requires is not None else None
        return frozenset(flags or ())

    @classmethod
    def parse(cls, o: _Object) -> DeviceRecord:
        options = o.optional("options", _dict)
        if options is not None:
            for key, value in options.items():
                if not isinstance(value, str | int | float | bool):
                    raise ManifestInvalid(
                        o.path(f"options[{key!r}]"),
                        f"must be a string, number or bool, got {_show(value)}",
                    )
        requires = o.optional("requires", lambda v, w: DeviceRequirements.parse(_Object(v, w)))
        backend = o.optional("backend", lambda v, w: BackendRecord.parse(_Object(v, w)))
        kernels = o.optional(
            "kernels",
            lambda v, w: tuple(
                _json_copy(_dict(x, f"{w}[{i}]")) for i, x in enumerate(_list(v, w))
            ),
        )
        return cls(
            o.string("name"),
            o.string("target"),
            o.string("driver"),
            _json_copy(options),
            requires,
            kernels,
            o.extras(),
            backend=backend,
        )

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "target": self.target, "driver": self.driver}
        if self.backend is not None:
            data["backend"] = self.backend.to_json()
        if self.options is not None:
            data["options"] = _json_copy(dict(self.options))
        if self.requires is not None:
            data["requires"] = self.requires.to_json()
        if self.kernels is not None:
            data["kernels"] = [_json_copy(dict(k)) for k in self.kernels]
        return _with_extras(data, self.extras)


@dataclass(frozen=True)
class ModuleRecord:
    """One VM module of a variant and the section holding its bytecode."""

    name: str
    section: str
    extras: Mapping[str, Any] = field(default_factory=dict)

    @property
    def host_functions(self) -> tuple[Mapping[str, Any], ...]:
        """The ONNX nodes this module calls on the host (myelin.runtime.host_ops), each checked
        at parse: `function`, `node`, `section` strings, `inputs`/`outputs` dtype lists."""
        return tuple(self.extras.get("host_functions", ()))

    @classmethod
    def parse(cls, o: _Object) -> ModuleRecord:
        record = cls(o.required("name", _file_name), o.string("section"), o.extras())
        # kept in extras (written back as read); checked here so the runtime reads typed fields
        if o.has("host_functions"):
            _check_host_functions(o.data["host_functions"], o.path("host_functions"))
        return record

    def to_json(self) -> dict[str, Any]:
        return _with_extras({"name": self.name, "section": self.section}, self.extras)


def _check_host_functions(value: Any, where: str) -> None:
    seen: set[str] = set()
    for i, item in enumerate(_list(value, where)):
        f = _Object(item, f"{where}[{i}]")
        _unique(f.string("function"), seen, f.path("function"), "host function")
        f.string("node")
        f.string("section")
        for key in ("inputs", "outputs"):
            f.required(
                key, lambda v, w: tuple(_dtype(x, f"{w}[{j}]") for j, x in enumerate(_list(v, w)))
            )
        f.optional("op_type", _string)


@dataclass(frozen=True)
class ScheduleRecord:
    """How IREE's Stream scheduled an entrypoint. The runtime reads `executes` to order
    submitted calls (myelin.runtime.pending); the rest is provenance."""

    executes: int
    dispatches: int
    concurrent: tuple[int, ...]
    extras: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, o: _Object) -> ScheduleRecord:
        return cls(
            o.count("executes"),
            o.count("dispatches"),
            o.required("concurrent", _counts),
            o.extras(),
        )

    def to_json(self) -> dict[str, Any]:
        data = {
            "executes": self.executes,
            "dispatches": self.dispatches,
            "concurrent": list(self.concurrent),
        }
        return _with_extras(data, self.extras)


@dataclass(frozen=True)
class MemoryRecord:
    """What a call of an entrypoint allocates, as size formulas of its input dims (`memory`).

    With `unknown` set the formulas could not be derived and are None; a budgeted call is then
    refused, never guessed.
    """

    transient: SizeFormula | None
    results: SizeFormula | None
    parameters: tuple[tuple[str, str], ...] | None = None  # (scope, key) the function reads
    schedule: ScheduleRecord | None = None
    unknown: str | None = None
    extras: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, o: _Object, inputs: tuple[TensorSpec, ...]) -> MemoryRecord:
        unknown = o.optional("unknown", _string)

        def formula(value: Any, where: str) -> SizeFormula | None:
            if value is None and unknown is not None:
                return None
            return parse_size_formula(value, where, inputs)

        if unknown is None:
            transient, results = o.required("transient", formula), o.required("results", formula)
        else:
            transient, results = o.optional("transient", formula), o.optional("results", formula)
        return cls(
            transient,
            results,
            o.optional("parameters", _parameter_keys),
            o.optional("schedule", lambda v, w: ScheduleRecord.parse(_Object(v, w))),
            unknown,
            o.extras(),
        )

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        # The derived form always carries both formulas (null when unknown); "no plan at all"
        # is just the reason.
        derived = (
            self.transient is not None
            or self.results is not None
            or self.parameters is not None
            or self.schedule is not None
        )
        if derived:
            data["transient"] = size_formula_json(self.transient)
            data["results"] = size_formula_json(self.results)
        if self.parameters is not None:
            data["parameters"] = [list(p) for p in self.parameters]
        if self.schedule is not None:
            data["schedule"] = self.schedule.to_json()
        if self.unknown is not None:
            data["unknown"] = self.unknown
        return _with_extras(data, self.extras)


def _parameter_keys(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    keys = []
    for i, item in enumerate(_list(value, where)):
        at = f"{where}[{i}]"
        if not isinstance(item, list) or len(item) != 2:
            raise ManifestInvalid(at, f"must be [scope, key], got {_show(item)}")
        keys.append((_string(item[0], f"{at}[0]"), _string(item[1], f"{at}[1]")))
    return tuple(keys)


def parse_tensor(value: Any, where: str) -> TensorSpec:
    """An entrypoint argument or result: a tensor, or a scalar when "shape" is null."""
    o = _Object(value, where)
    name = o.string("name")
    dtype = o.required("dtype", _dtype)
    shape_value = o.value("shape")
    shape: tuple[int | None, ...] | None = None
    if shape_value is not None:
        entries = _list(shape_value, o.path("shape"))
        if len(entries) > MAX_RANK:
            raise ManifestInvalid(
                o.path("shape"), f"has rank {len(entries)}; at most {MAX_RANK} is supported"
            )
        for i, dim in enumerate(entries):
            if dim is not None and not _is_count(dim):
                raise ManifestInvalid(
                    f"{o.path('shape')}[{i}]", f"must be an integer >= 0 or null, got {_show(dim)}"
                )
        shape = tuple(entries)
        static = math.prod(d for d in shape if d is not None)
        nbytes = static * STORAGE_BITS[dtype] // 8
        if nbytes > MAX_TENSOR_BYTES:
            raise ManifestInvalid(
                o.path("shape"),
                f"declares {nbytes} bytes (more than the {MAX_TENSOR_BYTES}-byte limit)",
            )
    rank = 0 if shape is None else len(shape)
    dims: tuple[int | str, ...]
    if o.has("dims"):
        entries = _list(o.value("dims"), o.path("dims"))
        if len(entries) != rank:
            raise ManifestInvalid(
                o.path("dims"), f"has {len(entries)} entries but shape has {rank}"
            )
        for i, dim in enumerate(entries):
            if not (_is_count(dim) or (isinstance(dim, str) and dim)):
                raise ManifestInvalid(
                    f"{o.path('dims')}[{i}]",
                    f"must be an integer >= 0 or a dimension name, got {_show(dim)}",
                )
            if shape is not None and shape[i] is not None and dim != shape[i]:
                raise ManifestInvalid(
                    f"{o.path('dims')}[{i}]", f"is {_show(dim)} but shape[{i}] is {shape[i]}"
                )
        dims = tuple(entries)
    else:  # older files: the compiler's own names for dynamic dims
        dims = tuple(d if d is not None else f"{name}.{a}" for a, d in enumerate(shape or ()))
    # optional (files before it have none): the values an index input may take
    valid_range = o.optional("range", lambda v, w: _valid_range(v, w, dtype))
    limits = o.optional("limits", lambda v, w: _limits(v, w, shape)) or ()
    return TensorSpec(
        name=name, dtype=dtype, shape=shape, dims=dims, valid_range=valid_range, limits=limits
    )


def _limits(
    value: Any, where: str, shape: tuple[int | None, ...] | None
) -> tuple[tuple[int, str] | None, ...]:
    """Per axis, null or [largest size >= 1, why], on dynamic axes only."""
    entries = _list(value, where)
    if len(entries) != len(shape or ()):
        raise ManifestInvalid(where, f"has {len(entries)} entries but shape has {len(shape or ())}")
    out: list[tuple[int, str] | None] = []
    for i, limit in enumerate(entries):
        if limit is None:
            out.append(None)
            continue
        if not (
            isinstance(limit, list)
            and len(limit) == 2
            and _is_count(limit[0])
            and limit[0] >= 1
            and isinstance(limit[1], str)
            and shape is not None
            and shape[i] is None
        ):
            raise ManifestInvalid(
                f"{where}[{i}]",
                f"must be null or [size >= 1, why] on a dynamic dim, got {_show(limit)}",
            )
        out.append((limit[0], limit[1]))
    return tuple(out)


def _valid_range(value: Any, where: str, dtype: str) -> tuple[int, int]:
    """[lo, hi) of an integer input: two integers of its dtype's range, lo < hi."""
    if not dtype.startswith(("int", "uint")):
        raise ManifestInvalid(where, f"is given for a {dtype} tensor; only integer inputs index")
    entries = _list(value, where)
    if len(entries) != 2 or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in entries
    ):
        raise ManifestInvalid(where, f"must be two integers [lo, hi), got {_show(value)}")
    lo, hi = entries
    bits = STORAGE_BITS[dtype]
    smallest = 0 if dtype.startswith("uint") else -(1 << (bits - 1))
    largest = (1 << bits) - 1 if dtype.startswith("uint") else (1 << (bits - 1)) - 1
    if not smallest <= lo < hi <= largest + 1:
        raise ManifestInvalid(
            where,
            f"must satisfy {smallest} <= lo < hi <= {largest + 1} for {dtype}, got {_show(value)}",
        )
    return lo, hi


@dataclass(frozen=True)
class EntrypointRecord:
    """A function users may call: where it lives, its signature, its device and memory need."""

    name: str
    module: str
    function: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    device: str | None = None  # None: the variant's first device
    memory: MemoryRecord | None = None  # None: unknown (a budgeted call is refused)
    extras: Mapping[str, Any] = field(default_factory=dict)

    @property
    def signature(self) -> Signature:
        return Signature(inputs=self.inputs, outputs=self.outputs)

    @property
    def qualified_name(self) -> str:
        """`module.function`: reachable even when two modules export the same name."""
        return f"{self.module}.{self.function}"

    @classmethod
    def parse(cls, o: _Object) -> EntrypointRecord:
        name, module, function = o.string("name"), o.string("module"), o.string("function")
        device = o.optional("device", _string)
        inputs = tuple(parse_tensor(v, f"{o.path('inputs')}[{i}]") for i, v in _items(o, "inputs"))
        outputs = tuple(
            parse_tensor(v, f"{o.path('outputs')}[{i}]") for i, v in _items(o, "outputs")
        )
        if not outputs:
            raise ManifestInvalid(o.path("outputs"), "is empty; an entrypoint returns a result")
        memory = o.optional("memory", lambda v, w: MemoryRecord.parse(_Object(v, w), inputs))
        return cls(name, module, function, inputs, outputs, device, memory, o.extras())

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": self.name,
            "module": self.module,
            "function": self.function,
            "inputs": [t.to_json() for t in self.inputs],
            "outputs": [t.to_json() for t in self.outputs],
        }
        if self.memory is not None:
            data["memory"] = self.memory.to_json()
        if self.device is not None:
            data["device"] = self.device
        return _with_extras(data, self.extras)


def _items(o: _Object, key: str) -> Iterator[tuple[int, Any]]:
    return enumerate(o.required(key, _list))


@dataclass(frozen=True)
class VariantRecord:
    """One alternative build of the app: its devices, modules (in load order) and entrypoints."""

    name: str
    devices: tuple[DeviceRecord, ...]
    modules: tuple[ModuleRecord, ...]
    entrypoints: tuple[EntrypointRecord, ...]
    parameter_scopes: tuple[str, ...]
    flags: tuple[str, ...] | None = None
    module_attributes: Mapping[str, str] | None = None
    extras: Mapping[str, Any] = field(default_factory=dict)

    def callable_entrypoints(self) -> dict[str, EntrypointRecord]:
        """Every name a user may call: each entrypoint's name, and `module.function` for all
        of them (so two graphs' `forward` stay reachable); a recorded name wins."""
        names = {e.name: e for e in self.entrypoints}
        for e in self.entrypoints:
            names.setdefault(e.qualified_name, e)
        return names

    def device_of(self, entry: EntrypointRecord) -> DeviceRecord:
        """The device an entrypoint runs on: its `device`, else the variant's first."""
        name = entry.device or self.devices[0].name
        return next(d for d in self.devices if d.name == name)

    @classmethod
    def parse(cls, o: _Object) -> VariantRecord:
        name = o.string("name")
        devices = tuple(DeviceRecord.parse(d) for d in o.objects("devices"))
        _all_unique(devices, o.path("devices"), "device name")
        modules = tuple(ModuleRecord.parse(m) for m in o.objects("modules"))
        _all_unique(modules, o.path("modules"), "module name")
        entrypoints = tuple(EntrypointRecord.parse(e) for e in o.objects("entrypoints"))
        _all_unique(entrypoints, o.path("entrypoints"), "entrypoint name")
        module_names = {m.name for m in modules}
        device_names = {d.name for d in devices}
        for i, e in enumerate(entrypoints):
            where = f"{o.path('entrypoints')}[{i}]"
            if e.module not in module_names:
                raise ManifestInvalid(
                    f"{where}.module", f"names no module of this variant: {e.module!r}"
                )
            if e.device is not None and e.device not in device_names:
                raise ManifestInvalid(
                    f"{where}.device", f"names no device of this variant: {e.device!r}"
                )
        if entrypoints and not devices:
            raise ManifestInvalid(o.path("devices"), "is empty; the entrypoints need a device")
        return cls(
            name,
            devices,
            modules,
            entrypoints,
            o.required("parameter_scopes", _file_names),
            o.optional("flags", _strings),
            o.optional("module_attributes", _string_map),
            o.extras(),
        )

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": self.name,
            "devices": [d.to_json() for d in self.devices],
            "modules": [m.to_json() for m in self.modules],
            "entrypoints": [e.to_json() for e in self.entrypoints],
            "parameter_scopes": list(self.parameter_scopes),
        }
        if self.flags is not None:
            data["flags"] = list(self.flags)
        if self.module_attributes is not None:
            data["module_attributes"] = dict(self.module_attributes)
        return _with_extras(data, self.extras)


def _all_unique(records: tuple[Any, ...], where: str, what: str) -> None:
    seen: set[str] = set()
    for i, record in enumerate(records):
        _unique(record.name, seen, f"{where}[{i}].name", what)


@dataclass(frozen=True)
class StorageRecord:
    """How a stored part of an encoded parameter is laid out (`storage`)."""

    dtype: str
    shape: tuple[int, ...]
    extras: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, o: _Object) -> StorageRecord:
        return cls(
            o.required("dtype", lambda v, w: _dtype(v, w, frozenset(STORAGE_BITS))),
            o.required("shape", _counts),
            o.extras(),
        )

    @property
    def nbytes(self) -> int:
        return -(-math.prod(self.shape) * STORAGE_BITS[self.dtype] // 8)

    def to_json(self) -> dict[str, Any]:
        return _with_extras({"dtype": self.dtype, "shape": list(self.shape)}, self.extras)


@dataclass(frozen=True)
class ParameterRecord:
    """One parameter (or one stored part of an encoded parameter) and its bytes in the file."""

    scope: str
    key: str
    section: str
    offset: int  # relative to the section
    length: int
    codec: str
    dtype: str  # logical dtype: what the graph computes with
    shape: tuple[int, ...]  # logical shape
    layout: str
    role: str | None = None  # data / scale / zero / row_scale, on an encoded parameter's parts
    of: str | None = None  # on a non-data part: the key of the parameter it belongs to
    storage: StorageRecord | None = None
    rule: str | None = None  # why the parameter has its codec
    reduce_axes: tuple[int, ...] | None = None
    extras: Mapping[str, Any] = field(default_factory=dict)

    @property
    def stored_bytes(self) -> int:
        """Bytes the shapes and dtypes say the parameter occupies (`length` must agree)."""
        if self.storage is not None:
            return self.storage.nbytes
        return math.prod(self.shape) * STORAGE_BITS[self.dtype] // 8

    @classmethod
    def parse(cls, o: _Object) -> ParameterRecord:
        return cls(
            scope=o.required("scope", _file_name),
            key=o.string("key"),
            section=o.string("section"),
            offset=o.count("offset"),
            length=o.count("length"),
            codec=o.string("codec"),
            dtype=o.required("dtype", _dtype),
            shape=o.required("shape", _counts),
            layout=o.string("layout"),
            role=o.optional("role", _string),
            of=o.optional("of", _string),
            storage=o.optional("storage", lambda v, w: StorageRecord.parse(_Object(v, w))),
            rule=o.optional("rule", _string),
            reduce_axes=o.optional("reduce_axes", _counts),
            extras=o.extras(),
        )

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "scope": self.scope,
            "key": self.key,
            "section": self.section,
            "offset": self.offset,
            "length": self.length,
            "codec": self.codec,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "layout": self.layout,
        }
        for name in ("role", "of", "rule"):
            if getattr(self, name) is not None:
                data[name] = getattr(self, name)
        if self.storage is not None:
            data["storage"] = self.storage.to_json()
        if self.reduce_axes is not None:
            data["reduce_axes"] = list(self.reduce_axes)
        return _with_extras(data, self.extras)


@dataclass(frozen=True)
class ProfileRecord:
    """`[runtime.profile]`: the defaults of `plex profile`."""

    output: str | None = None  # may contain `{capture}`
    device_timing: bool = False
    extras: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, o: _Object) -> ProfileRecord:
        output = o.optional("output", lambda v, w: None if v is None else _relative_path(v, w))
        timing = o.optional("device_timing", _bool)
        return cls(output, bool(timing), o.extras())

    def to_json(self) -> dict[str, Any]:
        data = {"output": self.output, "device_timing": self.device_timing}
        return _with_extras(data, self.extras)


@dataclass(frozen=True)
class PoliciesRecord:
    """The app's runtime policies; `Instance.load` arguments override them."""

    residency: str = "resident"
    memory_budget: int | None = None  # bytes per loaded variant; None: no budget
    favor: str | None = None  # provenance: applied at build time
    profile: ProfileRecord | None = None
    extras: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, o: _Object) -> PoliciesRecord:
        residency = o.optional("residency", _string) or "resident"
        if residency not in RESIDENCY_MODES:
            raise ManifestInvalid(
                o.path("residency"),
                f"unknown residency {residency!r} (expected one of {', '.join(RESIDENCY_MODES)})",
            )
        return cls(
            residency,
            o.optional("memory_budget", lambda v, w: None if v is None else _count(v, w)),
            o.optional("favor", _string),
            o.optional(
                "profile", lambda v, w: None if v is None else ProfileRecord.parse(_Object(v, w))
            ),
            o.extras(),
        )

    def to_json(self) -> dict[str, Any]:
        data = {
            "residency": self.residency,
            "memory_budget": self.memory_budget,
            "favor": self.favor,
            "profile": self.profile.to_json() if self.profile is not None else None,
        }
        return _with_extras(data, self.extras)


@dataclass(frozen=True)
class ProvenanceRecord:
    """How the file was built. Only the listed fields are typed; builds add free keys."""

    plex_version: str | None = None
    iree_compiler_version: str | None = None
    sources: Mapping[str, str] | None = None  # source -> fingerprint
    extras: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, o: _Object) -> ProvenanceRecord:
        return cls(
            o.optional("plex_version", _string),
            o.optional("iree_compiler_version", _string),
            o.optional("sources", _string_map),
            o.extras(),
        )

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        if self.plex_version is not None:
            data["plex_version"] = self.plex_version
        if self.iree_compiler_version is not None:
            data["iree_compiler_version"] = self.iree_compiler_version
        if self.sources is not None:
            data["sources"] = dict(self.sources)
        return _with_extras(data, self.extras)


@dataclass(frozen=True)
class ArtifactManifest:
    """The whole manifest of a .mln file, typed.

    `format_version` and `sections` are filled by the writer: a manifest that a build is still
    composing has neither (None), one read from a file has both.
    """

    app: AppRecord
    variants: tuple[VariantRecord, ...]
    parameters: tuple[ParameterRecord, ...]
    provenance: ProvenanceRecord
    tuning: Mapping[str, Any] | None = None
    policies: PoliciesRecord | None = None  # None: the defaults (PoliciesRecord())
    format_version: tuple[int, int] | None = None
    sections: tuple[SectionEntry, ...] | None = None
    extras: Mapping[str, Any] = field(default_factory=dict)

    @property
    def runtime_policies(self) -> PoliciesRecord:
        """The recorded policies, or the defaults when the file records none."""
        return self.policies if self.policies is not None else PoliciesRecord()

    def section_table(self) -> dict[str, SectionEntry]:
        return {s.name: s for s in self.sections or ()}

    def variant(self, name: str) -> VariantRecord | None:
        return next((v for v in self.variants if v.name == name), None)

    def parameters_in(self, scopes: tuple[str, ...] | list[str]) -> list[ParameterRecord]:
        """The parameters a variant reading these scopes registers, in manifest order."""
        wanted = set(scopes)
        return [p for p in self.parameters if p.scope in wanted]

    @classmethod
    def from_json(
        cls, manifest: Any, *, format_version: tuple[int, int] | None = None
    ) -> ArtifactManifest:
        """Parse and check a manifest; raises ManifestInvalid naming the first bad field.

        With `format_version` (the header's, when reading a file), "format" and "sections" are
        required and "format" must agree with it. Without it (a build composing its manifest),
        they may be absent; references to sections are then checked when the writer lays them
        out.
        """
        o = _Object(manifest, "")
        version = None
        if format_version is not None or o.has("format"):
            fmt = _Object(o.value("format"), "format")
            version = (fmt.count("major"), fmt.count("minor"))
            if format_version is not None and version != format_version:
                raise ManifestInvalid(
                    "format",
                    f"says {version[0]}.{version[1]} but the header says "
                    f"{format_version[0]}.{format_version[1]}",
                )
        app = AppRecord.parse(_Object(o.value("app"), "app"))
        sections = None
        if format_version is not None or o.has("sections"):
            newer = version is not None and version[1] > FORMAT_MINOR
            sections = _parse_sections(o, newer_minor=newer)
        parameters = tuple(ParameterRecord.parse(p) for p in o.objects("parameters"))
        variants = tuple(VariantRecord.parse(v) for v in o.objects("variants"))
        _all_unique(variants, "variants", "variant name")
        tuning = o.value("tuning")
        if tuning is not None:
            _dict(tuning, "tuning")
        policies = o.optional("policies", lambda v, w: PoliciesRecord.parse(_Object(v, w)))
        provenance = ProvenanceRecord.parse(_Object(o.value("provenance"), "provenance"))
        record = cls(
            app=app,
            variants=variants,
            parameters=parameters,
            provenance=provenance,
            tuning=_json_copy(tuning),
            policies=policies,
            format_version=version,
            sections=sections,
            extras=o.extras(),
        )
        _check_parameters(record)
        _check_references(record)
        return record

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "app": self.app.to_json(),
            "variants": [v.to_json() for v in self.variants],
            "parameters": [p.to_json() for p in self.parameters],
            "tuning": _json_copy(self.tuning),
            "provenance": self.provenance.to_json(),
        }
        if self.policies is not None:
            data["policies"] = self.policies.to_json()
        if self.format_version is not None:
            data["format"] = {"major": self.format_version[0], "minor": self.format_version[1]}
        if self.sections is not None:
            data["sections"] = [section_json(s) for s in self.sections]
        return _with_extras(data, self.extras)


def section_json(s: SectionEntry) -> dict[str, Any]:
    return {
        "name": s.name,
        "kind": s.kind,
        "offset": s.offset,
        "length": s.length,
        "alignment": s.alignment,
        "sha256": s.sha256,
    }


def _parse_sections(o: _Object, *, newer_minor: bool) -> tuple[SectionEntry, ...]:
    sections: dict[str, SectionEntry] = {}
    for s in o.objects("sections"):
        name = s.string("name")
        if name in sections:
            raise ManifestInvalid(s.path("name"), f"duplicate section name {name!r}")
        kind = s.string("kind")
        minimum = SECTION_ALIGNMENT.get(kind)
        if minimum is None:
            if not newer_minor:  # a newer minor may add kinds; we bounds- and hash-check them
                known = ", ".join(SECTION_ALIGNMENT)
                raise ManifestInvalid(
                    s.path("kind"), f"unknown section kind {kind!r} (expected one of {known})"
                )
            minimum = MIN_ALIGNMENT
        offset, length, alignment = s.count("offset"), s.count("length"), s.count("alignment")
        if alignment < minimum or alignment & (alignment - 1):
            raise ManifestInvalid(
                s.path("alignment"),
                f"must be a power of two >= {minimum} for kind {kind!r}, got {alignment}",
            )
        if offset % alignment:
            raise ManifestInvalid(
                s.path("offset"), f"{offset} is not a multiple of the alignment {alignment}"
            )
        digest = s.string("sha256")
        if not _SHA256_HEX.fullmatch(digest):
            raise ManifestInvalid(
                s.path("sha256"), f"must be 64 lowercase hex digits, got {_show(digest)}"
            )
        sections[name] = SectionEntry(name, kind, offset, length, alignment, digest)
    return tuple(sections.values())


def _section_ref(
    name: str, where: str, sections: dict[str, SectionEntry], kind: str
) -> SectionEntry:
    section = sections.get(name)
    if section is None:
        raise ManifestInvalid(f"{where}.section", f"names no section of the file: {name!r}")
    if section.kind != kind:
        raise ManifestInvalid(
            f"{where}.section", f"section {name!r} is of kind {section.kind!r}, not {kind!r}"
        )
    return section


def _check_parameters(m: ArtifactManifest) -> None:
    """Unique names; with a section table, each byte range inside its section and apart from
    every other parameter's; and each length what the shape and dtype say."""
    seen: set[tuple[str, str]] = set()
    for i, p in enumerate(m.parameters):
        _unique((p.scope, p.key), seen, f"parameters[{i}]", "parameter (scope, key)")
    sections = m.section_table() if m.sections is not None else None
    taken: dict[str, list[tuple[int, int, int]]] = {}  # section -> (start, end, index)
    for i, p in enumerate(m.parameters):
        where = f"parameters[{i}]"
        if sections is not None:
            section = _section_ref(p.section, where, sections, "parameter")
            if p.offset + p.length > section.length:
                raise ManifestInvalid(
                    where,
                    f"byte range {p.offset}..{p.offset + p.length} lies outside its section "
                    f"{section.name!r} ({section.length} bytes)",
                )
        if p.length != p.stored_bytes:
            what = (
                f"storage {p.storage.dtype}{list(p.storage.shape)}"
                if p.storage is not None
                else f"{p.dtype}{list(p.shape)}"
            )
            raise ManifestInvalid(
                f"{where}.length", f"is {p.length} bytes but {what} needs {p.stored_bytes}"
            )
        if p.length:
            taken.setdefault(p.section, []).append((p.offset, p.offset + p.length, i))
    for section, ranges in taken.items():
        ranges.sort()
        for (start, end, a), (next_start, _, b) in itertools.pairwise(ranges):
            if next_start < end:
                raise ManifestInvalid(
                    f"parameters[{max(a, b)}]",
                    f"byte range overlaps parameters[{min(a, b)}] in section {section!r} "
                    f"({start}..{end})",
                )


def _check_references(m: ArtifactManifest) -> None:
    if m.sections is None:
        return
    sections = m.section_table()
    for i, v in enumerate(m.variants):
        for j, module in enumerate(v.modules):
            _section_ref(module.section, f"variants[{i}].modules[{j}]", sections, "module")
            for k, host in enumerate(module.host_functions):
                where = f"variants[{i}].modules[{j}].host_functions[{k}]"
                _section_ref(host["section"], where, sections, "blob")
        for j, device in enumerate(v.devices):
            if device.backend is not None:
                where = f"variants[{i}].devices[{j}].backend"
                for k, name in enumerate((device.backend.plugin, *device.backend.libraries)):
                    at = f"{where}.plugin" if k == 0 else f"{where}.libraries[{k - 1}]"
                    _section_ref(name, at, sections, "backend")


def validate_manifest(manifest: Any, *, format_version: tuple[int, int]) -> ArtifactManifest:
    """Check a manifest read from (or about to be written to) a file; return its records."""
    return ArtifactManifest.from_json(manifest, format_version=format_version)
