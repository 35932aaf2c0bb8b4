"""PLeX's Triton kernel variant vs torch eager on one GPU, inputs resident on the GPU.

Run on the H200 (benchmarks/gpu/README.md): `python benchmarks/probes/gpu/kernels_h200.py --mln
benchmarks/gpu/artifacts/kernels.mln`. Prints one table: wall time per call (median, each call
waited for), GPU kernel time per call (CUPTI, through torch.profiler) and their difference (the
per-call overhead), errors against an fp32 reference, and the DLPack round trip of a 256 MiB
tensor. Writes the numbers as JSON to --json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

import myelin
from myelin.runtime.devices import DEFAULT_CUDA_ALLOCATOR
from myelin.runtime.tensors import import_cuda_tensor

N = 8192
FLOP = 2 * N**3


def wall_ms(fn, reps: int = 20, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def kernel_ms(fn, calls: int = 5) -> tuple[float, float]:
    """Sum of GPU kernel (and memcpy/memset) time per call, and kernels per call, from CUPTI."""
    fn()
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    total, count = 0.0, 0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            total += e.time_range.elapsed_us()
            count += 1
    return total / 1e3 / calls, count / calls


def llama_shapes(s, hal, dev) -> dict:
    """Llama-7B projections, x W^T: decode (8 tokens, the skinny kernel) and the prefill FFN
    up-projection (2048 tokens); PLeX's kernel against cuBLAS through torch.nn.functional.linear."""
    out = {}
    for name, m, n in (("decode_bt", 8, 4096), ("ffn_up_bt", 2048, 11008)):
        fn = s.resolve(name)
        x = (torch.randn(m, 4096, device=dev) * 0.05).half()
        w = (torch.randn(n, 4096, device=dev) * 0.05).half()
        w_dev = import_cuda_tensor(w, hal, fn.signature.inputs[1], name)
        ref = x.float() @ w.float().T
        y = torch.from_numpy(np.asarray(fn(x, w_dev))).to(dev)
        row = {
            "plex_error": rel_error(y, ref),
            "torch_error": rel_error(torch.nn.functional.linear(x, w), ref),
        }
        for who, call in (
            ("torch", lambda x=x, w=w: torch.nn.functional.linear(x, w)),
            ("plex", lambda fn=fn, x=x, w_dev=w_dev: fn(x, w_dev, output="device")),
        ):
            wall = wall_ms(call)
            kernel, count = kernel_ms(call)
            row[who] = {"wall_ms": wall, "kernel_ms": kernel, "kernels_per_call": count}
        row["kernel_vs_cublas"] = row["torch"]["kernel_ms"] / row["plex"]["kernel_ms"]
        row["wall_vs_torch"] = row["torch"]["wall_ms"] / row["plex"]["wall_ms"]
        out[f"{name} {m}x{n}x4096"] = row
        print(name, json.dumps(row))
    return out


def rel_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.float() - ref).norm() / ref.norm())


def gemv_rows(mln: str, allocator: str, spin_us: float, dev) -> dict:
    """Issue 17's GEMVs, 1x8192 by a 28672x8192 weight stored N x K (x W^T) or K x N (x W),
    from `benchmarks/gpu/tunekern` (the kernel library's default configs), the weight resident:
    torch eager, PLeX with IREE's result memory ("device"), and the storage twin ("dlpack":
    results in MyeLiN's memory, transients in the session's buffer) and `out=` through the twin
    (resident result storage), blocking or hybrid wait."""
    model = myelin.Instance(cuda_allocator=allocator).load(mln)
    s, s_spin = model.session(), model.session(spin_us=spin_us)
    x = (torch.randn(1, 8192, device=dev) * 0.1).half()
    w = (torch.randn(28672, 8192, device=dev) * 0.1).half()
    out = {}
    for name, weight, torch_fn in (
        ("gemv_nk", w, lambda: torch.nn.functional.linear(x, w)),
        ("gemv_kn", w.T.contiguous(), None),
    ):
        fn, fn_spin = s.resolve(name), s_spin.resolve(name)
        hal = s._device
        x_dev = import_cuda_tensor(x, hal, fn.signature.inputs[0], name)
        w_dev = import_cuda_tensor(weight, hal, fn.signature.inputs[1], name)
        if torch_fn is None:
            torch_fn = lambda weight=weight: x @ weight  # noqa: E731
        ref = x.float() @ w.float().T
        y = torch.from_dlpack(fn(x_dev, w_dev, output="dlpack"))
        y_dev = import_cuda_tensor(torch.empty_like(y), hal, fn.signature.outputs[0], name)
        row: dict = {"plex_error": rel_error(y, ref), "torch_error": rel_error(torch_fn(), ref)}
        calls = {
            "torch": torch_fn,
            "plex device": lambda fn=fn, x=x_dev, w=w_dev: fn(x, w, output="device"),
            "plex twin": lambda fn=fn, x=x_dev, w=w_dev: fn(x, w, output="dlpack"),
            "plex twin, hybrid wait": lambda f=fn_spin, x=x_dev, w=w_dev: f(x, w, output="dlpack"),
            "plex out= via twin": lambda fn=fn, x=x_dev, w=w_dev, y=y_dev: fn(x, w, out=y),
            "plex out= via twin, hybrid wait": lambda f=fn_spin, x=x_dev, w=w_dev, y=y_dev: f(
                x, w, out=y
            ),
        }
        walls: dict[str, list[float]] = {who: [] for who in calls}
        for _ in range(5):  # 5 interleaved rounds of 20 calls each: the spread
            for who, call in calls.items():
                walls[who].append(wall_ms(call))
        for who, call in calls.items():  # CUPTI last: it slows what runs after it
            kernel, count = kernel_ms(call)
            wall = statistics.median(walls[who])
            row[who] = {
                "wall_ms": wall,
                "wall_ms_rounds": walls[who],
                "kernel_ms": kernel,
                "kernels_per_call": count,
                "overhead_ms": wall - kernel,
            }
        for who in list(calls)[1:]:
            row[who]["vs_torch"] = row["torch"]["wall_ms"] / row[who]["wall_ms"]
        out[name] = row
        print(name, json.dumps(row))
    return out


def kernels_by_name(calls: list, repeats: int = 5) -> dict[str, float]:
    """GPU time per call of each kernel name (ms), from one CUPTI session in which `calls` take
    turns `repeats` times: the rows' kernels then meet the same clocks and temperature (an H200
    at 750 TFLOP/s runs at its power limit, so a kernel timed alone after a cool pause is
    faster than the same kernel after a hot one)."""
    from torch.profiler import ProfilerActivity, profile

    for call in calls:
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            for call in calls:
                call()
                torch.cuda.synchronize()
    times: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            times.setdefault(e.name, []).append(e.time_range.elapsed_us() / 1e3)
    return {name: statistics.median(v) for name, v in times.items()}


def interleaved_walls(
    calls: dict, rounds: int, per_round: int
) -> tuple[dict[str, list[float]], list[dict | None]]:
    """Per row, the median wall of `per_round` calls in each of `rounds` rounds; the rows take
    turns within a round (order rotated per round), so drift hits them alike. A row named
    "... no sync" is the call alone (a PLeX call returns when its results are written); every
    other row ends each call with torch.cuda.synchronize(), as torch's must. Also the GPU's
    clock and power after each round (`gpu_state`)."""
    names = list(calls)
    walls: dict[str, list[float]] = {n: [] for n in names}
    states: list[dict | None] = []  # the GPU's clock and power after each round
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            fn, sync = calls[name], not name.endswith("no sync")
            fn()
            torch.cuda.synchronize()
            times = []
            for _ in range(per_round):
                t = time.perf_counter()
                fn()
                if sync:
                    torch.cuda.synchronize()
                times.append((time.perf_counter() - t) * 1e3)
            walls[name].append(statistics.median(times))
        states.append(gpu_state())
    return walls, states


def gpu_state() -> dict | None:
    """The SM clock (MHz) and power draw (W) now, when torch can read them (pynvml): whether a
    round ran at the power limit. None where it cannot."""
    try:
        return {"sm_mhz": torch.cuda.clock_rate(), "watts": torch.cuda.power_draw() / 1e3}
    except Exception:  # no pynvml / NVML on this machine: not recorded
        return None


def summarize(walls: dict[str, list[float]], base: str) -> dict[str, dict]:
    """Median over rounds, the min-max of the round medians, and the ratio to `base` per round
    (torch wall / row wall: above 1 is faster than torch)."""
    out = {}
    for name, w in walls.items():
        ratios = [b / x for b, x in zip(walls[base], w, strict=True)]
        out[name] = {
            "wall_ms": statistics.median(w),
            "wall_ms_min": min(w),
            "wall_ms_max": max(w),
            "vs_torch": statistics.median(ratios),
            "vs_torch_min": min(ratios),
            "vs_torch_max": max(ratios),
            "rounds": w,
        }
    return out


def matmul_configs_rows(
    listing: str, allocator: str, spin_us: list[float], rounds: int, m: int = N
) -> dict:
    """matmul 8192^3: torch vs PLeX's "device" path (imported device arrays, results in IREE's
    memory) on every kernel config build of `matmul_configs.py` (one .mln each), with the
    library config's build also under each `session(spin_us=)`, each with and without the
    synchronize; walls interleaved over rounds, kernel times by name from one interleaved CUPTI
    session."""
    import os

    folder = os.path.dirname(listing)
    with open(listing) as fh:
        configs = json.load(fh)
    dev = torch.device("cuda")
    a = (torch.randn(m, N, device=dev) * 0.05).half()
    b = (torch.randn(N, N, device=dev) * 0.05).half()
    torch.backends.cuda.matmul.allow_tf32 = False
    ref = a.float() @ b.float()
    t_y = a @ b
    instance = myelin.Instance(cuda_allocator=allocator)
    calls: dict = {"torch a @ b": lambda: torch.matmul(a, b)}
    errors = {"torch": rel_error(t_y, ref)}
    kernel_of: dict[str, str] = {}
    keep = []
    for c in configs:
        model = instance.load(os.path.join(folder, c["mln"]))
        sessions = {0.0: model.session()}
        if c["library"]:
            sessions.update({us: model.session(spin_us=us) for us in spin_us})
        for us, s in sessions.items():
            fn = s.resolve("matmul")
            a_dev = import_cuda_tensor(a, fn._device, fn.signature.inputs[0], "matmul")
            b_dev = import_cuda_tensor(b, fn._device, fn.signature.inputs[1], "matmul")
            keep.append((model, s, a_dev, b_dev))
            label = f"plex {c['name'].removeprefix('plex_matmul_ab_f16_f16_')}"
            label += " device" + (f" spin {us:g}" if us else "")
            if us == 0.0:
                fn(a_dev, b_dev, output="dlpack")  # dynamic M: the first call learns the shape
                y = torch.from_dlpack(fn(a_dev, b_dev, output="dlpack"))
                errors[c["name"]] = rel_error(y, ref)
                errors[c["name"] + " max |plex - torch|"] = float((y - t_y).abs().max())
                del y
            call = lambda fn=fn, x=a_dev, w=b_dev: fn(x, w, output="device")  # noqa: E731
            calls[label] = call
            kernel_of[label] = c["name"]
            if c["library"]:
                calls[label + ", no sync"] = call
                kernel_of[label + ", no sync"] = c["name"]
    del ref, t_y
    walls, states = interleaved_walls(calls, rounds=rounds, per_round=10)
    rows = summarize(walls, "torch a @ b")
    # one CUPTI session, every config's kernel and cuBLAS's taking turns
    distinct = {"torch a @ b": calls["torch a @ b"]}
    for label, name in kernel_of.items():
        distinct.setdefault(name, calls[label])
    by_name = kernels_by_name(list(distinct.values()))
    cublas = sum(v for k, v in by_name.items() if not k.startswith("plex_"))
    for label, row in rows.items():
        kernel = by_name.get(kernel_of[label]) if label in kernel_of else cublas
        row["kernel_ms"] = kernel  # None: the kernel did not show in the profile
        row["overhead_us"] = None if kernel is None else (row["wall_ms"] - kernel) * 1e3
    return {
        "rows": rows,
        "errors": errors,
        "kernels_ms": by_name,
        "cublas_kernel_ms": cublas,
        "rounds": rounds,
        "gpu_after_each_round": states,
    }


def gemv_interleaved(tuned: str, untuned: str | None, allocator: str, spin_us: float) -> dict:
    """Issue 17's GEMVs (1x8192 by 28672x8192, weight stored N x K or K x N, resident) with
    the tuned kernel configs (`benchmarks/gpu/tunekern_tuned`) and the library's
    (`benchmarks/gpu/tunekern`): torch vs PLeX's "device" path, interleaved rounds, kernels
    by name from one CUPTI session per layout."""
    dev = torch.device("cuda")
    instance = myelin.Instance(cuda_allocator=allocator)
    builds = {"tuned": tuned} | ({"library": untuned} if untuned else {})
    models = {k: instance.load(v) for k, v in builds.items()}
    x = (torch.randn(1, 8192, device=dev) * 0.1).half()
    w = (torch.randn(28672, 8192, device=dev) * 0.1).half()
    w_kn = w.T.contiguous()
    ref = x.float() @ w.float().T
    out: dict = {}
    keep = []
    for name, weight, torch_fn in (
        ("gemv_nk", w, lambda: torch.nn.functional.linear(x, w)),
        ("gemv_kn", w_kn, lambda: x @ w_kn),
    ):
        calls: dict = {"torch": torch_fn}
        errors = {"torch": rel_error(torch_fn(), ref)}
        for build, model in models.items():
            for us in (0.0, spin_us) if build == "tuned" else (0.0,):
                s = model.session(spin_us=us)
                fn = s.resolve(name)
                xd = import_cuda_tensor(x, fn._device, fn.signature.inputs[0], name)
                wd = import_cuda_tensor(weight, fn._device, fn.signature.inputs[1], name)
                keep.append((s, xd, wd))
                call = lambda fn=fn, xd=xd, wd=wd: fn(xd, wd, output="device")  # noqa: E731
                label = f"plex {build} device" + (f" spin {us:g}" if us else "")
                calls[label] = call
                if us == 0.0:
                    y = torch.from_dlpack(fn(xd, wd, output="dlpack"))
                    errors[build] = rel_error(y, ref)
                if build == "tuned":
                    calls[label + ", no sync"] = call
        walls, states = interleaved_walls(calls, rounds=7, per_round=20)
        rows = summarize(walls, "torch")
        by_name = kernels_by_name(
            [calls[k] for k in calls if "no sync" not in k and "spin" not in k]
        )
        torch_kernel = sum(v for k, v in by_name.items() if not k.startswith("plex_"))
        plex = sorted(k for k in by_name if k.startswith("plex_"))
        for label, row in rows.items():
            if label == "torch":
                row["kernel_ms"] = torch_kernel
            else:
                build = label.split()[1]
                kname = [k for k in plex if k in kernel_names(builds[build], name)]
                row["kernel_ms"] = by_name[kname[0]] if kname else None
                row["kernel"] = kname[0] if kname else None
            if row["kernel_ms"] is not None:
                row["overhead_us"] = (row["wall_ms"] - row["kernel_ms"]) * 1e3
        out[name] = {
            "rows": rows,
            "errors": errors,
            "kernels_ms": by_name,
            "gpu_after_each_round": states,
        }
        print(name, json.dumps({k: round(v["wall_ms"], 4) for k, v in rows.items()}), flush=True)
    return out


def gemv_configs_rows(listing: str, allocator: str, spin_us: float, rounds: int) -> dict:
    """Issue 17's GEMVs on every config build of `gemv_configs.py` (one .mln each), per layout:
    torch (synchronized) vs each build's "device" path under `session(spin_us=)`, no sync (the
    goal's row of `gemv_interleaved`), walls interleaved over rounds, kernels by name from one
    interleaved CUPTI session, errors against fp32."""
    import os

    folder = os.path.dirname(listing)
    with open(listing) as fh:
        configs = json.load(fh)
    dev = torch.device("cuda")
    instance = myelin.Instance(cuda_allocator=allocator)
    models = {c["name"]: instance.load(os.path.join(folder, c["mln"])) for c in configs}
    x = (torch.randn(1, 8192, device=dev) * 0.1).half()
    w = (torch.randn(28672, 8192, device=dev) * 0.1).half()
    w_kn = w.T.contiguous()
    ref = x.float() @ w.float().T
    out: dict = {}
    keep = []
    for layout, (name, weight, torch_fn) in enumerate(
        (
            ("gemv_nk", w, lambda: torch.nn.functional.linear(x, w)),
            ("gemv_kn", w_kn, lambda: x @ w_kn),
        )
    ):
        calls: dict = {"torch": torch_fn}
        errors = {"torch": rel_error(torch_fn(), ref)}
        kernel_of = {}
        for c in configs:
            s = models[c["name"]].session(spin_us=spin_us)
            fn = s.resolve(name)
            xd = import_cuda_tensor(x, fn._device, fn.signature.inputs[0], name)
            wd = import_cuda_tensor(weight, fn._device, fn.signature.inputs[1], name)
            keep.append((s, xd, wd))
            y = torch.from_dlpack(fn(xd, wd, output="dlpack"))
            errors[c["name"]] = rel_error(y, ref)
            del y
            label = f"plex {c['name'].removeprefix('plex_matmul_')}, no sync"
            calls[label] = lambda fn=fn, xd=xd, wd=wd: fn(xd, wd, output="device")
            kernel_of[label] = c["kernels"][layout]
        walls, states = interleaved_walls(calls, rounds=rounds, per_round=20)
        rows = summarize(walls, "torch")
        by_name = kernels_by_name(list(calls.values()))
        torch_kernel = sum(v for k, v in by_name.items() if not k.startswith("plex_"))
        for label, row in rows.items():
            row["kernel_ms"] = by_name.get(kernel_of[label]) if label in kernel_of else torch_kernel
            if row["kernel_ms"] is not None:
                row["overhead_us"] = (row["wall_ms"] - row["kernel_ms"]) * 1e3
                row["kernel_vs_cublas"] = torch_kernel / row["kernel_ms"]
        out[name] = {
            "rows": rows,
            "errors": errors,
            "kernels_ms": by_name,
            "rounds": rounds,
            "gpu_after_each_round": states,
        }
        for k, v in sorted(rows.items(), key=lambda kv: kv[1]["kernel_ms"] or 1):
            error = errors.get(k.replace("plex ", "plex_matmul_").removesuffix(", no sync"), 0)
            print(
                f"{name} {k:44s} wall {v['wall_ms']:.4f} [{v['wall_ms_min']:.4f}-"
                f"{v['wall_ms_max']:.4f}] kernel {v['kernel_ms']:.4f} vs torch "
                f"{v['vs_torch']:.3f} [{v['vs_torch_min']:.3f}-{v['vs_torch_max']:.3f}] "
                f"err {error:.2e}",
                flush=True,
            )
    return out


def kernel_names(path: str, function: str) -> set[str]:
    """The kernels the build put at `function`'s matmuls (the .mln's kernels report)."""
    from myelin.mln import MlnReader

    names = set()
    for variant in MlnReader(path).manifest["variants"]:
        for device in variant["devices"]:
            for site in device.get("kernels", []):
                if site.get("function") == function and site.get("kernel"):
                    names.add(site["kernel"])
    return names


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mln", help="kernels.mln (without it, only the --gemv rows)")
    parser.add_argument("--json", default="kernels_h200.json")
    parser.add_argument("--flags", default="", help="IREE runtime flags (--device_allocator=...)")
    parser.add_argument("--short", action="store_true", help="the overhead rows only")
    parser.add_argument(
        "--allocator",
        default=DEFAULT_CUDA_ALLOCATOR,
        help="Instance(cuda_allocator=...); default: the runtime's",
    )
    parser.add_argument("--spin-us", type=float, default=200.0, help="session(spin_us=) rows")
    parser.add_argument(
        "--matmul-spins",
        type=float,
        nargs="+",
        help="the 8192^3 rows' session(spin_us=) values (default: --spin-us / 2 and --spin-us); "
        "a value above the call's length polls the fence from the start",
    )
    parser.add_argument("--gemv", help="tunekern.mln (benchmarks/gpu/tunekern): the GEMV rows")
    parser.add_argument(
        "--configs", help="mm_configs.json of matmul_configs.py: the interleaved matmul rows"
    )
    parser.add_argument("--gemv-tuned", help="tunekern_tuned.mln: the interleaved GEMV rows")
    parser.add_argument(
        "--gemv-configs", help="gemv_configs.json of gemv_configs.py: the GEMV config rows"
    )
    parser.add_argument("--rounds", type=int, default=15, help="rounds of the interleaved rows")
    args = parser.parse_args()
    if args.flags:  # before the first driver is created
        import iree.runtime as rt

        rt.flags.parse_flags(*args.flags.split())
    torch.manual_seed(0)
    dev = torch.device("cuda")
    if args.configs or args.gemv_tuned or args.gemv_configs:  # interleaved, a process of their own
        results: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
        if args.gemv_configs:
            results["gemv_configs"] = gemv_configs_rows(
                args.gemv_configs, args.allocator, args.spin_us, args.rounds
            )
        if args.configs:
            spins = args.matmul_spins or [args.spin_us / 2, args.spin_us]
            results["matmul_8192"] = matmul_configs_rows(
                args.configs, args.allocator, spins, args.rounds
            )
            rows = results["matmul_8192"]["rows"]
            for k, v in rows.items():
                print(
                    f"{k:52s} wall {v['wall_ms']:.4f} [{v['wall_ms_min']:.4f}-"
                    f"{v['wall_ms_max']:.4f}] kernel {v['kernel_ms']} over "
                    f"{v['overhead_us']} us  vs torch {v['vs_torch']:.3f} "
                    f"[{v['vs_torch_min']:.3f}-{v['vs_torch_max']:.3f}]",
                    flush=True,
                )
            print(json.dumps(results["matmul_8192"]["errors"]), flush=True)
            with open(args.json, "w") as fh:  # written early: the GEMV rows may not finish
                json.dump(results, fh, indent=1)
        if args.gemv_tuned:
            results["gemv"] = gemv_interleaved(
                args.gemv_tuned, args.gemv, args.allocator, args.spin_us
            )
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
        return
    if args.mln is None:  # the GEMV rows alone, in a process of their own
        gemv = gemv_rows(args.gemv, args.allocator, args.spin_us, dev)
        with open(args.json, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "gemv": gemv}, fh, indent=1)
        return
    a = (torch.randn(N, N, device=dev) * 0.05).half()
    b = (torch.randn(N, N, device=dev) * 0.05).half()
    results: dict = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "flags": args.flags,
        "allocator": args.allocator,
    }

    model = myelin.Instance(cuda_allocator=args.allocator).load(args.mln)
    results["variant"] = model.variant_name
    s = model.session()
    mm_spin = model.session(spin_us=args.spin_us).resolve("matmul")
    mm, mm_bt, into, ident = (
        s.resolve(n) for n in ("matmul", "matmul_bt", "matmul_into", "identity")
    )
    hal = model.hal_device(mm._entry.device) if mm._entry.device else s._device
    a_dev = import_cuda_tensor(a, hal, mm.signature.inputs[0], "matmul")
    b_dev = import_cuda_tensor(b, hal, mm.signature.inputs[1], "matmul")
    c = torch.empty(N, N, device=dev, dtype=torch.float16)
    c_dev = import_cuda_tensor(c, hal, mm.signature.outputs[0], "matmul")  # resident storage
    tiny = torch.ones(8, device=dev, dtype=torch.float16)

    # correctness first: fresh inputs, poisoned output, against an fp32 reference
    torch.backends.cuda.matmul.allow_tf32 = False
    ref = a.float() @ b.float()
    ref_bt = a.float() @ b.float().T
    c.fill_(float("nan"))
    y = torch.from_numpy(np.asarray(mm(a, b))).to(dev)
    y_into = into(a, b, out=c)
    y_bt = torch.from_numpy(np.asarray(mm_bt(a, b))).to(dev)
    t_y = a @ b
    results["error"] = {
        "plex_matmul": rel_error(y, ref),
        "plex_matmul_into": rel_error(y_into, ref),
        "plex_matmul_into_is_c": y_into is c,
        "plex_matmul_bt": rel_error(y_bt, ref_bt),
        "torch_matmul": rel_error(t_y, ref),
        "plex_nan": bool(torch.isnan(y).any() or torch.isnan(c).any()),
    }
    del ref, ref_bt, y, y_bt, t_y

    rows = {}
    cases = {
        "torch a @ b": lambda: torch.matmul(a, b),
        "torch a @ b.T": lambda: torch.matmul(a, b.T),
        "plex matmul (torch tensors in, device out)": lambda: mm(a, b, output="device"),
        "plex matmul (imported device arrays)": lambda: mm(a_dev, b_dev, output="device"),
        "plex matmul_into (out= torch tensor)": lambda: into(a, b, out=c),
        "plex matmul_into (device arrays, out=)": lambda: into(a_dev, b_dev, out=c),
        "plex matmul (device arrays, dlpack: twin, transients)": lambda: mm(
            a_dev, b_dev, output="dlpack"
        ),
        "plex matmul (twin, hybrid wait)": lambda: mm_spin(a_dev, b_dev, output="dlpack"),
        "plex matmul (device arrays, out= via twin)": lambda: mm(a_dev, b_dev, out=c_dev),
        "plex matmul (out= via twin, hybrid wait)": lambda: mm_spin(a_dev, b_dev, out=c_dev),
        "plex matmul_bt (A x B^T)": lambda: mm_bt(a_dev, b_dev, output="device"),
        "plex identity, 8 elements (fixed cost)": lambda: ident(tiny, output="device"),
    }
    if args.short:
        cases = {
            k: v
            for k, v in cases.items()
            if k == "torch a @ b" or "into" in k or "imported" in k or "fixed" in k or "twin" in k
        }
    for name, fn in cases.items():
        try:
            w = wall_ms(fn)
            k, count = kernel_ms(fn)
        except Exception as e:  # recorded, not hidden
            print(f"{name}: {type(e).__name__}: {e}")
            continue
        rows[name] = {
            "wall_ms": w,
            "kernel_ms": k,
            "kernels_per_call": count,
            "overhead_ms": w - k,
            "tflops": FLOP / (w * 1e-3) / 1e12,
        }
    torch_wall = rows["torch a @ b"]["wall_ms"]
    results["error"]["torch_vs_plex_max_abs"] = float((c - torch.matmul(a, b)).abs().max())
    for r in rows.values():
        r["vs_torch"] = torch_wall / r["wall_ms"]
    results["matmul_8192"] = rows

    results["llama_shapes"] = llama_shapes(s, hal, dev)
    if args.gemv:
        results["gemv"] = gemv_rows(args.gemv, args.allocator, args.spin_us, dev)
    if args.short:
        print(json.dumps({k: round(v["overhead_ms"], 3) for k, v in rows.items()}))
        print(json.dumps({k: round(v["wall_ms"], 3) for k, v in rows.items()}))
        print(json.dumps({k: round(v["vs_torch"], 3) for k, v in rows.items()}))
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
        return
    # IREE's own codegen (sm_80 PTX, the fallback variant) for scale
    codegen = myelin.Instance(cuda_allocator=args.allocator).load(args.mln, variant="cuda")
    with codegen.session() as s2:
        f = s2.resolve("matmul")
        w = wall_ms(lambda: f(a, b, output="device"), reps=2, warmup=1)
        k, count = kernel_ms(lambda: f(a, b, output="device"), calls=1)
    results["iree_codegen_sm80"] = {"wall_ms": w, "kernel_ms": k, "vs_torch": torch_wall / w}

    # DLPack: a 256 MiB tensor through the identity entrypoint, vs a device-to-device copy
    x = torch.randn(128 * 2**20, device=dev).half()  # 128 Mi f16 = 256 MiB
    x2 = x.clone()
    try:
        yx = ident(x, output="device")
        tx = torch.from_dlpack(yx)
        results["dlpack_256MiB"] = {
            "same_pointer_in_and_out": tx.data_ptr() == x.data_ptr(),
            "values_equal": bool(torch.equal(tx, x)),
            "identity_wall_ms": wall_ms(lambda: torch.from_dlpack(ident(x, output="device"))),
            "import_only_wall_ms": wall_ms(
                lambda: import_cuda_tensor(x, hal, ident.signature.inputs[0], "identity")
            ),
        }
        del yx, tx
    except Exception as e:  # recorded, not hidden
        results["dlpack_256MiB"] = {"error": f"{type(e).__name__}: {e}"}
    results["dlpack_256MiB"].update(
        d2d_copy_wall_ms=wall_ms(lambda: x2.copy_(x)),
        torch_clone_wall_ms=wall_ms(lambda: x.clone()),
    )
    # out=: a 256 MiB-class result written straight into torch memory (matmul_into above) is the
    # zero-copy way out for results IREE would otherwise allocate.

    with open(args.json, "w") as fh:
        json.dump(results, fh, indent=1)
    print(f"device: {results['device']}, variant chosen: {results['variant']}")
    print(f"errors vs fp32: {json.dumps(results['error'])}")
    print(
        f"{'case':48s} {'wall ms':>8s} {'kernel ms':>9s} {'k/call':>6s} {'over ms':>8s} "
        f"{'TFLOP/s':>8s} {'vs torch':>8s}"
    )
    for name, r in rows.items():
        print(
            f"{name:48s} {r['wall_ms']:8.3f} {r['kernel_ms']:9.3f} {r['kernels_per_call']:6.1f} "
            f"{r['overhead_ms']:8.3f} {r['tflops']:8.1f} {r['vs_torch']:8.3f}"
        )
    print(f"IREE codegen sm_80: {json.dumps(results['iree_codegen_sm80'])}")
    print(f"DLPack 256 MiB: {json.dumps(results['dlpack_256MiB'])}")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
