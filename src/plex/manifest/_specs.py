"""What a manifest resolves to: frozen, pydantic-free dataclasses the build consumes.

Paths are absolute. Defaults are filled in, references are resolved (by `load_app`), and every
value has been validated, so consumers need not check anything again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, NoReturn, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class FrozenDict(dict[K, V], Generic[K, V]):
    """A dict that refuses changes: specs stay immutable and hashable, and still pickle (the
    build may hand them to worker processes, where a MappingProxyType would not go)."""

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("manifest specs are immutable")

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self.items()))

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (dict(self),))


@dataclass(frozen=True)
class DeviceSpec:
    """A named target device of an app: what to compile for (`target`) and what runs it."""

    name: str
    target: str  # llvm-cpu | cuda | vulkan-spirv | rocm | metal-spirv | vmvx
    driver: str  # local-task | local-sync | cuda | vulkan | hip | metal
    cpu: str | None  # llvm-cpu only: "host", "generic" or an LLVM CPU name
    cpu_features: str | None  # llvm-cpu only
    arch: str | None  # cuda: sm_XX; rocm: gfxNNNN
    backend: BackendSpec | None = None  # the device of an external backend
    # the app named the driver: the runtime runs it as named (myelin.runtime.devices.host_drivers)
    driver_pinned: bool = False
    # llvm-cpu only: IREE packs weights for its matmul kernels; None: the build chooses for the
    # CPU it targets (plex.builder.plan.data_tiling_of)
    data_tiling: bool | None = None
    kernels: str | None = None  # cuda only: a kernel library (myelin.kernels), e.g. "triton"
    # cuda, llvm-cpu: storage twins: device results export DLPack (myelin.compiler.storage_twins)
    result_storage: bool = False
    # llvm-cpu only: "f32", or "bf16": contraction inputs rounded to bf16 (myelin.compiler.
    # cpu_compute); None: the build chooses (plex.builder.plan.compute_of)
    compute: str | None = None
    # llvm-cpu only: "rows" or "iree" (myelin.compiler.cpu_matmul_tiles); None: the build
    # chooses for the CPU it targets (plex.builder.plan.matmul_tiles_of)
    matmul_tiles: str | None = None
    # llvm-cpu only: "vector" or "iree" (myelin.compiler.cpu_reductions); None: the build
    # chooses for the CPU it targets (plex.builder.plan.reductions_of)
    reductions: str | None = None
    # llvm-cpu only: "whole" or "iree" (myelin.compiler.cpu_relayout_tiles); None: the build
    # chooses for the CPU it targets (plex.builder.plan.relayout_tiles_of)
    relayout_tiles: str | None = None
    # llvm-cpu only: "images" or "iree" (myelin.compiler.cpu_convolution); None: the build
    # chooses with data tiling (plex.builder.plan.conv_batch_of)
    conv_batch: str | None = None


@dataclass(frozen=True)
class BackendSpec:
    """A package's `[backend.<name>]`: an external library behind IREE's executable-plugin
    contract (myelin.backends), the ops it implements, and the device kind that hosts it."""

    ref: str  # "package:name"
    package: str
    name: str
    sources: tuple[Path, ...]  # C sources compiled into the plugin; empty with `library`
    library: Path | None  # a prebuilt plugin
    ops: tuple[str, ...]
    device: str  # the device kind: "cpu" (host memory, local-task)
    include_dirs: tuple[Path, ...]
    libraries: tuple[Path, ...]  # vendor shared libraries the plugin links, bundled in the .mln
    static_libraries: tuple[Path, ...]  # vendor archives linked into the plugin
    cflags: tuple[str, ...]
    min_flops: int


@dataclass(frozen=True)
class VariantSpec:
    """A set of devices compiled into the artifact together; the runtime picks one variant."""

    name: str
    devices: tuple[DeviceSpec, ...]


@dataclass(frozen=True)
class WeightsSpec:
    """A package's `[weights.<name>]`: where parameters come from and how they are encoded."""

    ref: str  # "package:name"
    package: str
    name: str
    source: Path | None  # None: the weights are inline in the graph source
    format: str | None  # "safetensors"; None when `source` is None
    scope: str
    codec: str


@dataclass(frozen=True)
class TuningSpec:
    """A package's `[tuning.<name>]`: a transform-dialect tuning spec for one target."""

    ref: str
    package: str
    name: str
    path: Path | None  # None: the table sets only weight layouts
    target: str
    # (parameter glob, "nk" | "kn") in file order: the stored layouts it chooses
    layouts: tuple[tuple[str, str], ...] = ()
    # tuning.json whose kernel-config entries choose the kernel library's configs per shape
    kernels: Path | None = None


@dataclass(frozen=True)
class ShardSpec:
    """One shard of a graph: compiled to its own VM module, `<graph>_<shard>`.

    A shard either takes some entrypoints out of the graph's source (`own_source` False) or has
    a source file of its own (then a change to that file recompiles only this shard).
    """

    name: str
    source: Path
    source_symbol: str | None  # Python sources: the function after ':'; else None
    frontend: str
    entrypoints: tuple[str, ...] | None  # None: every public function of its own source
    own_source: bool


@dataclass(frozen=True)
class GraphSpec:
    """A package's `[graph.<name>]`: one model graph and the frontend that imports it."""

    ref: str  # "package:name"
    package: str
    name: str
    source: Path | None  # the file (for Python, the module file); None: every shard has its own
    source_symbol: str | None  # Python sources: the function after ':'; else None
    frontend: str  # mlir | stablehlo | onnx | torch | jax (no source: the first shard's)
    entrypoints: tuple[str, ...] | None  # None: every public function
    arg_names: FrozenDict[str, tuple[str, ...]]
    weights_ref: str | None = None  # "package:name", as written but always qualified
    weights: WeightsSpec | None = None  # resolved by load_app; load_package leaves it None
    shards: tuple[ShardSpec, ...] = ()  # empty: one VM module named after the graph
    # argument name (or "entrypoint.argument") -> {dimension index -> dimension name}: dims the
    # frontend keeps dynamic; equal names are equal sizes
    dynamic: FrozenDict[str, FrozenDict[int, str]] = field(default_factory=FrozenDict)
    host_fallback: bool = False  # ops IREE cannot lower run in a host VM module
    # frontend = "causal-lm" (source: the model folder's config.json): cache slots per
    # sequence and sequences per call; None: the frontend's defaults
    max_seq: int | None = None
    max_batch: int | None = None
    dtype: str | None = None  # causal-lm: the compute (and KV cache) dtype; None: float32
    # causal-lm: static prompt lengths, each exported as `prefill_<n>`; None: only `prefill`
    prefill_lengths: tuple[int, ...] | None = None


@dataclass(frozen=True)
class PackageSpec:
    """A package's identity: `[package]`, where it lives, and the fingerprint of its content."""

    name: str
    version: str
    description: str
    path: Path  # the package folder
    manifest_path: Path  # its plex.toml
    fingerprint: str  # sha256 hex over plex.toml and every file it references


@dataclass(frozen=True)
class PackageManifest:
    """One validated `plex.toml`, as `load_package` returns it. References are not resolved."""

    spec: PackageSpec
    graphs: FrozenDict[str, GraphSpec]
    weights: FrozenDict[str, WeightsSpec]
    tuning: FrozenDict[str, TuningSpec]
    files: tuple[Path, ...]  # plex.toml and every file it references, in fingerprint order
    backends: FrozenDict[str, BackendSpec] = field(default_factory=FrozenDict)


@dataclass(frozen=True)
class BuildOptions:
    """`[build]` of an app."""

    jobs: int
    temp_memory: int  # bytes
    cache: Path | None  # None: the caller picks the user cache folder
    executor: str = "local"  # `[build] executor` (plex.manifest._executor's grammar)


@dataclass(frozen=True)
class PlacementRule:
    """One `[placement]` entry: `"<glob>" = "<device>"` or `"<glob>.<function glob>" = ...`.

    The part before the first `.` names graphs or shard modules (`<graph>_<shard>`); the part
    after it, if any, names public functions of those. Function rules beat module rules, and
    the first listed wins among rules of one kind (`myelin.compiler.placement`).
    """

    pattern: str
    device: str

    @property
    def op(self) -> str | None:
        """`"<graph glob>:<op>"` places ops of that kind (e.g. `matmul`) on a backend device."""
        _, colon, op = self.pattern.partition(":")
        return op if colon else None

    @property
    def module_glob(self) -> str:
        return self.pattern.partition(":")[0].partition(".")[0]

    @property
    def function_glob(self) -> str | None:
        _, dot, tail = self.pattern.partition(".")
        return tail if dot else None

    def names_module(self, graph: str, module: str) -> bool:
        """Whether the rule is about graph `graph` or its module `module`."""
        import fnmatch

        return fnmatch.fnmatchcase(graph, self.module_glob) or fnmatch.fnmatchcase(
            module, self.module_glob
        )


@dataclass(frozen=True)
class ProfileOptions:
    """`[runtime.profile]`: how `plex profile` captures (see docs/runtime.md)."""

    output: str | None  # capture file path; `{capture}` becomes a unique id per capture
    device_timing: bool  # device timestamps per dispatch (GPU drivers; CPU drivers refuse)


@dataclass(frozen=True)
class AppSpec:
    """A resolved `app.toml`: everything a build needs, with package references resolved."""

    name: str
    version: str
    path: Path  # app.toml
    packages: tuple[PackageSpec, ...]  # the listed packages, then those found on PLEX_PATH
    graphs: tuple[GraphSpec, ...]
    devices: tuple[DeviceSpec, ...]
    variants: tuple[VariantSpec, ...]
    favor: str  # min-memory | max-concurrency | debug
    residency: str  # resident | streamed | prefetch (myelin.runtime.residency)
    build: BuildOptions
    placement: tuple[PlacementRule, ...] = ()  # `[placement]`, in file order
    memory: int | None = None  # `[runtime] memory`: admission budget per variant, bytes
    cancellable: bool = True  # `[runtime] cancellable`: async-external ABI (fences)
    profile: ProfileOptions | None = None  # `[runtime.profile]`
    # `[weights.codec]`: (parameter glob, codec) in file order; the last match wins
    codecs: tuple[tuple[str, str], ...] = ()
    # `[myelin] tuning`: the tuning specs the app selects, at most one per compiler target
    tuning: tuple[TuningSpec, ...] = ()
