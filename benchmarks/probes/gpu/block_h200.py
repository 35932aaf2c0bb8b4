"""The Llama-7B-shaped block (benchmarks/gpu/block/model.py) on the H200: PLeX (the Triton kernel
variant) vs torch eager running the same functions, weights and inputs resident on the GPU.

    python3 benchmarks/probes/gpu/block_h200.py --mln block.mln --json block_h200.json [--flags ...]
    python3 benchmarks/probes/gpu/block_h200.py --model plain_block --mln plain_block.mln ...

`--model plain_block`: the same block written with [batch, seq, dim] activations, as user model
code is (benchmarks/gpu/plain_block/model.py).

Per case (prefill 1 x 2048, decode 8 over a 2048-token cache): errors of both against an fp32
run of the same functions; wall time per call (rounds of interleaved calls, each waited for);
GPU time per call from CUPTI (torch.profiler), the difference (the per-call overhead), and PLeX's
GPU time per dispatch (which op costs what).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

import myelin
from myelin.runtime.devices import DEFAULT_CUDA_ALLOCATOR
from myelin.runtime.tensors import import_cuda_tensor


def torch_dtype(spec) -> str:
    """The torch dtype name of a signature tensor's dtype."""
    from myelin.dtypes import numpy_dtype

    return str(np.dtype(numpy_dtype(spec.dtype)))


def rel_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.float() - ref.float()).norm() / ref.float().norm())


def gpu_profile(fn, calls: int = 5) -> tuple[float, dict[str, float]]:
    """GPU time per call (kernels, copies, fills) and per kernel name, from CUPTI."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    per: dict[str, float] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name] = per.get(e.name, 0.0) + e.time_range.elapsed_us() / 1e3 / calls
    return sum(per.values()), dict(sorted(per.items(), key=lambda kv: -kv[1]))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mln", required=True)
    p.add_argument("--model", default="block", choices=("block", "plain_block"))
    p.add_argument("--json", default="block_h200.json")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--flags", default="")
    p.add_argument(
        "--allocator",
        default=DEFAULT_CUDA_ALLOCATOR,
        help="Instance(cuda_allocator=...); default: the runtime's",
    )
    p.add_argument("--spin-us", type=float, default=200.0, help="session(spin_us=) of *_spin rows")
    args = p.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent / args.model))
    import model as block

    if args.flags:
        import iree.runtime as rt

        rt.flags.parse_flags(*args.flags.split())
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = "cuda"
    from torch.nn.attention import SDPBackend, sdpa_kernel

    fast_sdpa = [
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
        SDPBackend.CUDNN_ATTENTION,
    ]
    inputs = block.example_inputs(dev)
    mdl = myelin.Instance(cuda_allocator=args.allocator).load(args.mln)
    s = mdl.session()
    s_spin = mdl.session(spin_us=args.spin_us)
    out: dict = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "variant": mdl.variant_name,
        "flags": args.flags,
        "allocator": args.allocator,
        "spin_us": args.spin_us,
        "cases": {},
    }
    funcs: dict = {}
    for name, fn_t in (("prefill", block.prefill), ("decode", block.decode)):
        fn = s.resolve(name)
        xs = inputs[name]
        # Weights (and the KV cache) imported once: they stay where they are; activations are
        # torch tensors imported on every call.
        n_act = 3
        resident = [
            import_cuda_tensor(t, fn._device, spec, name)
            for t, spec in zip(xs[n_act:], fn.signature.inputs[n_act:], strict=True)
        ]
        acts = list(xs[:n_act])

        acts_dev = [
            import_cuda_tensor(t, fn._device, spec, name)
            for t, spec in zip(acts, fn.signature.inputs[:n_act], strict=True)
        ]

        def plex(fn=fn, acts=acts, resident=resident):
            return fn(*acts, *resident, output="device")

        def plex_resident(fn=fn, acts=acts_dev, resident=resident):
            return fn(*acts, *resident, output="device")

        # The storage twin (output="dlpack"): results in MyeLiN's memory, transients in the
        # session's buffer, so the call allocates nothing on IREE's queue; then the same with
        # the hybrid fence wait.
        fn_spin = s_spin.resolve(name)

        def plex_spin(fn=fn_spin, acts=acts_dev, resident=resident):
            return fn(*acts, *resident, output="device")

        def plex_twin(fn=fn, acts=acts_dev, resident=resident):
            return fn(*acts, *resident, output="dlpack")

        def plex_twin_spin(fn=fn_spin, acts=acts_dev, resident=resident):
            return fn(*acts, *resident, output="dlpack")

        # out= through the twin into result storage imported once (resident, as the inputs)
        storage = [
            import_cuda_tensor(
                torch.empty(spec.shape, device=dev, dtype=getattr(torch, torch_dtype(spec))),
                fn._device,
                spec,
                name,
            )
            for spec in fn.signature.outputs
        ]

        def plex_out(fn=fn, acts=acts_dev, resident=resident, storage=storage):
            return fn(*acts, *resident, out=tuple(storage))

        def plex_out_spin(fn=fn_spin, acts=acts_dev, resident=resident, storage=storage):
            return fn(*acts, *resident, out=tuple(storage))

        def eager(fn_t=fn_t, xs=xs, backends=None):
            with torch.no_grad(), sdpa_kernel(backends or fast_sdpa):
                return fn_t(*xs)

        try:  # torch's fused attention (flash / memory-efficient / cuDNN), never its math path
            eager()
        except RuntimeError as e:
            out.setdefault("sdpa_fallback", {})[name] = str(e).splitlines()[0]
            fast_sdpa[:] = [SDPBackend.MATH, *fast_sdpa]

        with torch.no_grad():
            ref = fn_t(*(t.float() for t in xs))
        y_plex = [torch.from_numpy(np.asarray(r.to_host())).to(dev) for r in plex()]
        y_torch = eager()
        row: dict = {
            "error_vs_fp32": {
                "plex": [rel_error(a, b) for a, b in zip(y_plex, ref, strict=True)],
                "torch": [rel_error(a, b) for a, b in zip(y_torch, ref, strict=True)],
            },
            "plex_nan": any(bool(torch.isnan(t).any()) for t in y_plex),
        }
        y_twin = [torch.from_dlpack(r) for r in plex_twin()]  # static shapes: exported in place
        row["error_vs_fp32"]["plex_twin"] = [
            rel_error(a, b) for a, b in zip(y_twin, ref, strict=True)
        ]
        del ref, y_plex, y_torch, y_twin
        walls: dict[str, list[float]] = {
            "plex": [],
            "plex_resident": [],
            "plex_nosync": [],
            "plex_spin_nosync": [],
            "plex_twin": [],
            "plex_twin_nosync": [],
            "plex_twin_spin_nosync": [],
            "plex_out_nosync": [],
            "plex_out_spin_nosync": [],
            "torch": [],
        }
        warm = (
            plex,
            plex_resident,
            plex_spin,
            plex_twin,
            plex_twin_spin,
            plex_out,
            plex_out_spin,
            eager,
        )
        for f in warm:  # warm-up
            for _ in range(3):
                f()
            torch.cuda.synchronize()
        for _ in range(args.rounds):
            # A PLeX call returns when its results are written, so "plex_nosync" times it alone;
            # the other rows end every call with torch.cuda.synchronize(), as torch needs.
            for who, f, sync in (
                ("plex", plex, True),
                ("plex_resident", plex_resident, True),
                ("plex_nosync", plex_resident, False),
                ("plex_spin_nosync", plex_spin, False),
                ("plex_twin", plex_twin, True),
                ("plex_twin_nosync", plex_twin, False),
                ("plex_twin_spin_nosync", plex_twin_spin, False),
                ("plex_out_nosync", plex_out, False),
                ("plex_out_spin_nosync", plex_out_spin, False),
                ("torch", eager, True),
            ):
                ts = []
                for _ in range(args.calls):
                    t = time.perf_counter()
                    f()
                    if sync:
                        torch.cuda.synchronize()
                    ts.append((time.perf_counter() - t) * 1e3)
                walls[who].append(statistics.median(ts))
        row["walls"] = walls
        out["cases"][name] = row
        funcs[name] = {
            "plex": plex,
            "plex_resident": plex_resident,
            "plex_nosync": plex_resident,
            "plex_spin_nosync": plex_spin,
            "plex_twin": plex_twin,
            "plex_twin_nosync": plex_twin,
            "plex_twin_spin_nosync": plex_twin_spin,
            "plex_out_nosync": plex_out,
            "plex_out_spin_nosync": plex_out_spin,
            "torch": eager,
        }
    # Profiles last: a CUPTI session slows what runs after it in the same process.
    for name, row in out["cases"].items():
        walls = row.pop("walls")
        for who, f in funcs[name].items():
            gpu, per = gpu_profile(f)
            w = statistics.median(walls[who])
            row[who] = {
                "wall_ms_median": w,
                "wall_ms_rounds": walls[who],
                "gpu_ms": gpu,
                "overhead_ms": w - gpu,
                "top_kernels_ms": dict(list(per.items())[:12]),
                "kernels": len(per),
            }
        for who in [w for w in walls if w != "torch"]:
            ratios = [t / p for t, p in zip(walls["torch"], walls[who], strict=True)]
            row[f"torch_over_{who}"] = {
                "median": statistics.median(ratios),
                "min": min(ratios),
                "max": max(ratios),
            }
        print(name, json.dumps({k: v for k, v in row.items() if k not in funcs[name]}))
        for who in funcs[name]:
            r = row[who]
            print(
                f"  {who}: wall {r['wall_ms_median']:.3f} ms, gpu {r['gpu_ms']:.3f} ms, "
                f"overhead {r['overhead_ms']:.3f} ms, {r['kernels']} kernel names"
            )
            for k, v in list(r["top_kernels_ms"].items())[:8]:
                print(f"     {v:8.4f} ms  {k[:110]}")
    Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
