"""Small real models for the runtime-policy tests (tests/myelin/test_runtime_policies_*.py) and
benchmarks/probes/runtime_policies.py, with their numpy references."""

from __future__ import annotations

import textwrap
import threading
from pathlib import Path

import numpy as np

from tests.conftest import build_app

# -- wide: 4 independent matmul chains (what Stream can run concurrently) -------------------------

WIDE_N = 256
WIDE_CHAINS = 4
_ID2 = "affine_map<(d0, d1) -> (d0, d1)>"

# The default CPU device with data tiling pinned off: these models' memory plans, schedules and
# dispatch names are what the tests check, and data tiling (on by default on AVX-512 hosts)
# would add its packing dispatches and transients.
UNTILED_CPU = '\n[devices.cpu]\ntarget = "llvm-cpu"\ndata_tiling = false\n'


def write_wide_app(folder: Path, favor: str) -> Path:
    """`forward(x, w) = sum_c ((c+1) * x) @ w @ w`: 4 chains of two 256^3 matmuls, then adds."""
    folder.mkdir(parents=True, exist_ok=True)
    n = WIDE_N
    t = f"tensor<{n}x{n}xf32>"
    lines = [
        "module @wide {",
        f"  func.func @forward(%x: {t}, %w: {t}) -> {t} {{",
        "    %zero = arith.constant 0.0 : f32",
        f"    %init = tensor.empty() : {t}",
        f"    %acc = linalg.fill ins(%zero : f32) outs(%init : {t}) -> {t}",
    ]
    outs = []
    for c in range(WIDE_CHAINS):
        lines += [
            f"    %s{c} = linalg.generic {{indexing_maps = [{_ID2}, {_ID2}], iterator_types = "
            f'["parallel", "parallel"]}} ins(%x : {t}) outs(%init : {t}) {{',
            "    ^bb0(%a: f32, %o: f32):",
            f"      %k = arith.constant {c + 1}.0 : f32",
            "      %m = arith.mulf %a, %k : f32",
            "      linalg.yield %m : f32",
            f"    }} -> {t}",
            f"    %a{c} = linalg.matmul ins(%s{c}, %w : {t}, {t}) outs(%acc : {t}) -> {t}",
            f"    %b{c} = linalg.matmul ins(%a{c}, %w : {t}, {t}) outs(%acc : {t}) -> {t}",
        ]
        outs.append(f"%b{c}")
    prev = outs[0]
    for i, o in enumerate(outs[1:]):
        lines += [
            f"    %sum{i} = linalg.generic {{indexing_maps = [{_ID2}, {_ID2}, {_ID2}], "
            f'iterator_types = ["parallel", "parallel"]}} ins({prev}, {o} : {t}, {t}) '
            f"outs(%init : {t}) {{",
            "    ^bb0(%p: f32, %q: f32, %o2: f32):",
            "      %r = arith.addf %p, %q : f32",
            "      linalg.yield %r : f32",
            f"    }} -> {t}",
        ]
        prev = f"%sum{i}"
    lines += [f"    return {prev} : {t}", "  }", "}"]
    (folder / "wide.mlir").write_text("\n".join(lines) + "\n")
    (folder / "plex.toml").write_text(
        '[package]\nname = "wide"\n\n[graph.wide]\nsource = "wide.mlir"\n'
        'arg_names = { forward = ["x", "w"] }\n'
    )
    (folder / "app.toml").write_text(
        f'[app]\nname = "wide"\npackages = ["."]\n\n[scheduling]\nfavor = "{favor}"\n' + UNTILED_CPU
    )
    return folder / "app.toml"


def wide_reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return sum(((c + 1) * x) @ w @ w for c in range(WIDE_CHAINS))


# -- chain: a deep, dynamic-batch MLP whose call time scales with the batch -----------------------

CHAIN_WIDTH = 256
CHAIN_DEPTH = 24


def chain_weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    w = rng.standard_normal((CHAIN_WIDTH, CHAIN_WIDTH)).astype(np.float32)
    return {"w": (w / np.sqrt(CHAIN_WIDTH)).astype(np.float32)}


def chain_mlir() -> str:
    """`forward(x) = tanh(...tanh(x @ w)... @ w)`, CHAIN_DEPTH layers, x: ?x256."""
    n = CHAIN_WIDTH
    t = f"tensor<?x{n}xf32>"
    body = [
        f'  util.global private @w = #flow.parameter.named<"chain"::"w"> : tensor<{n}x{n}xf32>',
        f"  func.func @forward(%x: {t}) -> {t} {{",
        f"    %w = util.global.load @w : tensor<{n}x{n}xf32>",
        "    %c0 = arith.constant 0 : index",
        f"    %b = tensor.dim %x, %c0 : {t}",
        "    %zero = arith.constant 0.0 : f32",
        f"    %init = tensor.empty(%b) : {t}",
        f"    %acc = linalg.fill ins(%zero : f32) outs(%init : {t}) -> {t}",
    ]
    prev = "%x"
    for i in range(CHAIN_DEPTH):
        body += [
            f"    %m{i} = linalg.matmul ins({prev}, %w : {t}, tensor<{n}x{n}xf32>) "
            f"outs(%acc : {t}) -> {t}",
            f"    %h{i} = linalg.generic {{indexing_maps = [{_ID2}, {_ID2}], iterator_types = "
            f'["parallel", "parallel"]}} ins(%m{i} : {t}) outs(%init : {t}) {{',
            "    ^bb0(%a: f32, %o: f32):",
            "      %y = math.tanh %a : f32",
            "      linalg.yield %y : f32",
            f"    }} -> {t}",
        ]
        prev = f"%h{i}"
    body += [f"    return {prev} : {t}", "  }"]
    return "module @chain {\n" + "\n".join(body) + "\n}\n"


def write_chain_app(folder: Path, app_extra: str = "") -> Path:
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "chain.mlir").write_text(chain_mlir())
    save_file(chain_weights(), str(folder / "w.safetensors"))
    (folder / "plex.toml").write_text(
        '[package]\nname = "chain"\n\n[graph.chain]\nsource = "chain.mlir"\nweights = "w"\n'
        'arg_names = { forward = ["x"] }\n\n[weights.w]\nsource = "w.safetensors"\n'
        'scope = "chain"\n'
    )
    (folder / "app.toml").write_text(
        f'[app]\nname = "chain"\npackages = ["."]\n{app_extra}\n{UNTILED_CPU}'
    )
    return folder / "app.toml"


def chain_reference(x: np.ndarray) -> np.ndarray:
    w = chain_weights()["w"]
    y = x
    for _ in range(CHAIN_DEPTH):
        y = np.tanh(y @ w)
    return y


def build_chain(folder: Path, app_extra: str = "") -> Path:
    return build_app(write_chain_app(folder, app_extra), folder / "chain.mln")


# -- gather: a 64 MiB table of which one call reads a few rows ------------------------------------

TABLE_ROWS = 16384
TABLE_COLS = 1024  # 16384 x 1024 x 4 B = 64 MiB


def table() -> np.ndarray:
    return np.arange(TABLE_ROWS * TABLE_COLS, dtype=np.float32).reshape(TABLE_ROWS, TABLE_COLS)


def write_gather_app(folder: Path) -> Path:
    """`lookup(ids) = table[ids]`: a call touches len(ids) rows (4 KiB each) of 64 MiB."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({"table": table()}, str(folder / "table.safetensors"))
    r, c = TABLE_ROWS, TABLE_COLS
    (folder / "gather.mlir").write_text(
        textwrap.dedent(f"""\
        module @gather {{
          util.global private @table = #flow.parameter.named<"emb"::"table"> : tensor<{r}x{c}xf32>
          func.func @lookup(%ids: tensor<?xi64>) -> tensor<?x{c}xf32> {{
            %t = util.global.load @table : tensor<{r}x{c}xf32>
            %c0 = arith.constant 0 : index
            %n = tensor.dim %ids, %c0 : tensor<?xi64>
            %init = tensor.empty(%n) : tensor<?x{c}xf32>
            %out = linalg.generic {{indexing_maps = [affine_map<(d0, d1) -> (d0)>, {_ID2}],
                                    iterator_types = ["parallel", "parallel"]}}
                ins(%ids : tensor<?xi64>) outs(%init : tensor<?x{c}xf32>) {{
              ^bb0(%id: i64, %o: f32):
                %i = arith.index_cast %id : i64 to index
                %j = linalg.index 1 : index
                %v = tensor.extract %t[%i, %j] : tensor<{r}x{c}xf32>
                linalg.yield %v : f32
            }} -> tensor<?x{c}xf32>
            return %out : tensor<?x{c}xf32>
          }}
        }}
        """)
    )
    (folder / "plex.toml").write_text(
        '[package]\nname = "gather"\n\n[graph.gather]\nsource = "gather.mlir"\nweights = "t"\n'
        'arg_names = { lookup = ["ids"] }\n\n[weights.t]\nsource = "table.safetensors"\n'
        'scope = "emb"\n'
    )
    (folder / "app.toml").write_text('[app]\nname = "gather"\npackages = ["."]\n')
    return folder / "app.toml"


# -- observing a call inside IREE -----------------------------------------------------------------


class _EnteringContext:
    """Wraps a session's VM context: runs `on_enter` as each invoke enters IREE."""

    def __init__(self, context, on_enter) -> None:
        self._context, self._on_enter = context, on_enter

    def invoke(self, function, args, results) -> None:
        self._on_enter()
        self._context.invoke(function, args, results)


def when_inside_iree(session, action=None) -> threading.Event:
    """An event set when the session's next call enters IREE's invoke (after `action` runs).

    The timing tests synchronize on this instead of sleeping: on a loaded 2-core CI machine,
    preparing a 32 MiB input alone outlasted a 50 ms sleep."""
    entered = threading.Event()

    def on_enter() -> None:
        if action is not None and not entered.is_set():
            action()
        entered.set()

    session._context = _EnteringContext(session._context, on_enter)
    return entered
