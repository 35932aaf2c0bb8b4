"""Codecs on real IR through real IREE: every codec on three consumers (a torch-style
transposed + broadcast linear into batch_matmul, a plain matmul, an embedding gather), compiled
for the host CPU with and without IREE's data tiling and checked against the numpy decode of
the same stored bytes; then the no-materialization check, on these graphs (both ways) and on
one built not to fuse."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from myelin.codecs import (
    CodecPolicy,
    CodecRule,
    ParameterInput,
    check_encoded_module,
    choose_layout,
    decode,
    encode_graph,
)
from myelin.compiler.pipeline import compile_imported, import_graph
from myelin.compiler.targets import TargetDevice, target_flags

CODECS = ["fp16", "bf16", "int8", "q4", "q4:g16"]
N, K, V, D = 96, 128, 200, 64
DATA_TILING = [False, True]


def _device(data_tiling: bool) -> TargetDevice:
    return TargetDevice("cpu", data_tiling=data_tiling)


def _name(codec: str) -> str:
    return codec.replace(":", "_")


def _functions(c: str) -> str:
    return f"""
  util.global private @w_lin_{c} = #flow.parameter.named<"g"::"lin_{c}"> : tensor<{N}x{K}xf32>
  util.global private @w_mm_{c} = #flow.parameter.named<"g"::"mm_{c}"> : tensor<{K}x{N}xf32>
  util.global private @w_emb_{c} = #flow.parameter.named<"g"::"emb_{c}"> : tensor<{V}x{D}xf32>
  func.func @lin_{c}(%x: tensor<?x?x{K}xf32>) -> tensor<?x?x{N}xf32> {{
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %b = tensor.dim %x, %c0 : tensor<?x?x{K}xf32>
    %s = tensor.dim %x, %c1 : tensor<?x?x{K}xf32>
    %w = util.global.load @w_lin_{c} : tensor<{N}x{K}xf32>
    %e0 = tensor.empty() : tensor<{K}x{N}xf32>
    %t = linalg.transpose ins(%w : tensor<{N}x{K}xf32>) outs(%e0 : tensor<{K}x{N}xf32>) permutation = [1, 0]
    %e1 = tensor.empty(%b) : tensor<?x{K}x{N}xf32>
    %bc = linalg.generic {{indexing_maps = [affine_map<(d0, d1, d2) -> (d1, d2)>, affine_map<(d0, d1, d2) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel"]}} ins(%t : tensor<{K}x{N}xf32>) outs(%e1 : tensor<?x{K}x{N}xf32>) {{
    ^bb0(%in: f32, %out: f32):
      linalg.yield %in : f32
    }} -> tensor<?x{K}x{N}xf32>
    %z = arith.constant 0.0 : f32
    %e2 = tensor.empty(%b, %s) : tensor<?x?x{N}xf32>
    %acc = linalg.fill ins(%z : f32) outs(%e2 : tensor<?x?x{N}xf32>) -> tensor<?x?x{N}xf32>
    %y = linalg.batch_matmul ins(%x, %bc : tensor<?x?x{K}xf32>, tensor<?x{K}x{N}xf32>) outs(%acc : tensor<?x?x{N}xf32>) -> tensor<?x?x{N}xf32>
    return %y : tensor<?x?x{N}xf32>
  }}
  func.func @mm_{c}(%x: tensor<?x{K}xf32>) -> tensor<?x{N}xf32> {{
    %c0 = arith.constant 0 : index
    %m = tensor.dim %x, %c0 : tensor<?x{K}xf32>
    %w = util.global.load @w_mm_{c} : tensor<{K}x{N}xf32>
    %z = arith.constant 0.0 : f32
    %e = tensor.empty(%m) : tensor<?x{N}xf32>
    %acc = linalg.fill ins(%z : f32) outs(%e : tensor<?x{N}xf32>) -> tensor<?x{N}xf32>
    %y = linalg.matmul ins(%x, %w : tensor<?x{K}xf32>, tensor<{K}x{N}xf32>) outs(%acc : tensor<?x{N}xf32>) -> tensor<?x{N}xf32>
    return %y : tensor<?x{N}xf32>
  }}
  func.func @emb_{c}(%ids: tensor<?xi64>) -> tensor<?x{D}xf32> {{
    %c0 = arith.constant 0 : index
    %n = tensor.dim %ids, %c0 : tensor<?xi64>
    %table = util.global.load @w_emb_{c} : tensor<{V}x{D}xf32>
    %e = tensor.empty(%n) : tensor<?x{D}xf32>
    %r = linalg.generic {{indexing_maps = [affine_map<(d0, d1) -> (d0)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]}} ins(%ids : tensor<?xi64>) outs(%e : tensor<?x{D}xf32>) {{
    ^bb0(%in: i64, %out: f32):
      %row = arith.index_cast %in : i64 to index
      %col = linalg.index 1 : index
      %v = tensor.extract %table[%row, %col] : tensor<{V}x{D}xf32>
      linalg.yield %v : f32
    }} -> tensor<?x{D}xf32>
    return %r : tensor<?x{D}xf32>
  }}"""


MODEL = "module @codecs {" + "".join(_functions(_name(c)) for c in CODECS) + "\n}\n"

UNFUSED = f"""module @unfused {{
  util.global private @w = #flow.parameter.named<"g"::"w"> : tensor<{K}x{N}xf32>
  func.func @f(%x: tensor<4x{K}xf32>) -> tensor<4x{N}xf32> {{
    %w = util.global.load @w : tensor<{K}x{N}xf32>
    %wb = util.optimization_barrier %w : tensor<{K}x{N}xf32>
    %z = arith.constant 0.0 : f32
    %e = tensor.empty() : tensor<4x{N}xf32>
    %acc = linalg.fill ins(%z : f32) outs(%e : tensor<4x{N}xf32>) -> tensor<4x{N}xf32>
    %y = linalg.matmul ins(%x, %wb : tensor<4x{K}xf32>, tensor<{K}x{N}xf32>) outs(%acc : tensor<4x{N}xf32>) -> tensor<4x{N}xf32>
    return %y : tensor<4x{N}xf32>
  }}
}}
"""


class Encoded:
    """A graph imported, encoded and compiled, with its parameters and their numpy decodes."""

    def __init__(self, source: str, rules: list[tuple[str, str]]) -> None:
        imported = import_graph(
            source.encode(),
            input_type="auto",
            module_name="m",
            scope="g",
            min_parameter_bytes=1 << 40,
        )
        rng = np.random.default_rng(3)
        self.values = {
            p.key: (rng.standard_normal(p.shape) * 0.05).astype(np.float32)
            for p in imported.parameters
        }
        inputs = [
            ParameterInput(p.scope, p.key, p.dtype, p.shape, p.global_name)
            for p in imported.parameters
        ]
        policy = CodecPolicy(rules=tuple(CodecRule(*r) for r in rules))
        self.graph = encode_graph(
            imported.module_bytecode, inputs, lambda p: self.values[p.key], policy
        )
        self.records = {r.key: r for r in self.graph.records}
        self.parts = {
            (r.scope, part["key"]): f"{r.scope}::{r.key}"
            for r in self.graph.records
            if r.codec != "fp32"
            for part in r.parts
        }
        self.sizes = {f"{r.scope}::{r.key}": int(np.prod(r.shape)) for r in self.graph.records}

    def decoded(self, key: str) -> np.ndarray:
        """The weight as the IR decodes it, from the stored bytes, in numpy."""
        r = self.records[key]
        layout = choose_layout(
            r.codec, tuple(r.shape), r.dtype, tuple(r.reduce_axes), tuple(r.order)
        )
        stored = {(s.scope, s.key): s.data for s in self.graph.stored}
        return decode([stored[(r.scope, p["key"])] for p in r.parts], layout)

    def check(self, data_tiling: bool = False) -> tuple[list, str]:
        text: list[str] = []
        device = _device(data_tiling)
        found = check_encoded_module(
            self.graph.module_bytecode,
            target_flags([device]),
            self.parts,
            self.sizes,
            devices=[device],  # the codec's choices as the compile step makes them
            text=text,
        )
        return found, text[0]

    def session(self, data_tiling: bool = False, device: TargetDevice | None = None):
        """Call the encoded module's functions on local-task, compiled for `device` (default:
        the host CPU, with or without data tiling)."""
        import iree.runtime as rt

        target = device if device is not None else _device(data_tiling)
        vmfb = compile_imported(self.graph.module_bytecode, phase="input", devices=[target]).vmfb
        index = rt.ParameterIndex()
        for s in self.graph.stored:
            index.add_buffer(s.key, s.data.tobytes())
        instance, device = rt.VmInstance(), rt.get_device("local-task")
        module = rt.VmModule.copy_buffer(instance, vmfb)
        context = rt.VmContext(
            instance,
            [
                rt.create_hal_module(instance, device),
                rt.create_io_parameters_module(instance, index.create_provider(scope="g")),
                module,
            ],
        )
        return lambda name, *args: rt.FunctionInvoker(
            context, device, module.lookup_function(name)
        )(*args).to_host()


@pytest.fixture(scope="module")
def encoded() -> Encoded:
    rules = [(f"{kind}_{_name(c)}", c) for c in CODECS for kind in ("lin", "mm", "emb")]
    return Encoded(MODEL, rules)


@pytest.fixture(scope="module", params=DATA_TILING, ids=["plain", "data_tiling"])
def call(encoded, request):
    return encoded.session(data_tiling=request.param)


@pytest.fixture(scope="module", params=DATA_TILING, ids=["plain", "data_tiling"])
def dispatch_creation(encoded, request) -> tuple[list, str]:
    return encoded.check(data_tiling=request.param)


def test_each_parameter_got_its_codec_and_consumer(encoded):
    for c in CODECS:
        c_ = _name(c)
        lin, mm, emb = (encoded.records[f"{k}_{c_}"] for k in ("lin", "mm", "emb"))
        assert {lin.codec, mm.codec, emb.codec} == {"q4:g32" if c == "q4" else c}
        assert lin.uses == ["contraction linalg.batch_matmul"] and lin.reduce_axes == [1]
        assert mm.uses == ["contraction linalg.matmul"] and mm.reduce_axes == [0]
        assert emb.uses == ["gather tensor.extract"] and emb.reduce_axes == [1]
        # data is stored in the order the consumer reads it: K-major for a contraction (a
        # torch Linear's [N, K] transposed), rows kept contiguous for a gathered table
        assert (lin.order, mm.order, emb.order) == ([1, 0], [0, 1], [0, 1])
    assert encoded.graph.warnings == []


@pytest.mark.parametrize("codec", CODECS)
def test_compiled_decode_matches_the_numpy_decode(encoded, call, codec):
    c, rng = _name(codec), np.random.default_rng(11)
    x3 = rng.standard_normal((2, 3, K)).astype(np.float32)
    np.testing.assert_allclose(
        call(f"lin_{c}", x3), x3 @ encoded.decoded(f"lin_{c}").T, rtol=1e-5, atol=1e-5
    )
    x2 = rng.standard_normal((5, K)).astype(np.float32)
    np.testing.assert_allclose(
        call(f"mm_{c}", x2), x2 @ encoded.decoded(f"mm_{c}"), rtol=1e-5, atol=1e-5
    )
    ids = np.array([7, 199, 0, 7, 123], dtype=np.int64)
    # exact but for q4's q * scale + offset, which LLVM may fuse into one multiply-add
    np.testing.assert_allclose(
        call(f"emb_{c}", ids), encoded.decoded(f"emb_{c}")[ids], rtol=1e-6, atol=1e-7
    )
    # and the codec's own error against the original weight stays small
    w = encoded.values[f"mm_{c}"]
    error = np.linalg.norm(encoded.decoded(f"mm_{c}") - w) / np.linalg.norm(w)
    assert error < {"fp16": 1e-3, "bf16": 5e-3, "int8": 2e-2}.get(codec, 0.15)


def test_no_dispatch_materializes_a_decoded_weight(encoded, dispatch_creation):
    """Without data tiling nothing decoded exists; with it, each matmul weight is decoded
    once, in an initializer, into the packed layout (and nothing per call or for a gather)."""
    found, _ = dispatch_creation
    if "mmt4d" not in dispatch_creation[1]:
        assert found == []
        return
    assert all(m.at_load and "initializer" in m.function for m in found), found
    contractions = {f"g::{k}_{_name(c)}" for c in CODECS for k in ("lin", "mm")}
    assert {p for m in found for p in m.parameters} == contractions
    assert all(m.message().startswith("parameter g::") for m in found)
    assert "decoded once at load into data tiling's packed layout" in found[0].message()


def test_with_data_tiling_each_call_runs_the_packed_kernel_on_the_decoded_weight(encoded):
    """The data-tiled variant's functions read the packed weights (globals set at load) with
    IREE's mmt4d and decode nothing; the initializers read the stored (encoded) parts."""
    _, text = encoded.check(data_tiling=True)
    for c in CODECS:
        for kind in ("lin", "mm"):
            body = _function(text, f"{kind}_{_name(c)}")
            body = body[: body.index("\n  }\n")]  # the function alone, not what follows it
            assert "mmt4d" in body and "util.global.load immutable @__hoisted" in body
            assert "arith.sitofp" not in body  # (fp16 may stay f16 packed, extended in mmt4d)
            assert "#flow.parameter.named" not in body  # no stored part read per call
    initializers = "".join(re.findall(r"util\.initializer .*?\n  }\n", text, re.S))
    for c in ("int8", "q4"):
        stored = encoded.records[f"mm_{_name(c)}"]
        assert f'"g"::"{stored.parts[0]["key"]}"' in initializers
    # the stored parts are the encoded bytes: no float32 copy of a matmul weight in the module
    assert not re.search(r'"g"::"(lin|mm)_[a-z0-9_]+"> : tensor<\d+x\d+xf32>', text)


def test_a_compile_that_skips_the_choice_of_forms_gets_the_fused_one(encoded):
    """The two forms meet in a select on a constant `false`: IREE alone folds it to the
    fused form (no decode at load, one dispatch per linear)."""
    from myelin.compiler.session import CompilerSession

    with CompilerSession(target_flags([_device(False)])) as session:
        module = session.parse(encoded.graph.module_bytecode, what="graph")
        assert "plex.load_time_decode" in str(module)
        ir_bytes, _ = session.compile(
            module, compile_from="input", compile_to="dispatch-creation", what="graph"
        )
        text = str(session.parse(ir_bytes, what="graph at dispatch-creation"))
    assert "util.initializer" not in text
    body = _function(text, "lin_int8")
    assert body.count("flow.dispatch.workgroups") == 1


def test_each_decode_sits_in_its_consumers_dispatch(encoded):
    _, text = encoded.check(data_tiling=False)
    for c in CODECS:
        body = _function(text, f"lin_{_name(c)}")
        assert body.count("flow.dispatch.workgroups") == 1  # decode + batch_matmul, together
        assert "linalg.batch_matmul" in body and ("arith.extf" in body or "itofp" in body)


def test_quantized_gather_reads_only_selected_rows(dispatch_creation):
    _, text = dispatch_creation
    for c in ("int8", "q4", "q4:g16"):
        body = _function(text, f"emb_{_name(c)}")
        # no decoded table, whole or transposed, exists anywhere
        assert f"tensor<{V}x{D}xf32>" not in body and f"tensor<{D}x{V}xf32>" not in body
        # the gather's dispatch reads the stored integers and extracts single elements of them
        # (q4's table is read as bytes, [rows, group, element / 2] of i8: a scalar i4 extract
        # does not compile for CUDA)
        group = {"int8": None, "q4": 32, "q4:g16": 16}[c]
        stored = f"{V}x{D}xi8" if group is None else f"{V}x{D // group}x{group // 2}xi8"
        assert re.search(rf"tensor<{stored}>", body)
        assert re.search(rf"tensor\.extract %\w+\[[^\]]+\] : tensor<{stored}>", body)
    assert f"tensor<{V}x{D}xf32>" not in text


def test_unfused_decode_is_reported_with_the_parameter_name():
    unfused = Encoded(UNFUSED, [("w", "int8")])
    found, _ = unfused.check()
    assert [m.parameters for m in found] == [("g::w",)]
    message = found[0].message()
    assert message.startswith("parameter g::w: its decode is not fused into the consumer")
    assert f"tensor<{K}x{N}xf32>" in message
    assert unfused.records["w"].uses == ["other util.optimization_barrier"]


def _function(text: str, name: str) -> str:
    """The body of util.func @name in dispatch-creation IR."""
    start = text.index(f"util.func public @{name}(")
    end = text.find("util.func public @", start + 1)
    return text[start : end if end > 0 else len(text)]


# A contraction longer than q4's chunk (_chunked.CHUNK_K = 256): decoded and contracted in chunks
# of the axis, one dispatch each, and summed.
LONG_K, LONG_N = 320, 96
WIDE_N = 384  # stored in blocks of 128 outputs: each chunk contracts over the blocks
LONG = f"""module @long {{
  util.global private @w = #flow.parameter.named<"g"::"long"> : tensor<{LONG_N}x{LONG_K}xf32>
  func.func @long(%x: tensor<?x{LONG_K}xf32>) -> tensor<?x{LONG_N}xf32> {{
    %c0 = arith.constant 0 : index
    %m = tensor.dim %x, %c0 : tensor<?x{LONG_K}xf32>
    %w = util.global.load @w : tensor<{LONG_N}x{LONG_K}xf32>
    %et = tensor.empty() : tensor<{LONG_K}x{LONG_N}xf32>
    %wt = linalg.transpose ins(%w : tensor<{LONG_N}x{LONG_K}xf32>) outs(%et : tensor<{LONG_K}x{LONG_N}xf32>) permutation = [1, 0]
    %z = arith.constant 0.0 : f32
    %e = tensor.empty(%m) : tensor<?x{LONG_N}xf32>
    %acc = linalg.fill ins(%z : f32) outs(%e : tensor<?x{LONG_N}xf32>) -> tensor<?x{LONG_N}xf32>
    %y = linalg.matmul ins(%x, %wt : tensor<?x{LONG_K}xf32>, tensor<{LONG_K}x{LONG_N}xf32>) outs(%acc : tensor<?x{LONG_N}xf32>) -> tensor<?x{LONG_N}xf32>
    return %y : tensor<?x{LONG_N}xf32>
  }}
  util.global private @v = #flow.parameter.named<"g"::"wide"> : tensor<{WIDE_N}x{LONG_K}xf32>
  func.func @wide(%x: tensor<3x{LONG_K}xf32>) -> tensor<3x{WIDE_N}xf32> {{
    %v = util.global.load @v : tensor<{WIDE_N}x{LONG_K}xf32>
    %et = tensor.empty() : tensor<{LONG_K}x{WIDE_N}xf32>
    %vt = linalg.transpose ins(%v : tensor<{WIDE_N}x{LONG_K}xf32>) outs(%et : tensor<{LONG_K}x{WIDE_N}xf32>) permutation = [1, 0]
    %z = arith.constant 0.0 : f32
    %e = tensor.empty() : tensor<3x{WIDE_N}xf32>
    %acc = linalg.fill ins(%z : f32) outs(%e : tensor<3x{WIDE_N}xf32>) -> tensor<3x{WIDE_N}xf32>
    %y = linalg.matmul ins(%x, %vt : tensor<3x{LONG_K}xf32>, tensor<{LONG_K}x{WIDE_N}xf32>) outs(%acc : tensor<3x{WIDE_N}xf32>) -> tensor<3x{WIDE_N}xf32>
    return %y : tensor<3x{WIDE_N}xf32>
  }}
}}
"""


@pytest.fixture(scope="module")
def long_q4() -> Encoded:
    return Encoded(LONG, [("long", "q4"), ("wide", "q4")])


@pytest.mark.parametrize("data_tiling", DATA_TILING, ids=["plain", "data_tiling"])
def test_a_long_q4_contraction_runs_in_chunks(long_q4, data_tiling):
    """In chunks without data tiling; with it, decoded whole at load (one packed kernel)."""
    found, text = long_q4.check(data_tiling=data_tiling)
    body = _function(text, "long")
    wide = _function(text, "wide")
    if data_tiling:
        at_load = sorted((m.parameters, m.at_load) for m in found)
        assert at_load == [(("g::long",), True), (("g::wide",), True)]
        assert body.count("mmt4d") == 1 and "linalg.matmul" not in body
        assert wide.count("mmt4d") == 1
    else:
        assert found == []
        assert body.count("linalg.matmul") == 2  # 256 + 64 of the 320 contracted elements
        assert body.count("tensor.collapse_shape") == 2  # each decodes over (group, element)
        # the blocked weight: each chunk (two dispatches, then their sum) contracted over its
        # blocks of 128 outputs, [3, 3 blocks, 128], the result reshaped after
        assert "linalg.matmul" not in wide and wide.count("flow.dispatch.workgroups") == 3
        assert "-> tensor<3x3x128xf32> =" in wide
    x = np.random.default_rng(4).standard_normal((3, LONG_K)).astype(np.float32)
    call = long_q4.session(data_tiling=data_tiling)
    np.testing.assert_allclose(call("long", x), x @ long_q4.decoded("long").T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(call("wide", x), x @ long_q4.decoded("wide").T, rtol=1e-5, atol=1e-5)


# More chunks than one sum may read (_chunked.SUM_FAN_IN): 40 chunks of 256, summed as 16 + 16 + 8.
MANY_K = 40 * 256
MANY = LONG.split("  util.global private @v")[0].replace(str(LONG_K), str(MANY_K)) + "}\n"


def test_many_q4_chunks_are_summed_in_dispatches_cuda_can_load(tmp_path):
    """IREE 3.13's CUDA HAL refuses an executable of more than 64 push constants, and a sum
    reads each chunk at an offset (two constants each): a 7B model's 43 chunks in one sum failed
    to load on an H100. Each sum reads at most 16; the result is still the whole contraction."""
    graph = Encoded(MANY, [("long", "q4")])
    dump = tmp_path / "executables"
    compile_imported(
        graph.graph.module_bytecode,
        phase="input",
        devices=[TargetDevice("gpu", target="cuda")],
        extra_flags=(f"--iree-hal-dump-executable-sources-to={dump}",),
    )
    constants = [
        int(n) for f in dump.glob("*.mlir") for n in re.findall(r"constants = (\d+)", f.read_text())
    ]
    assert constants and max(constants) <= 64, max(constants)
    x = np.random.default_rng(5).standard_normal((2, MANY_K)).astype(np.float32)
    np.testing.assert_allclose(
        graph.session()("long", x), x @ graph.decoded("long").T, rtol=1e-4, atol=1e-4
    )


def test_a_compile_failure_reads_in_a_few_lines_and_logs_the_rest(long_q4, tmp_path, monkeypatch):
    """IREE's own diagnostics run to hundreds of lines (each failing dispatch repeats the CPU
    feature string and its IR); the error names the graph, the op, where it came from and the
    dispatch, and points to a log holding all of it."""
    from myelin.compiler.session import Diagnostics
    from myelin.errors import CompileError

    monkeypatch.setattr(Diagnostics, "log_dir", tmp_path / "logs")
    # a stack limit no decode tile fits in: IREE's CPU backend refuses the dispatches
    with pytest.raises(CompileError) as failed:
        compile_imported(
            long_q4.graph.module_bytecode,
            phase="input",
            devices=[_device(False)],
            extra_flags=("--iree-llvmcpu-stack-allocation-limit=1024",),
            what="graph g:long (cpu)",
        )
    message = str(failed.value)
    lines = message.splitlines()
    assert len(lines) <= 4, message
    assert lines[0].startswith("compiling graph g:long (cpu) failed: 'func.func' op exceeded")
    assert re.match(r"  at source\.mlir:\d+:\d+, in dispatch long_dispatch_\d+", lines[1])
    log = Path(re.search(r"full IREE diagnostics: (\S+)", message).group(1))
    assert log.parent == tmp_path / "logs"
    full = log.read_text()
    assert full.count("error: ") >= 2 and "see current operation" in full
    assert "cpu_features" in full and "cpu_features" not in message


def test_every_codec_compiles_for_cuda(encoded, long_q4):
    """Compile only (no GPU here): every codec's contraction, gather and q4's chunks for
    `cuda` (sm_80). q4's gather reads its bytes as i8: a scalar i4 extract does not compile
    for CUDA in IREE 3.13."""
    for graph in (encoded, long_q4):
        compiled = compile_imported(
            graph.graph.module_bytecode,
            phase="input",
            devices=[TargetDevice("gpu", target="cuda")],
        )
        assert len(compiled.vmfb) > 0
