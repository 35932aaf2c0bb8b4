"""External backends: the BLAS backend built from a package, its calls next to IREE codegen,
and the errors a missing or unloadable backend gives (docs/backends.md).

The runtime half runs in a fresh interpreter: IREE reads executable plugins when it creates the
local-task driver, once per process, and this test process has created it long before.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from plex.builder import build
from plex.errors import ManifestError
from plex.manifest import load_app

pytest.importorskip("scipy_openblas32", reason="the BLAS backend needs pip install '.[blas]'")

REPO = Path(__file__).resolve().parents[2]
BLAS = REPO / "examples" / "backends" / "blas"

# x -> relu -> @ w1^T (matmul, weight transposed: on BLAS) -> + acc @ w3 (accumulating into a
# non-zero output: stays codegen) -> a batch_matmul with a broadcast weight (on BLAS)
MODEL = """
#id2 = affine_map<(i, j) -> (i, j)>
#id3 = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#bc = affine_map<(d0, d1, d2) -> (d1, d2)>
func.func @forward(%x: tensor<?x64xf32>, %w1: tensor<48x64xf32>, %w2: tensor<48x32xf32>,
                   %acc: tensor<?x48xf32>, %w3: tensor<48x48xf32>) -> (tensor<?x48xf32>, tensor<1x?x32xf32>) {
  %c0 = arith.constant 0 : index
  %zero = arith.constant 0.0 : f32
  %n = tensor.dim %x, %c0 : tensor<?x64xf32>
  %e = tensor.empty(%n) : tensor<?x64xf32>
  %r = linalg.generic {indexing_maps = [#id2, #id2], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<?x64xf32>) outs(%e : tensor<?x64xf32>) {
    ^bb0(%a: f32, %o: f32):
      %m = arith.maximumf %a, %zero : f32
      linalg.yield %m : f32
  } -> tensor<?x64xf32>
  %t0 = tensor.empty() : tensor<64x48xf32>
  %t = linalg.transpose ins(%w1 : tensor<48x64xf32>) outs(%t0 : tensor<64x48xf32>) permutation = [1, 0]
  %y0 = tensor.empty(%n) : tensor<?x48xf32>
  %yz = linalg.fill ins(%zero : f32) outs(%y0 : tensor<?x48xf32>) -> tensor<?x48xf32>
  %y = linalg.matmul ins(%r, %t : tensor<?x64xf32>, tensor<64x48xf32>) outs(%yz : tensor<?x48xf32>) -> tensor<?x48xf32>
  %z = linalg.matmul ins(%y, %w3 : tensor<?x48xf32>, tensor<48x48xf32>) outs(%acc : tensor<?x48xf32>) -> tensor<?x48xf32>
  %z3 = tensor.expand_shape %z [[0, 1], [2]] output_shape [1, %n, 48] : tensor<?x48xf32> into tensor<1x?x48xf32>
  %b0 = tensor.empty() : tensor<1x48x32xf32>
  %b = linalg.generic {indexing_maps = [#bc, #id3], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%w2 : tensor<48x32xf32>) outs(%b0 : tensor<1x48x32xf32>) {
    ^bb0(%a: f32, %o: f32):
      linalg.yield %a : f32
  } -> tensor<1x48x32xf32>
  %o0 = tensor.empty(%n) : tensor<1x?x32xf32>
  %oz = linalg.fill ins(%zero : f32) outs(%o0 : tensor<1x?x32xf32>) -> tensor<1x?x32xf32>
  %o = linalg.batch_matmul ins(%z3, %b : tensor<1x?x48xf32>, tensor<1x48x32xf32>) outs(%oz : tensor<1x?x32xf32>) -> tensor<1x?x32xf32>
  return %z, %o : tensor<?x48xf32>, tensor<1x?x32xf32>
}
"""

APP = """
[app]
name = "mm"
packages = ["mm", "{blas}"]

[devices.cpu]
target = "llvm-cpu"

[devices.blas]
backend = "blas"

[placement]
"mm:matmul" = "blas"
"""

RUN = """
import json, sys
import numpy as np
import myelin
model = myelin.Instance(allow_native_code=True).load(sys.argv[1])
rng = np.random.default_rng(0)
x = rng.standard_normal((7, 64), dtype=np.float32)
w1 = rng.standard_normal((48, 64), dtype=np.float32)
w2 = rng.standard_normal((48, 32), dtype=np.float32)
acc = rng.standard_normal((7, 48), dtype=np.float32)
w3 = rng.standard_normal((48, 48), dtype=np.float32)
with model.session() as s:
    z, o = s.call("forward", x, w1, w2, acc, w3)
y = np.maximum(x, 0) @ w1.T
want_z = acc + y @ w3
want_o = (want_z @ w2)[None]
print(json.dumps({"z": float(np.abs(z - want_z).max() / np.abs(want_z).max()),
                  "o": float(np.abs(o - want_o).max() / np.abs(want_o).max()),
                  "devices": model.device_names}))
"""


def _package(tmp: Path, model: str) -> None:
    """Package `mm` in tmp/mm: one graph of `model` (MLIR text)."""
    (tmp / "mm").mkdir()
    (tmp / "mm" / "model.mlir").write_text(model)
    (tmp / "mm" / "plex.toml").write_text(
        '[package]\nname = "mm"\n[graph.mm]\nsource = "model.mlir"\n'
    )


def _copy_backend(tmp: Path, package: Path, toml: str) -> Path:
    """tmp/backend: `package`'s C file beside `toml`, and the C both CPU backends compile
    (../cpu_ops) beside it."""
    backend = tmp / "backend"
    backend.mkdir()
    (backend / "plex.toml").write_text(toml)
    for source in package.glob("*.c"):
        (backend / source.name).write_text(source.read_text())
    shared = package.parent / "cpu_ops" / "plex_cpu_ops.c"
    (tmp / "cpu_ops").mkdir()
    (tmp / "cpu_ops" / shared.name).write_text(shared.read_text())
    return backend


def _app(tmp: Path, backend_toml: str | None = None) -> Path:
    _package(tmp, MODEL)
    blas = BLAS
    if backend_toml is not None:
        blas = tmp / "backend"
        blas.mkdir()
        (blas / "plex.toml").write_text(backend_toml)
    app = tmp / "app.toml"
    app.write_text(APP.format(blas=blas))
    return app


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )


def _build_and_run(tmp: Path, model: str, app_toml: str, script: str) -> dict:
    """Package `mm` of `model` in the app `app_toml`, built and its .mln run by `script` in a
    fresh process: the JSON `script` printed last."""
    _package(tmp, model)
    app = tmp / "app.toml"
    app.write_text(app_toml)
    out = tmp / "mm.mln"
    build(app, out)
    result = _run(script, str(out))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_blas_backend_matches_numpy_next_to_codegen(tmp_path):
    out = tmp_path / "mm.mln"
    build(_app(tmp_path), out)

    result = _run(RUN, str(out))
    assert result.returncode == 0, result.stderr
    errors = json.loads(result.stdout.splitlines()[-1])
    assert errors["z"] < 1e-5 and errors["o"] < 1e-5, errors
    assert errors["devices"] == ["cpu", "blas"]

    inspected = subprocess.run(
        [sys.executable, "-m", "plex", "inspect", str(out)], capture_output=True, text=True
    )
    assert "external backends" in inspected.stdout and "libscipy_openblas.so" in inspected.stdout


def test_which_ops_went_to_the_backend_is_recorded(tmp_path):
    from iree.compiler import ir

    from myelin.compiler.backend_ops import place_backend_ops

    with ir.Context():
        module = ir.Module.parse(MODEL)
        calls = place_backend_ops(
            module.operation, [("blas", "blas", "matmul", 0)], ["cpu", "blas"]
        )
        text = str(module)
    placed = [(c.op, c.device, c.note) for c in calls]
    assert placed == [
        ("linalg.matmul", "blas", "transposed B"),
        ("linalg.matmul", None, "its output accumulates into a value that is not zeros"),
        ("linalg.batch_matmul", "blas", "shared B"),
    ]
    assert text.count("flow.dispatch @plex_backend_blas::@matmul") == 2
    assert "call @plex_blas_matmul(" in text  # the import the plugin resolves
    assert "unified_memory = true" in text  # Stream passes the buffers, no copies


def test_missing_backend_library_is_a_clear_error(tmp_path):
    toml = (
        (BLAS / "plex.toml").read_text().replace("lib/libscipy_openblas.so", "lib/libnot_there.so")
    )
    _package(tmp_path, MODEL)
    app = tmp_path / "app.toml"
    app.write_text(APP.format(blas=_copy_backend(tmp_path, BLAS, toml)))
    with pytest.raises(ManifestError) as e:
        load_app(app)
    message = str(e.value)
    assert "plex.toml:" in message and "[backend.blas] libraries[0]" in message
    assert "backend library not found" in message and "libnot_there.so" in message

    missing_module = toml.replace('"scipy_openblas32"', '"no_such_vendor_wheel"')
    (tmp_path / "backend" / "plex.toml").write_text(missing_module)
    with pytest.raises(
        ManifestError, match="vendor module 'no_such_vendor_wheel' is not installed"
    ):
        load_app(app)


def test_an_unloadable_backend_plugin_is_a_clear_error(tmp_path):
    app = _app(
        tmp_path,
        '[package]\nname = "broken"\n[backend.blas]\nlibrary = "plugin.so"\nops = ["matmul"]\n',
    )
    (tmp_path / "backend" / "plugin.so").write_text("not a shared object\n")
    out = tmp_path / "mm.mln"
    build(app, out)
    result = _run(
        "import sys, myelin; myelin.Instance(allow_native_code=True).load(sys.argv[1])", str(out)
    )
    assert result.returncode != 0
    assert "backend 'blas': its plugin does not load here" in result.stderr


def test_a_backend_loaded_after_the_first_local_task_device_is_refused(tmp_path):
    out = tmp_path / "mm.mln"
    build(_app(tmp_path), out)
    script = """
    import sys, myelin
    myelin.Instance().device_registry.device("local-task")  # a device before the backend
    try:
        myelin.Instance(allow_native_code=True).load(sys.argv[1])
    except myelin.DeviceUnavailable as e:
        print(e)
    """
    result = _run(script, str(out))
    assert "must be loaded before this process creates its first local-task device" in (
        result.stdout
    ), result.stderr


def test_op_placement_needs_a_backend_device(tmp_path):
    app = _app(tmp_path)
    app.write_text(app.read_text().replace('"mm:matmul" = "blas"', '"mm:matmul" = "cpu"'))
    with pytest.raises(ManifestError, match="device 'cpu' has no backend"):
        load_app(app)
    app.write_text(app.read_text().replace('"mm:matmul" = "cpu"', '"mm" = "blas"'))
    with pytest.raises(ManifestError, match="it runs ops, not graphs"):
        load_app(app)


def test_a_variant_of_only_backend_devices_is_a_manifest_error(tmp_path):
    app = _app(tmp_path)
    text = app.read_text()
    app.write_text(text.replace('[devices.cpu]\ntarget = "llvm-cpu"\n', ""))
    with pytest.raises(ManifestError, match="variant 'default' has only backend devices"):
        load_app(app)
    app.write_text(
        text
        + '\n[[variant]]\nname = "cpu"\ndevices = ["cpu", "blas"]\n'
        + '\n[[variant]]\nname = "blas_only"\ndevices = ["blas"]\n'
    )
    with pytest.raises(ManifestError, match="variant 'blas_only' has only backend devices"):
        load_app(app)


# an attention (as IREE's torch import makes it, i1 mask) next to a batched matmul whose every
# B is transposed, with enough rows and batches to be split over several workgroups
ATTENTION_MODEL = """
#q = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d3)>
#k = affine_map<(d0, d1, d2, d3, d4) -> (d0, d4, d3)>
#v = affine_map<(d0, d1, d2, d3, d4) -> (d0, d4, d2)>
#s = affine_map<(d0, d1, d2, d3, d4) -> ()>
#m = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d4)>
#o = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2)>
func.func @forward(%q: tensor<?x?x32xf32>, %k: tensor<?x?x32xf32>, %v: tensor<?x?x32xf32>,
                   %mask: tensor<?x?x?xi1>, %x: tensor<?x?x24xf32>, %w: tensor<?x40x24xf32>)
    -> (tensor<?x?x32xf32>, tensor<?x?x40xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %scale = arith.constant 0.25 : f32
  %zero = arith.constant 0.0 : f32
  %b = tensor.dim %q, %c0 : tensor<?x?x32xf32>
  %l = tensor.dim %q, %c1 : tensor<?x?x32xf32>
  %e = tensor.empty(%b, %l) : tensor<?x?x32xf32>
  %a = iree_linalg_ext.attention <indexing_maps = [#q, #k, #v, #s, #m, #o]>
      ins(%q, %k, %v, %scale, %mask : tensor<?x?x32xf32>, tensor<?x?x32xf32>,
          tensor<?x?x32xf32>, f32, tensor<?x?x?xi1>) outs(%e : tensor<?x?x32xf32>) {
    ^bb0(%s: f32):
      iree_linalg_ext.yield %s : f32
  } -> tensor<?x?x32xf32>
  %nb = tensor.dim %x, %c0 : tensor<?x?x24xf32>
  %nm = tensor.dim %x, %c1 : tensor<?x?x24xf32>
  %t0 = tensor.empty(%nb) : tensor<?x24x40xf32>
  %t = linalg.transpose ins(%w : tensor<?x40x24xf32>) outs(%t0 : tensor<?x24x40xf32>) permutation = [0, 2, 1]
  %y0 = tensor.empty(%nb, %nm) : tensor<?x?x40xf32>
  %yz = linalg.fill ins(%zero : f32) outs(%y0 : tensor<?x?x40xf32>) -> tensor<?x?x40xf32>
  %y = linalg.batch_matmul ins(%x, %t : tensor<?x?x24xf32>, tensor<?x24x40xf32>) outs(%yz : tensor<?x?x40xf32>) -> tensor<?x?x40xf32>
  return %a, %y : tensor<?x?x32xf32>, tensor<?x?x40xf32>
}
"""

ATTENTION_RUN = """
import json, sys
import numpy as np
import myelin
model = myelin.Instance(allow_native_code=True).load(sys.argv[1])
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((20, 150, 32), dtype=np.float32) for _ in range(3))
mask = rng.random((20, 150, 150)) < 0.7
mask[:, :, 0] = True  # every query sees at least one key
x = rng.standard_normal((20, 150, 24), dtype=np.float32)
w = rng.standard_normal((20, 40, 24), dtype=np.float32)
with model.session() as s:
    a, y = s.call("forward", q, k, v, mask, x, w)
scores = np.where(mask, q @ k.transpose(0, 2, 1) * 0.25, -np.inf)
p = np.exp(scores - scores.max(-1, keepdims=True))
want_a = (p / p.sum(-1, keepdims=True)) @ v
want_y = x @ w.transpose(0, 2, 1)
print(json.dumps({"a": float(np.abs(a - want_a).max()), "y": float(np.abs(y - want_y).max())}))
"""


def test_attention_and_split_calls_on_the_backend_match_numpy(tmp_path):
    from iree.compiler import ir

    from myelin.compiler.backend_ops import place_backend_ops

    with ir.Context():
        module = ir.Module.parse(ATTENTION_MODEL)
        calls = place_backend_ops(
            module.operation, [("blas", "blas", "matmul", 0)], ["cpu", "blas"]
        )
    placed = [(c.function, c.op, c.device, c.note.split(":")[0]) for c in calls]
    assert placed == [
        ("forward", "iree_linalg_ext.attention", "blas", "decomposed"),
        ("forward", "linalg.batch_matmul", "blas", "transposed B"),
        ("plex_attention_0", "linalg.batch_matmul", "blas", "transposed B"),  # Q @ K^T
        ("plex_attention_0", "linalg.batch_matmul", "blas", "plain"),  # P @ V
    ]

    errors = _build_and_run(tmp_path, ATTENTION_MODEL, APP.format(blas=BLAS), ATTENTION_RUN)
    assert errors["a"] < 1e-5 and errors["y"] < 1e-4, errors


def test_fused_attention_on_the_backend_matches_numpy(tmp_path):
    """With `attention` placed too, the whole attention is one backend call (its masked
    softmax computed by the backend between the two sgemms), split over the heads."""
    from iree.compiler import ir

    from myelin.compiler.backend_ops import place_backend_ops

    rules = [("blas", "blas", "matmul", 0), ("blas", "blas", "attention", 0)]
    with ir.Context():
        module = ir.Module.parse(ATTENTION_MODEL)
        calls = place_backend_ops(module.operation, rules, ["cpu", "blas"])
        text = str(module)
    placed = [(c.op, c.device, c.note) for c in calls]
    assert placed == [
        ("iree_linalg_ext.attention", "blas", "fused call: i1 mask, split over the heads"),
        ("linalg.batch_matmul", "blas", "transposed B"),
    ]
    assert "iree_linalg_ext.attention" not in text and "plex_blas_attention" in text

    errors = _build_and_run(
        tmp_path,
        ATTENTION_MODEL,
        APP.format(blas=BLAS) + '"mm:attention" = "blas"\n',
        ATTENTION_RUN,
    )
    assert errors["a"] < 1e-5 and errors["y"] < 1e-4, errors


# Q, K, V as a BERT-style import splits its projections into heads ([batch, len, heads, e],
# heads moved in front and collapsed into the batch) and a [batch, 1, l, s] mask broadcast over
# the heads: the fused call reads all four as they are
HEADS_MODEL = """
#q = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d3)>
#k = affine_map<(d0, d1, d2, d3, d4) -> (d0, d4, d3)>
#v = affine_map<(d0, d1, d2, d3, d4) -> (d0, d4, d2)>
#s = affine_map<(d0, d1, d2, d3, d4) -> ()>
#m = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d4)>
#o = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2)>
#bc = affine_map<(d0, d1, d2, d3) -> (d0, 0, d2, d3)>
#id4 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
func.func @forward(%q4: tensor<?x?x4x32xf32>, %k4: tensor<?x?x4x32xf32>,
                   %v4: tensor<?x?x4x16xf32>, %m4: tensor<?x1x?x?xi1>) -> tensor<?x?x16xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c3 = arith.constant 3 : index
  %scale = arith.constant 0.125 : f32
  %b = tensor.dim %q4, %c0 : tensor<?x?x4x32xf32>
  %l = tensor.dim %q4, %c1 : tensor<?x?x4x32xf32>
  %s = tensor.dim %k4, %c1 : tensor<?x?x4x32xf32>
  %tq0 = tensor.empty(%b, %l) : tensor<?x4x?x32xf32>
  %tq = linalg.transpose ins(%q4 : tensor<?x?x4x32xf32>) outs(%tq0 : tensor<?x4x?x32xf32>) permutation = [0, 2, 1, 3]
  %tk0 = tensor.empty(%b, %s) : tensor<?x4x?x32xf32>
  %tk = linalg.transpose ins(%k4 : tensor<?x?x4x32xf32>) outs(%tk0 : tensor<?x4x?x32xf32>) permutation = [0, 2, 1, 3]
  %tv0 = tensor.empty(%b, %s) : tensor<?x4x?x16xf32>
  %tv = linalg.transpose ins(%v4 : tensor<?x?x4x16xf32>) outs(%tv0 : tensor<?x4x?x16xf32>) permutation = [0, 2, 1, 3]
  %mb0 = tensor.empty(%b, %l, %s) : tensor<?x4x?x?xi1>
  %mb = linalg.generic {indexing_maps = [#bc, #id4], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%m4 : tensor<?x1x?x?xi1>) outs(%mb0 : tensor<?x4x?x?xi1>) {
    ^bb0(%in: i1, %out: i1):
      linalg.yield %in : i1
  } -> tensor<?x4x?x?xi1>
  %q = tensor.collapse_shape %tq [[0, 1], [2], [3]] : tensor<?x4x?x32xf32> into tensor<?x?x32xf32>
  %k = tensor.collapse_shape %tk [[0, 1], [2], [3]] : tensor<?x4x?x32xf32> into tensor<?x?x32xf32>
  %v = tensor.collapse_shape %tv [[0, 1], [2], [3]] : tensor<?x4x?x16xf32> into tensor<?x?x16xf32>
  %m = tensor.collapse_shape %mb [[0, 1], [2], [3]] : tensor<?x4x?x?xi1> into tensor<?x?x?xi1>
  %bh = arith.muli %b, %c2 : index
  %bh2 = arith.muli %bh, %c2 : index
  %e = tensor.empty(%bh2, %l) : tensor<?x?x16xf32>
  %a = iree_linalg_ext.attention <indexing_maps = [#q, #k, #v, #s, #m, #o]>
      ins(%q, %k, %v, %scale, %m : tensor<?x?x32xf32>, tensor<?x?x32xf32>,
          tensor<?x?x16xf32>, f32, tensor<?x?x?xi1>) outs(%e : tensor<?x?x16xf32>) {
    ^bb0(%x: f32):
      iree_linalg_ext.yield %x : f32
  } -> tensor<?x?x16xf32>
  return %a : tensor<?x?x16xf32>
}
"""

HEADS_RUN = """
import json, sys
import numpy as np
import myelin
model = myelin.Instance(allow_native_code=True).load(sys.argv[1])
rng = np.random.default_rng(0)
q, k = (rng.standard_normal((3, 70, 4, 32), dtype=np.float32) for _ in range(2))
v = rng.standard_normal((3, 70, 4, 16), dtype=np.float32)
mask = rng.random((3, 1, 70, 70)) < 0.6
mask[..., 0] = True
with model.session() as s:
    a = s.call("forward", q, k, v, mask)
heads = lambda x: x.transpose(0, 2, 1, 3).reshape(12, 70, -1)
scores = heads(q) @ heads(k).transpose(0, 2, 1) * 0.125
scores = np.where(np.repeat(mask, 4, axis=1).reshape(12, 70, 70), scores, -np.inf)
p = np.exp(scores - scores.max(-1, keepdims=True))
want = (p / p.sum(-1, keepdims=True)) @ heads(v)
print(json.dumps({"a": float(np.abs(a - want).max())}))
"""


def test_fused_attention_reads_heads_and_mask_as_projected(tmp_path):
    from iree.compiler import ir

    from myelin.compiler.backend_ops import place_backend_ops

    with ir.Context():
        module = ir.Module.parse(HEADS_MODEL)
        calls = place_backend_ops(
            module.operation, [("blas", "blas", "attention", 0)], ["cpu", "blas"]
        )
    assert [c.note for c in calls] == [
        "fused call: i1 mask, Q, K, V read as projected (no head transposes), one mask per "
        "batch, split over the heads"
    ]
    errors = _build_and_run(
        tmp_path,
        HEADS_MODEL,
        APP.format(blas=BLAS).replace('"mm:matmul"', '"mm:attention"'),
        HEADS_RUN,
    )
    assert errors["a"] < 1e-5, errors


# GELU as PyTorch's nn.GELU() imports (x * 0.5 * (1 + erf(x / sqrt(2)))), once after a bias
# add (taken along into the call) and once on its own
GELU_MODEL = """
#id = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d1)>
func.func @forward(%x: tensor<?x100xf32>, %bias: tensor<100xf32>)
    -> (tensor<?x100xf32>, tensor<?x100xf32>) {
  %c0 = arith.constant 0 : index
  %sqrt2 = arith.constant 1.41421354 : f32
  %one = arith.constant 1.0 : f32
  %half = arith.constant 0.5 : f32
  %n = tensor.dim %x, %c0 : tensor<?x100xf32>
  %e = tensor.empty(%n) : tensor<?x100xf32>
  %sum = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x, %bias : tensor<?x100xf32>, tensor<100xf32>) outs(%e : tensor<?x100xf32>) {
    ^bb0(%a: f32, %b: f32, %o: f32):
      %r = arith.addf %a, %b : f32
      linalg.yield %r : f32
  } -> tensor<?x100xf32>
  %g1 = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%sum : tensor<?x100xf32>) outs(%e : tensor<?x100xf32>) {
    ^bb0(%a: f32, %o: f32):
      %0 = arith.divf %a, %sqrt2 : f32
      %1 = math.erf %0 : f32
      %2 = arith.addf %1, %one : f32
      %3 = arith.mulf %2, %half : f32
      %4 = arith.mulf %a, %3 : f32
      linalg.yield %4 : f32
  } -> tensor<?x100xf32>
  %g2 = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<?x100xf32>) outs(%e : tensor<?x100xf32>) {
    ^bb0(%a: f32, %o: f32):
      %0 = arith.divf %a, %sqrt2 : f32
      %1 = math.erf %0 : f32
      %2 = arith.addf %1, %one : f32
      %3 = arith.mulf %2, %half : f32
      %4 = arith.mulf %a, %3 : f32
      linalg.yield %4 : f32
  } -> tensor<?x100xf32>
  return %g1, %g2 : tensor<?x100xf32>, tensor<?x100xf32>
}
"""

GELU_RUN = """
import json, math, sys
import numpy as np
import myelin
model = myelin.Instance(allow_native_code=True).load(sys.argv[1])
rng = np.random.default_rng(0)
x = (rng.standard_normal((150, 100)) * 4).astype(np.float32)
bias = rng.standard_normal(100).astype(np.float32)
with model.session() as s:
    g1, g2 = s.call("forward", x, bias)
erf = np.vectorize(math.erf)
gelu = lambda v: v * 0.5 * (1 + erf(v / math.sqrt(2)))
print(json.dumps({"g1": float(np.abs(g1 - gelu((x + bias).astype(np.float64))).max()),
                  "g2": float(np.abs(g2 - gelu(x.astype(np.float64))).max())}))
"""


def test_gelu_and_its_bias_add_on_the_backend_match_numpy(tmp_path):
    from iree.compiler import ir

    from myelin.compiler.backend_ops import place_backend_ops

    with ir.Context():
        module = ir.Module.parse(GELU_MODEL)
        calls = place_backend_ops(module.operation, [("blas", "blas", "gelu", 0)], ["cpu", "blas"])
        text = str(module)
    assert [(c.op, c.note) for c in calls] == [
        ("gelu", "with the bias add before it"),
        ("gelu", "plain"),
    ]
    assert "math.erf" not in text
    errors = _build_and_run(
        tmp_path, GELU_MODEL, APP.format(blas=BLAS).replace('"mm:matmul"', '"mm:gelu"'), GELU_RUN
    )
    assert errors["g1"] < 1e-5 and errors["g2"] < 1e-5, errors


def test_a_backend_artifact_can_be_profiled(tmp_path):
    import numpy as np

    from myelin.runtime.profiling import capture

    out = tmp_path / "mm.mln"
    build(_app(tmp_path), out)
    rng = np.random.default_rng(0)
    shapes = [(7, 64), (48, 64), (48, 32), (7, 48), (48, 48)]
    inputs = [rng.standard_normal(s, dtype=np.float32) for s in shapes]
    result = capture(out, "forward", inputs, tmp_path / "profile")
    assert result.profile.exists() and result.dispatches, result


# a few rows times a wide weight (as MiniLM's projections at batch 1): both matmuls are split
# into blocks of columns (400 columns: three blocks of >= 192), one with its weight transposed
# as stored, one with it as [k][n]; a block's rows of C and of that B have the op's whole width
WIDE_MODEL = """
func.func @forward(%x: tensor<?x64xf32>, %w: tensor<400x64xf32>, %u: tensor<64x400xf32>)
    -> (tensor<?x400xf32>, tensor<?x400xf32>) {
  %c0 = arith.constant 0 : index
  %zero = arith.constant 0.0 : f32
  %n = tensor.dim %x, %c0 : tensor<?x64xf32>
  %t0 = tensor.empty() : tensor<64x400xf32>
  %t = linalg.transpose ins(%w : tensor<400x64xf32>) outs(%t0 : tensor<64x400xf32>) permutation = [1, 0]
  %y0 = tensor.empty(%n) : tensor<?x400xf32>
  %yz = linalg.fill ins(%zero : f32) outs(%y0 : tensor<?x400xf32>) -> tensor<?x400xf32>
  %y = linalg.matmul ins(%x, %t : tensor<?x64xf32>, tensor<64x400xf32>) outs(%yz : tensor<?x400xf32>) -> tensor<?x400xf32>
  %z = linalg.matmul ins(%x, %u : tensor<?x64xf32>, tensor<64x400xf32>) outs(%yz : tensor<?x400xf32>) -> tensor<?x400xf32>
  return %y, %z : tensor<?x400xf32>, tensor<?x400xf32>
}
"""

WIDE_RUN = """
import json, sys
import numpy as np
import myelin
model = myelin.Instance(allow_native_code=True).load(sys.argv[1])
rng = np.random.default_rng(0)
x = rng.standard_normal((7, 64), dtype=np.float32)
w = rng.standard_normal((400, 64), dtype=np.float32)
u = rng.standard_normal((64, 400), dtype=np.float32)
with model.session() as s:
    y, z = s.call("forward", x, w, u)
print(json.dumps({"y": float(np.abs(y - x @ w.T).max()), "z": float(np.abs(z - x @ u).max())}))
"""


def test_wide_matmuls_split_over_columns_match_numpy(tmp_path):
    errors = _build_and_run(tmp_path, WIDE_MODEL, APP.format(blas=BLAS), WIDE_RUN)
    assert errors["y"] < 1e-4 and errors["z"] < 1e-4, errors


def _sync_app(tmp: Path) -> Path:
    """The test app with both devices on local-sync: every dispatch inline on the caller."""
    app = _app(tmp)
    app.write_text(
        app.read_text()
        .replace('target = "llvm-cpu"\n', 'target = "llvm-cpu"\ndriver = "local-sync"\n')
        .replace('backend = "blas"\n', 'backend = "blas"\ndriver = "local-sync"\n')
    )
    return app


def test_a_backend_device_on_local_sync_matches_numpy(tmp_path):
    out = tmp_path / "mm.mln"
    build(_sync_app(tmp_path), out)
    script = RUN.replace(
        '"devices": model.device_names',
        '"devices": model.device_names, "drivers": [d.driver for d in model.variant_record.devices]',
    )
    result = _run(script, str(out))
    assert result.returncode == 0, result.stderr
    errors = json.loads(result.stdout.splitlines()[-1])
    assert errors["z"] < 1e-5 and errors["o"] < 1e-5, errors
    assert errors["drivers"] == ["local-sync", "local-sync"]


def test_a_backend_on_local_sync_loaded_after_a_local_sync_device_is_refused(tmp_path):
    out = tmp_path / "mm.mln"
    build(_sync_app(tmp_path), out)
    script = """
    import sys, myelin
    myelin.Instance().device_registry.device("local-task")  # another driver: no matter
    myelin.Instance().device_registry.device("local-sync")  # the backend device's driver
    try:
        myelin.Instance(allow_native_code=True).load(sys.argv[1])
    except myelin.DeviceUnavailable as e:
        print(e)
    """
    result = _run(script, str(out))
    assert "must be loaded before this process creates its first local-sync device" in (
        result.stdout
    ), result.stderr


def test_a_backend_device_off_the_llvm_cpu_target_is_a_manifest_error(tmp_path):
    app = _app(tmp_path)
    app.write_text(
        app.read_text().replace('backend = "blas"\n', 'backend = "blas"\ntarget = "vmvx"\n')
    )
    with pytest.raises(
        ManifestError, match=r"set driver to local-task \(the default\) or local-sync"
    ):
        load_app(app)


# The MKL backend (examples/backends/mkl): MKL's static libraries linked into the plugin, the
# same op contracts; each case's model next to IREE codegen ops, as for the BLAS backend above.
MKL = REPO / "examples" / "backends" / "mkl"
MKL_APP = APP.replace("blas", "mkl")  # a device "mkl" of backend "mkl", the package at {mkl}


def _mkl_installed() -> bool:
    from importlib import metadata

    try:
        metadata.distribution("mkl-static")
    except metadata.PackageNotFoundError:
        return False
    return True


needs_mkl = pytest.mark.skipif(
    not _mkl_installed(), reason="the MKL backend needs pip install '.[mkl]'"
)


@needs_mkl
@pytest.mark.parametrize(
    "model, ops, script, tolerance",
    [
        (MODEL, ["matmul"], RUN, {"z": 1e-5, "o": 1e-5}),  # relative errors
        (ATTENTION_MODEL, ["matmul", "attention"], ATTENTION_RUN, {"a": 1e-5, "y": 1e-4}),
        (WIDE_MODEL, ["matmul"], WIDE_RUN, {"y": 1e-4, "z": 1e-4}),  # column blocks
        (GELU_MODEL, ["gelu"], GELU_RUN, {"g1": 1e-5, "g2": 1e-5}),
    ],
    ids=["matmul", "attention", "column-blocks", "gelu"],
)
def test_mkl_backend_matches_numpy_next_to_codegen(tmp_path, model, ops, script, tolerance):
    placement = "".join(f'"mm:{op}" = "mkl"\n' for op in ops)
    app = MKL_APP.format(mkl=MKL).replace('"mm:matmul" = "mkl"\n', placement)
    errors = _build_and_run(tmp_path, model, app, script)
    assert all(errors[k] < tolerance[k] for k in tolerance), errors
    if "devices" in errors:
        assert errors["devices"] == ["cpu", "mkl"]


def test_missing_mkl_is_a_clear_error(tmp_path):
    """MKL is linked into the plugin at build time, so the .mln needs no MKL library at run
    time; what can be missing is the wheel at build time (or one of its archives)."""
    toml = (MKL / "plex.toml").read_text()
    backend = _copy_backend(tmp_path, MKL, toml)
    _package(tmp_path, MODEL)
    app = tmp_path / "app.toml"
    app.write_text(MKL_APP.format(mkl=backend))

    (backend / "plex.toml").write_text(toml.replace('"mkl-static"', '"no-such-mkl-wheel"'))
    with pytest.raises(ManifestError) as e:
        load_app(app)
    message = str(e.value)
    assert "[backend.mkl] vendor_distribution" in message
    assert "vendor distribution 'no-such-mkl-wheel' is not installed" in message
    assert "pip install -e '.[mkl]'" in message

    if _mkl_installed():
        (backend / "plex.toml").write_text(toml.replace("libmkl_core.a", "libmkl_gone.a"))
        with pytest.raises(ManifestError) as e:
            load_app(app)
        message = str(e.value)
        assert "[backend.mkl] static_libraries[2]" in message
        assert "backend library not found" in message and "libmkl_gone.a" in message
