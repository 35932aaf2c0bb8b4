"""One q4 matvec at a time on CPU: the codecs' forms (fp32, int8, q4's grouped float matvec
`q4-grouped`, q4's AVX2 kernel `q4`) against a q4 x Q8 integer form written by hand in linalg
(`q4xQ8`, not a codec), side by side in one run.

    python benchmarks/probes/q4_q8_matvec.py [--shapes 512x32000,1408x512,512x1408,512x512]
                                      [--rounds 7] [--calls 20] [--dump DIR]

The Q8 form is llama.cpp's Q4_0 x Q8_0 idea in linalg: the activation row is quantized once per
group of 32 (`xq = round(x * 127 / max|x|)`, i16 values in [-127, 127]); the 4-bit codes are
multiplied with it in 16-bit integers, 16 elements at a time (|sum| <= 16 * 127 * 15 = 30480
fits in i16), so LLVM emits `vpmullw` + `vpaddw` on 16 outputs per instruction; the fold
multiplies each partial sum by the group's scale times `max|x| / 127` and adds the group's
offset times the exact float sum of `x` (the offset term needs no quantization), once per
(group, half, output). The codecs' grouped q4 form converts every code to float and takes an
FMA per weight (docs/codecs.md, "Matrix-vector products"); on an AVX2 CPU the codec runs the C
kernel instead (myelin.codecs._cpu_kernels: the same Q8 idea with `vpmaddubsw` or `vpdpbusd`), and
`q4-grouped` is that build with the kernel turned off.

Weights are random codes and factors (the same bytes for the q4 and Q8 forms); every form is
checked against numpy: the codecs' float forms against the float decode (rtol 1e-5), the kernel's
and Q8's against the same decode with float activations (their cosine is printed: the
activation quantization's error).
Timing: min of `--calls` calls per round, median over rounds, the forms interleaved per round.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

GROUP = 32
HALF = 16  # elements summed in i16 before the fold
# the fold's tiles: IREE's compilation_info, as the codecs' matvec tiles (myelin.codecs._matvec)
TILES = (
    "attrs = {compilation_info = #iree_codegen.compilation_info<lowering_config = "
    "#iree_cpu.lowering_config<distribution = [0, 64, 0, 0], vector_common_parallel = "
    "[1, 32, 0, 0], vector_reduction = [0, 0, 1, 1]>, translation_info = "
    "#iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<DoubleTilingExpert>>>}"
)


def q8_source(k: int, n: int) -> str:
    """The Q8 matvec `f(x: 1xK) -> 1xN` over parameters q (codes), s (u8 group scales),
    o (i8 group offsets), rs and ro (f32 per output): w = q * s * rs + o * ro."""
    g, h, e = k // GROUP, GROUP // HALF, HALF
    return f"""module @q8 {{
  util.global private @q = #flow.parameter.named<"g"::"q"> : tensor<{g}x{h}x{e}x{n}xi4>
  util.global private @s = #flow.parameter.named<"g"::"s"> : tensor<{g}x{n}xi8>
  util.global private @o = #flow.parameter.named<"g"::"o"> : tensor<{g}x{n}xi8>
  util.global private @rs = #flow.parameter.named<"g"::"rs"> : tensor<{n}xf32>
  util.global private @ro = #flow.parameter.named<"g"::"ro"> : tensor<{n}xf32>
  func.func @f(%x: tensor<1x{k}xf32>) -> tensor<1x{n}xf32> {{
    %q = util.global.load @q : tensor<{g}x{h}x{e}x{n}xi4>
    %s = util.global.load @s : tensor<{g}x{n}xi8>
    %o = util.global.load @o : tensor<{g}x{n}xi8>
    %rs = util.global.load @rs : tensor<{n}xf32>
    %ro = util.global.load @ro : tensor<{n}xf32>
    %zero = arith.constant 0.0 : f32
    %xg = tensor.expand_shape %x [[0], [1, 2]] output_shape [1, {g}, {GROUP}]
        : tensor<1x{k}xf32> into tensor<1x{g}x{GROUP}xf32>
    %ge = tensor.empty() : tensor<{g}xf32>
    %g0 = linalg.fill ins(%zero : f32) outs(%ge : tensor<{g}xf32>) -> tensor<{g}xf32>
    %amax = linalg.generic {{indexing_maps = [affine_map<(g, e) -> (0, g, e)>,
        affine_map<(g, e) -> (g)>], iterator_types = ["parallel", "reduction"]}}
        ins(%xg : tensor<1x{g}x{GROUP}xf32>) outs(%g0 : tensor<{g}xf32>) {{
    ^bb0(%a: f32, %acc: f32):
      %ab = math.absf %a : f32
      %m = arith.maximumf %acc, %ab : f32
      linalg.yield %m : f32
    }} -> tensor<{g}xf32>
    %xs = linalg.generic {{indexing_maps = [affine_map<(g, e) -> (0, g, e)>,
        affine_map<(g, e) -> (g)>], iterator_types = ["parallel", "reduction"]}}
        ins(%xg : tensor<1x{g}x{GROUP}xf32>) outs(%g0 : tensor<{g}xf32>) {{
    ^bb0(%a: f32, %acc: f32):
      %m = arith.addf %acc, %a : f32
      linalg.yield %m : f32
    }} -> tensor<{g}xf32>
    %qe = tensor.empty() : tensor<{g}x{GROUP}xi16>
    %xq = linalg.generic {{indexing_maps = [affine_map<(g, e) -> (0, g, e)>,
        affine_map<(g, e) -> (g)>, affine_map<(g, e) -> (g, e)>],
        iterator_types = ["parallel", "parallel"]}}
        ins(%xg, %amax : tensor<1x{g}x{GROUP}xf32>, tensor<{g}xf32>)
        outs(%qe : tensor<{g}x{GROUP}xi16>) {{
    ^bb0(%a: f32, %mx: f32, %out: i16):
      %c127 = arith.constant 127.0 : f32
      %cz = arith.constant 0.0 : f32
      %inv0 = arith.divf %c127, %mx : f32
      %isz = arith.cmpf oeq, %mx, %cz : f32
      %inv = arith.select %isz, %cz, %inv0 : f32
      %v = arith.mulf %a, %inv : f32
      %r = math.roundeven %v : f32
      %i = arith.fptosi %r : f32 to i16
      linalg.yield %i : i16
    }} -> tensor<{g}x{GROUP}xi16>
    %xq3 = tensor.expand_shape %xq [[0], [1, 2]] output_shape [{g}, {h}, {e}]
        : tensor<{g}x{GROUP}xi16> into tensor<{g}x{h}x{e}xi16>
    %y0 = flow.dispatch.region -> (tensor<1x{n}xf32>) {{
      %z16 = arith.constant 0 : i16
      %pe = tensor.empty() : tensor<{g}x{h}x{n}xi16>
      %pi = linalg.fill ins(%z16 : i16) outs(%pe : tensor<{g}x{h}x{n}xi16>)
          -> tensor<{g}x{h}x{n}xi16>
      %p = linalg.generic {{indexing_maps = [affine_map<(g, h, n, e) -> (g, h, e)>,
          affine_map<(g, h, n, e) -> (g, h, e, n)>, affine_map<(g, h, n, e) -> (g, h, n)>],
          iterator_types = ["parallel", "parallel", "parallel", "reduction"]}}
          ins(%xq3, %q : tensor<{g}x{h}x{e}xi16>, tensor<{g}x{h}x{e}x{n}xi4>)
          outs(%pi : tensor<{g}x{h}x{n}xi16>) {{
      ^bb0(%a: i16, %b: i4, %acc: i16):
        %bi = arith.extui %b : i4 to i16
        %m = arith.muli %a, %bi : i16
        %t = arith.addi %acc, %m : i16
        linalg.yield %t : i16
      }} -> tensor<{g}x{h}x{n}xi16>
      %z = arith.constant 0.0 : f32
      %ye = tensor.empty() : tensor<1x{n}xf32>
      %yi = linalg.fill ins(%z : f32) outs(%ye : tensor<1x{n}xf32>) -> tensor<1x{n}xf32>
      %y = linalg.generic {{indexing_maps = [affine_map<(m, n, g, h) -> (g, h, n)>,
          affine_map<(m, n, g, h) -> (g)>, affine_map<(m, n, g, h) -> (g)>,
          affine_map<(m, n, g, h) -> (g, n)>, affine_map<(m, n, g, h) -> (g, n)>,
          affine_map<(m, n, g, h) -> (n)>, affine_map<(m, n, g, h) -> (n)>,
          affine_map<(m, n, g, h) -> (m, n)>],
          iterator_types = ["parallel", "parallel", "reduction", "reduction"]}}
          ins(%p, %amax, %xs, %s, %o, %rs, %ro : tensor<{g}x{h}x{n}xi16>, tensor<{g}xf32>,
              tensor<{g}xf32>, tensor<{g}x{n}xi8>, tensor<{g}x{n}xi8>, tensor<{n}xf32>,
              tensor<{n}xf32>)
          outs(%yi : tensor<1x{n}xf32>) {TILES} {{
      ^bb0(%ph: i16, %mx: f32, %xsum: f32, %sc: i8, %of: i8, %rsc: f32, %rof: f32, %acc: f32):
        %pw = arith.extsi %ph : i16 to i32
        %pf = arith.sitofp %pw : i32 to f32
        %inv127 = arith.constant {1 / 127} : f32
        %d = arith.mulf %mx, %inv127 : f32
        %pd = arith.mulf %pf, %d : f32
        %si = arith.extui %sc : i8 to i32
        %sf = arith.uitofp %si : i32 to f32
        %ss = arith.mulf %sf, %rsc : f32
        %oi = arith.extsi %of : i8 to i32
        %ofl = arith.sitofp %oi : i32 to f32
        %per_half = arith.constant {1 / h} : f32
        %ofh = arith.mulf %ofl, %per_half : f32
        %oo = arith.mulf %ofh, %rof : f32
        %t1 = arith.mulf %pd, %ss : f32
        %t2 = arith.mulf %xsum, %oo : f32
        %t3 = arith.addf %t1, %t2 : f32
        %t4 = arith.addf %acc, %t3 : f32
        linalg.yield %t4 : f32
      }} -> tensor<1x{n}xf32>
      flow.return %y : tensor<1x{n}xf32>
    }}
    return %y0 : tensor<1x{n}xf32>
  }}
}}"""


def fp32_source(k: int, n: int) -> str:
    """A torch-style linear matvec (weight [N, K], transposed on the way) for the codecs."""
    return f"""module @mv {{
  util.global private @w = #flow.parameter.named<"g"::"w"> : tensor<{n}x{k}xf32>
  func.func @f(%x: tensor<1x{k}xf32>) -> tensor<1x{n}xf32> {{
    %w = util.global.load @w : tensor<{n}x{k}xf32>
    %e0 = tensor.empty() : tensor<{k}x{n}xf32>
    %t = linalg.transpose ins(%w : tensor<{n}x{k}xf32>) outs(%e0 : tensor<{k}x{n}xf32>)
        permutation = [1, 0]
    %z = arith.constant 0.0 : f32
    %e = tensor.empty() : tensor<1x{n}xf32>
    %acc = linalg.fill ins(%z : f32) outs(%e : tensor<1x{n}xf32>) -> tensor<1x{n}xf32>
    %y = linalg.matmul ins(%x, %t : tensor<1x{k}xf32>, tensor<{k}x{n}xf32>)
        outs(%acc : tensor<1x{n}xf32>) -> tensor<1x{n}xf32>
    return %y : tensor<1x{n}xf32>
  }}
}}"""


def _invoker(vmfb: bytes, parameters: dict[str, bytes]):
    import iree.runtime as rt

    index = rt.ParameterIndex()
    for key, data in parameters.items():
        index.add_buffer(key, data)
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
    call = rt.FunctionInvoker(context, device, module.lookup_function("f"))
    return lambda x: call(x).to_host()


def codec_form(k: int, n: int, codec: str, w: np.ndarray, kernel: bool = True):
    """(call, the weight as its stored bytes decode) for `codec` through the real encode step;
    `kernel=False` compiles q4 without its AVX2 kernel (the grouped matvec)."""
    from myelin.codecs import (
        CodecPolicy,
        CodecRule,
        ParameterInput,
        choose_layout,
        decode,
        encode_graph,
    )
    from myelin.compiler.pipeline import compile_imported, import_graph
    from myelin.compiler.targets import TargetDevice

    imported = import_graph(
        fp32_source(k, n).encode(),
        input_type="auto",
        module_name="m",
        scope="g",
        min_parameter_bytes=1 << 40,
    )
    if codec == "fp32":
        vmfb = compile_imported(
            imported.module_bytecode, phase="input", devices=[TargetDevice("cpu")]
        ).vmfb
        return _invoker(vmfb, {"w": w.tobytes()}), w
    inputs = [
        ParameterInput(p.scope, p.key, p.dtype, p.shape, p.global_name) for p in imported.parameters
    ]
    graph = encode_graph(
        imported.module_bytecode, inputs, lambda p: w, CodecPolicy(rules=(CodecRule("w", codec),))
    )
    from unittest import mock

    from myelin.codecs import _finalize

    select = _finalize.select_cpu_kernels if kernel else (lambda devices: {})
    with mock.patch.object(_finalize, "select_cpu_kernels", select):
        vmfb = compile_imported(
            graph.module_bytecode, phase="input", devices=[TargetDevice("cpu")]
        ).vmfb
    record = graph.records[0]
    layout = choose_layout(
        record.codec,
        tuple(record.shape),
        record.dtype,
        tuple(record.reduce_axes),
        tuple(record.order),
    )
    stored = {s.key: s.data for s in graph.stored}
    decoded = decode([stored[p["key"]] for p in record.parts], layout)
    return _invoker(vmfb, {s.key: s.data.tobytes() for s in graph.stored}), decoded


def q8_form(k: int, n: int, rng: np.random.Generator, dump: Path | None):
    """(call, its weight as float [N, K]) for the hand-written Q8 form."""
    from iree.compiler import compile_str

    g = k // GROUP
    q = rng.integers(0, 16, (k, n), dtype=np.uint8)
    s = rng.integers(1, 256, (g, n), dtype=np.uint8)
    o = rng.integers(-128, 128, (g, n), dtype=np.int8)
    rs = (rng.random(n) * 2e-4).astype(np.float32)
    ro = (rng.random(n) * 2e-3).astype(np.float32)
    flags = [
        "--iree-hal-target-device=local",
        "--iree-hal-local-target-device-backends=llvm-cpu",
        "--iree-llvmcpu-target-cpu=host",
    ]
    if dump is not None:
        flags.append(f"--iree-hal-dump-executable-files-to={dump / f'q8_{k}x{n}'}")
    vmfb = compile_str(q8_source(k, n), extra_args=flags)
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)  # even element: low nibble
    parameters = {
        "q": packed.tobytes(),
        "s": s.tobytes(),
        "o": o.tobytes(),
        "rs": rs.tobytes(),
        "ro": ro.tobytes(),
    }
    w = q.astype(np.float32) * np.repeat(s.astype(np.float32) * rs, GROUP, 0)
    w += np.repeat(o.astype(np.float32) * ro, GROUP, 0)
    return _invoker(vmfb, parameters), w.T


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float((a * b).sum() / np.linalg.norm(a) / np.linalg.norm(b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shapes",
        default="512x32000,1408x512,512x1408,512x512",
        help="K x N of each weight (K a multiple of 32)",
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--dump", type=Path, help="write the Q8 form's executables (x86) here")
    args = parser.parse_args()
    forms = ("fp32", "int8", "q4-grouped", "q4", "q4xQ8")
    print(
        f"{platform.processor() or '?'}, {os.cpu_count()} CPUs, local-task; min of "
        f"{args.calls} calls, median of {args.rounds} rounds; load {os.getloadavg()[0]:.1f}"
    )
    print(f"{'K -> N':>14} " + " ".join(f"{f:>18}" for f in forms) + "  q4 / Q8 cosine")
    for shape in args.shapes.split(","):
        k, n = map(int, shape.split("x"))
        rng = np.random.default_rng(k * n)
        w = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
        calls, weights = {}, {}
        for form in ("fp32", "int8", "q4"):
            calls[form], weights[form] = codec_form(k, n, form, w)
        calls["q4-grouped"], weights["q4-grouped"] = codec_form(k, n, "q4", w, kernel=False)
        calls["q4xQ8"], weights["q4xQ8"] = q8_form(k, n, rng, args.dump)
        x = rng.standard_normal((1, k)).astype(np.float32)
        cosines = {}
        for form, call in calls.items():
            y, want = call(x), x @ weights[form].T
            if form in ("q4", "q4xQ8"):  # the activation is quantized: compared by cosine
                cosines[form] = cosine(y, want)
                assert cosines[form] > 0.999, (shape, form, cosines[form])
            else:
                np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
        times: dict[str, list[float]] = {f: [] for f in forms}
        for _ in range(args.rounds):
            for form in forms:
                best = float("inf")
                for _ in range(args.calls):
                    start = time.perf_counter()
                    calls[form](x)
                    best = min(best, time.perf_counter() - start)
                times[form].append(best)
        cells = []
        for form in forms:
            ms = [t * 1e3 for t in times[form]]
            cells.append(f"{statistics.median(ms):7.3f} ({min(ms):.2f}-{max(ms):.2f})")
        q8 = f"{cosines['q4']:.6f} / {cosines['q4xQ8']:.6f}"
        print(f"{k:>6} -> {n:<5} " + " ".join(f"{c:>18}" for c in cells) + f"  {q8}")
    print(f"load at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
