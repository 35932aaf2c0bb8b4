"""The shape of `plex.toml` and `app.toml`: pydantic models, accepted values, size strings.

The models check types, unknown keys and single values. Checks that span keys or files
(references, file existence, target options) live in `_package` and `_app`, which know the
manifest's folder. Nothing outside this package sees these models.
"""

from __future__ import annotations

import typing
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from myelin.codecs import check_codec_name
from myelin.compiler.scheduling import FAVORS
from myelin.platforms import (
    CPU_COMPUTE,
    CPU_CONV_BATCH,
    CPU_MATMUL_TILES,
    CPU_REDUCTIONS,
    CPU_RELAYOUT_TILES,
    DRIVERS,
    KERNEL_LIBRARIES,
    TARGETS,
)
from myelin.sizes import parse_size
from myelin.tuning.layout import check_layout
from myelin.untrusted import relative_path_problem
from plex.manifest._executor import parse_executor

# -- accepted values: one definition each ---------------------------------------------------------

# Targets, drivers and target options are myelin.platforms' table; favor is the compiler's.
Target = Literal[tuple(TARGETS)]  # type: ignore[valid-type]
Driver = Literal[DRIVERS]  # type: ignore[valid-type]
Frontend = Literal["mlir", "stablehlo", "onnx", "torch", "jax", "causal-lm"]
FRONTENDS: tuple[str, ...] = typing.get_args(Frontend)
Residency = Literal["resident", "streamed", "prefetch"]
Favor = Literal[FAVORS]  # type: ignore[valid-type]
# target -> drivers that run its code; the first is the default.
DRIVERS_OF_TARGET: dict[str, tuple[str, ...]] = {t: ds for t, (_, ds) in TARGETS.items()}
# weights file extension -> format
WEIGHTS_FORMATS = {".safetensors": "safetensors", ".irpa": "irpa", ".gguf": "gguf"}
# graph source extension -> frontend, when `frontend` is omitted
FRONTEND_OF_SUFFIX = {".mlir": "mlir", ".mlirbc": "mlir", ".onnx": "onnx"}
PYTHON_FRONTENDS = ("torch", "jax")

# Names become file names (a graph's module, a scope's `.irpa`, a backend's plugin), so each
# pattern bounds the length well below the 255 bytes of a Linux file name and none is `.` or `..`
# (the artifact's records check the same at load: myelin.untrusted.FILE_NAME_PATTERN).
MAX_NAME_LENGTH = 64
_REST = f"{{0,{MAX_NAME_LENGTH - 1}}}"  # characters after the first
PACKAGE_NAME = rf"^[a-z][a-z0-9_-]{_REST}$"
GRAPH_NAME = rf"^[A-Za-z_][A-Za-z0-9_]{_REST}$"
NAME = rf"^[A-Za-z_][A-Za-z0-9_.-]{_REST}$"  # apps, devices, variants, weights, tuning specs
SCOPE = rf"^[A-Za-z0-9_][A-Za-z0-9_.-]{_REST}$"

# -- sizes: myelin.sizes is the one parser ------------------------------------------------------

Size = Annotated[int, BeforeValidator(parse_size)]
# A weight codec: fp32, fp16, bf16, int8, q4 or q4:g<group>; myelin.codecs is the one list.
Codec = Annotated[str, AfterValidator(check_codec_name)]

# -- models ---------------------------------------------------------------------------------------


class _Table(BaseModel):
    # strict: TOML values are typed, so "2" is not an integer and 1 is not a string.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# plex.toml


class PackageTable(_Table):
    name: Annotated[str, Field(pattern=PACKAGE_NAME)]
    version: str = "0.0.0"
    description: str = ""


class GraphTable(_Table):
    source: str | None = None  # required unless every shard has its own (checked in _package)
    frontend: Frontend | None = None
    weights: str | None = None
    entrypoints: list[str] | None = None
    arg_names: dict[str, list[str]] = {}
    dynamic: dict[str, dict[str, str]] = {}
    # shard name -> [entrypoints] or {source, frontend, entrypoints}; checked in _package, where
    # errors can point at the shard's own line
    shards: Any = None
    # ops IREE cannot lower run in a host VM module instead of failing the build (opt-in)
    host_fallback: bool = False
    # frontend = "causal-lm": KV cache slots per sequence, sequences per call (docs/llm.md)
    max_seq: Annotated[int, Field(ge=2)] | None = None
    max_batch: Annotated[int, Field(ge=1)] | None = None
    # frontend = "causal-lm": the dtype the model computes in, and so its KV cache's
    dtype: Literal["float32", "float16", "bfloat16"] | None = None
    # frontend = "causal-lm": static prompt lengths, one extra prefill entrypoint each
    prefill_lengths: list[Annotated[int, Field(ge=2)]] | None = None


class WeightsTable(_Table):
    source: str | None = None
    scope: Annotated[str, Field(pattern=SCOPE)] = "model"
    codec: Codec = "fp32"


# A stored weight layout (myelin.tuning.layout): "nk" or "kn".
WeightLayout = Annotated[str, AfterValidator(check_layout)]


class TuningTable(_Table):
    path: str | None = None  # the transform-dialect spec; a table may hold only layouts
    target: Target
    # parameter glob ("scope::key" or "key") -> its stored layout; the last match wins
    layouts: dict[str, WeightLayout] = {}
    # a tuning database (tuning.json) whose kernel-config entries choose the kernel library's
    # config per matmul shape (myelin.kernels._space); cuda targets only
    kernels: str | None = None


# Ops an external backend may implement; myelin.backends rewrites them into calls to it.
BackendOp = Literal["matmul", "attention", "gelu"]
BACKEND_DEVICE_KINDS = ("cpu",)  # host memory, run by the local-task driver


class BackendTable(_Table):
    sources: list[str] = []  # C sources, compiled with gcc into the plugin
    library: str | None = None  # or a prebuilt plugin (.so); exactly one of the two
    ops: Annotated[list[BackendOp], Field(min_length=1)]
    device: Literal[BACKEND_DEVICE_KINDS] = "cpu"  # type: ignore[valid-type]
    # where include_dirs and libraries are: relative to an installed Python module's folder
    # (vendor_module, e.g. scipy_openblas32), or to the install prefix where a data-only
    # distribution's files landed (vendor_distribution, e.g. mkl: <prefix>/lib, <prefix>/include);
    # with neither, to the package folder
    vendor_module: str | None = None
    vendor_distribution: str | None = None
    include_dirs: list[str] = []
    libraries: list[str] = []  # shared libraries the plugin links; bundled into the .mln
    # static archives linked into the plugin (one group: they may refer to each other), their
    # symbols kept inside it; nothing of them is bundled besides the plugin
    static_libraries: list[str] = []
    cflags: list[str] = []
    # smallest op (multiply-adds) worth a call; smaller ones stay with IREE's code generation
    min_flops: Annotated[int, Field(ge=0)] = 0


class PackageFile(_Table):
    package: PackageTable
    graph: dict[str, GraphTable] = {}
    weights: dict[str, WeightsTable] = {}
    tuning: dict[str, TuningTable] = {}
    backend: dict[str, BackendTable] = {}


# app.toml


class AppTable(_Table):
    name: Annotated[str, Field(pattern=NAME)]
    version: str = "0.0.0"
    packages: list[str] = []
    graphs: list[str] | None = None
    # packages may read files outside their own folders (sources, weights, tuning specs)
    allow_outside_sources: bool = False


class DeviceTable(_Table):
    target: Target = "llvm-cpu"
    driver: Driver | None = None
    cpu: str | None = None
    cpu_features: str | None = None
    data_tiling: bool | None = None
    result_storage: bool | None = None
    compute: Literal[CPU_COMPUTE] | None = None  # type: ignore[valid-type]
    matmul_tiles: Literal[CPU_MATMUL_TILES] | None = None  # type: ignore[valid-type]
    reductions: Literal[CPU_REDUCTIONS] | None = None  # type: ignore[valid-type]
    relayout_tiles: Literal[CPU_RELAYOUT_TILES] | None = None  # type: ignore[valid-type]
    conv_batch: Literal[CPU_CONV_BATCH] | None = None  # type: ignore[valid-type]
    arch: str | None = None
    backend: str | None = None  # "package:name" or "name" of an external backend: its device
    # a library, or "none" (IREE's codegen only: what a Hopper device, arch = "sm_90a", needs
    # to say to turn the library off; plex.manifest._app.HOPPER_KERNELS)
    kernels: Literal[(*KERNEL_LIBRARIES, "none")] | None = None  # type: ignore[valid-type]


class VariantTable(_Table):
    name: Annotated[str, Field(pattern=NAME)]
    devices: Annotated[list[str], Field(min_length=1)]


class AppWeightsTable(_Table):
    residency: Residency = "resident"
    codec: dict[str, Codec] = {}


class SchedulingTable(_Table):
    favor: Favor = "min-memory"


class MyelinTable(_Table):
    # "package:name" of a tuning spec, or a list of them: at most one per compiler target
    tuning: str | list[str] | None = None


def _check_relative_path(text: str) -> str:
    problem = relative_path_problem(text)
    if problem is not None:
        raise ValueError(f"{text!r} {problem}")
    return text


class ProfileTable(_Table):
    # relative to `plex profile -o DIR`; the runtime confines it there again (myelin.untrusted)
    output: Annotated[str, AfterValidator(_check_relative_path)] | None = None
    device_timing: bool = False


class RuntimeTable(_Table):
    memory: Size | None = None
    cancellable: bool = True
    profile: ProfileTable | None = None


def _check_executor(text: str) -> str:
    parse_executor(text)  # one grammar for the manifest and --executor
    return text


class BuildTable(_Table):
    jobs: Annotated[int, Field(ge=1)] | None = None
    temp_memory: Size = 2**30
    cache: str | None = None
    executor: Annotated[str, AfterValidator(_check_executor)] = "local"


class AppFile(_Table):
    app: AppTable
    devices: dict[str, DeviceTable] = {}
    variant: list[VariantTable] = []
    placement: dict[str, str] = {}
    weights: AppWeightsTable = AppWeightsTable()
    scheduling: SchedulingTable = SchedulingTable()
    myelin: MyelinTable = MyelinTable()
    runtime: RuntimeTable = RuntimeTable()
    build: BuildTable = BuildTable()
