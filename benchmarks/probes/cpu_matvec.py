"""One encoded matvec at a time on CPU, each codec width with its C kernel
(myelin.codecs._cpu_kernels) against IREE's own code for the same encoded matvec (the kernel
turned off), interleaved in one process: GB/s of weight reads.

    python benchmarks/probes/cpu_matvec.py [--shapes 2048x2048,256x2048,...] [--codecs ...]
                                           [--threads 1] [--rounds 7] [--calls 20]

Shapes are a torch Linear's `out x in` (the TinyLlama-1.1B decode step's by default: q/o, k/v,
gate/up, down, lm_head). The weight is random normal(0, 0.02), encoded by the real encode step;
each form is checked against numpy before timing (IREE's against the float decode, rtol 1e-5;
the q4 and int8 kernels quantize the activation to 8 bits: checked by cosine > 0.999).
q4's "before" is its AVX2 kernel (what ran on this CPU before the AVX-512 one), the other
widths' is IREE's code. Timing: min of `--calls` calls per round, median and range over
`--rounds` rounds, the forms interleaved per round; GB/s = the encoded weight's stored bytes /
time. IREE's task topology is process-wide: `--threads` workers for the whole run (the decode
benchmark's 1 by default).

The same weight called again and again is read from the cache when it fits (L3: 32 MiB on the
Zen 5 VM). `--cold MB` times a decode step's case instead, every weight read from memory: each
form gets copies of the weight (its own parameter buffers, one context each) totalling at least
MB, and one call is the mean over a pass through all of them (`--calls` passes a round, min).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import time
from unittest import mock

import numpy as np

SHAPES = "2048x2048,256x2048,5632x2048,2048x5632,32000x2048"


def linear_source(k: int, n: int) -> str:
    """A torch-style linear matvec (weight [N, K], transposed on the way)."""
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


def encoded(k: int, n: int, codec: str, w: np.ndarray):
    """(the encoded graph, its stored parts by key, the weight as its stored bytes decode)."""
    from myelin.codecs import (
        CodecPolicy,
        CodecRule,
        ParameterInput,
        choose_layout,
        decode,
        encode_graph,
    )
    from myelin.compiler.pipeline import import_graph

    imported = import_graph(
        linear_source(k, n).encode(),
        input_type="auto",
        module_name="m",
        scope="g",
        min_parameter_bytes=1 << 40,
    )
    inputs = [
        ParameterInput(p.scope, p.key, p.dtype, p.shape, p.global_name) for p in imported.parameters
    ]
    policy = CodecPolicy(rules=(CodecRule("w", codec),))
    graph = encode_graph(imported.module_bytecode, inputs, lambda p: w, policy)
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
    return graph, stored, decoded


def compiled(graph, stored: dict, kernels: dict, copies: int = 1):
    """The matvec's call, compiled for the host CPU with these kernels (form -> Kernel; none:
    IREE's code); with `copies` > 1, a call that cycles through that many copies of the
    weight (each its own buffers and context)."""
    from myelin.codecs import _finalize
    from myelin.compiler.pipeline import compile_imported
    from myelin.compiler.targets import TargetDevice

    def select(devices):
        return kernels

    with mock.patch.object(_finalize, "select_cpu_kernels", select):
        vmfb = compile_imported(
            graph.module_bytecode, phase="input", devices=[TargetDevice("cpu")]
        ).vmfb
    calls = [
        _invoker(vmfb, {key: data.tobytes() for key, data in stored.items()}) for _ in range(copies)
    ]
    if copies == 1:
        return calls[0]
    at = [0]

    def call(x):
        at[0] = (at[0] + 1) % copies
        return calls[at[0]](x)

    return call


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.reshape(-1).astype(np.float64), b.reshape(-1).astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=SHAPES, help="out x in of each Linear weight")
    parser.add_argument("--codecs", default="fp16,int8,q4")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--cold", type=float, default=0, help="MB of weight copies to cycle")
    args = parser.parse_args()
    import iree.runtime as rt

    from myelin.codecs._cpu_kernels import KERNELS, select
    from myelin.compiler.targets import TargetDevice

    rt.flags.parse_flags(f"--task_topology_group_count={args.threads}")
    kernels = select([TargetDevice("cpu")])
    avx2 = next(k for k in KERNELS if k.name == "q4_matvec_avx2")
    print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {args.threads} "
        f"IREE worker(s); min of {args.calls} calls, median (range) of {args.rounds} rounds; "
        f"load {os.getloadavg()[0]:.2f}"
        + (f"; cold: copies of each weight cycled, >= {args.cold:g} MB" if args.cold else "")
    )
    print(
        "| codec | out x in | MB | kernel | IREE GB/s | q4 AVX2 kernel GB/s | kernel GB/s "
        "| kernel / before |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for codec in args.codecs.split(","):
        for shape in args.shapes.split(","):
            n, k = map(int, shape.split("x"))
            rng = np.random.default_rng(k * n)
            w = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
            graph, stored, decoded = encoded(k, n, codec, w)
            nbytes = sum(d.nbytes for d in stored.values())
            copies = max(1, math.ceil(args.cold * 1e6 / nbytes))
            calls = {"iree": compiled(graph, stored, {}, copies)}
            if codec == "q4":  # before the AVX-512 kernel, q4 ran the AVX2 one
                calls["avx2"] = compiled(graph, stored, {"q4": (avx2,)}, copies)
            calls["kernel"] = compiled(graph, stored, {codec: kernels[codec][:1]}, copies)
            x = rng.standard_normal((1, k)).astype(np.float32)
            want = x @ decoded.T  # decoded: the logical [out, in] weight
            for form, call in calls.items():
                got = call(x)
                if form != "iree" and codec != "fp16":
                    assert cosine(got, want) > 0.999, (codec, shape, cosine(got, want))
                else:
                    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
            times: dict[str, list[float]] = {f: [] for f in calls}
            for _ in range(args.rounds):
                for form, call in calls.items():
                    best = float("inf")
                    for _ in range(args.calls):
                        start = time.perf_counter()
                        for _ in range(copies):
                            call(x)
                        best = min(best, (time.perf_counter() - start) / copies)
                    times[form].append(best)
            cells = {}
            for form in calls:
                gbs = [nbytes / t / 1e9 for t in times[form]]
                cells[form] = f"{statistics.median(gbs):.1f} ({min(gbs):.1f}-{max(gbs):.1f})"
            before = "avx2" if codec == "q4" else "iree"
            ratio = [a / b for a, b in zip(times[before], times["kernel"], strict=True)]
            print(
                f"| {codec} | {n}x{k} | {nbytes / 1e6:.1f} | {kernels[codec][0].name} "
                f"| {cells['iree']} | {cells.get('avx2', '-')} | {cells['kernel']} "
                f"| {statistics.median(ratio):.2f}x |",
                flush=True,
            )
    print(f"load at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
