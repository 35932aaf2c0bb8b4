"""The GPU zoo on the device: PLeX vs torch eager vs torch.compile on each model of
benchmarks/gpu/zoo, the same seeded weights in all three, one process.

    python3 benchmarks/gpu/zoo/run_zoo.py --artifacts benchmarks/gpu/artifacts/zoo --json OUT.json

First, before CUDA is touched, every model is built again from its config with the seeded
weights (models.py) and its .mln rebuilt from the skeleton with those weights (payload.rebuild):
each section's SHA-256 must equal the one recorded here at build time (`weights_as_built`; a
mismatch is reported, the run goes on). Then per model: outputs of PLeX and torch eager (f16)
against an fp32 torch run of the same model (relative error, Frobenius norm), and forward time
(inputs and weights resident on the device; rounds of interleaved calls, each waited for: the
median per round, then median / min / max over rounds) of PLeX, torch eager and torch.compile
(default mode; skipped with the reason if it fails). Decode is not timed: the zoo's decoders are
built as the libraries return them with use_cache off (no KV cache in the graph).

`--device cpu` runs the same script against a CPU build of the small zoo (build.py --size small
--target cpu), to check the script where there is no GPU.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE.parent))
import payload  # noqa: E402

TORCHVISION_PLACEHOLDER = REPO / "tests" / "frontends" / "_torchvision_shim"


def load_models():
    try:  # timm imports torchvision; where none loads, the tests' placeholder stands in
        import torchvision  # noqa: F401
    except Exception:
        for name in [n for n in sys.modules if n.split(".")[0] == "torchvision"]:
            del sys.modules[name]
        sys.path.insert(0, str(TORCHVISION_PLACEHOLDER))
    spec = importlib.util.spec_from_file_location("zoo_models", HERE / "models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def outputs(result) -> list[torch.Tensor]:
    """A library model's tensors, in order (HF ModelOutput fields, or a plain tensor)."""
    if isinstance(result, torch.Tensor):
        return [result]
    return [v for v in result.values() if isinstance(v, torch.Tensor)]


def rel_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.detach().double().cpu(), ref.detach().double().cpu()
    return float((x - ref).norm() / ref.norm())


def timed(fns: dict, rounds: int, calls: int, sync) -> dict:
    """Interleaved rounds: each round times `calls` calls of every function in turn (each
    waited for); per function the median of each round, then median, min and max over rounds."""
    for f in fns.values():  # warm-up
        for _ in range(3):
            f()
        sync()
    per_round: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, f in fns.items():
            times = []
            for _ in range(calls):
                start = time.perf_counter()
                f()
                sync()
                times.append((time.perf_counter() - start) * 1e3)
            per_round[name].append(statistics.median(times))
    return {
        name: {"median_ms": statistics.median(t), "min_ms": min(t), "max_ms": max(t)}
        for name, t in per_round.items()
    }


def rebuild_all(index: dict, artifacts: Path, zoo, keep: dict) -> dict:
    """Each model from its config with the seeded weights, and its .mln rebuilt from them."""
    status = {}
    for entry in index["models"]:
        name, graph = entry["model"], entry["graph"]
        start = time.perf_counter()
        model, inputs = getattr(zoo, graph)()
        # what the torch frontend stored: parameters (tied ones under each name) and every
        # buffer, non-persistent ones too (position ids, rotary frequencies)
        named = [
            *model.named_parameters(remove_duplicate=False),
            *model.named_buffers(remove_duplicate=False),
        ]
        state = {k: v.detach().numpy() for k, v in named}
        mln = artifacts / name / f"{graph}.mln"
        differ = payload.rebuild(artifacts / name / "skeleton", mln, lambda s=state: s)
        del state
        keep[name] = (model, inputs, mln)
        status[name] = {"weights_as_built": not differ, "sections_differ": differ[:5]}
        took = time.perf_counter() - start
        print(f"{name}: rebuilt in {took:.1f} s, weights as built: {not differ}", flush=True)
    return status


def run_model(entry: dict, model, inputs: dict, mln: Path, args) -> dict:
    import myelin

    dev = args.device
    on_gpu = dev == "cuda"
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    row: dict = {"coverage": entry.get("coverage"), "left_to_iree": entry.get("left_to_iree")}
    row["inputs"] = {k: list(v.shape) for k, v in inputs.items()}
    xs = {k: v.to(dev) for k, v in inputs.items()}
    with torch.no_grad():
        reference = copy.deepcopy(model).float().to(dev)
        ref = outputs(
            reference(**{k: v.float() if v.is_floating_point() else v for k, v in xs.items()})
        )
        del reference
        if on_gpu:
            torch.cuda.empty_cache()
        eager_model = model.to(dev)
        y_torch = outputs(eager_model(**xs))

    instance = myelin.Instance()
    loaded = instance.load(mln)
    session = loaded.session()
    fn = session.resolve(entry["entry"])
    if on_gpu:
        from myelin.runtime.tensors import import_cuda_tensor

        resident = [
            import_cuda_tensor(xs[spec.name], fn._device, spec, entry["entry"])
            for spec in fn.signature.inputs
        ]

        def plex():
            return fn(*resident, output="device")

        def plex_host(result):
            return [torch.from_numpy(np.asarray(r.to_host())) for r in result]
    else:
        host = [inputs[spec.name].numpy() for spec in fn.signature.inputs]

        def plex():
            return fn(*host)

        def plex_host(result):
            return [torch.from_numpy(np.asarray(r)) for r in result]

    result = plex()
    y_plex = plex_host(result if isinstance(result, tuple) else (result,))
    names = [o.name for o in fn.signature.outputs]
    row["outputs"] = names
    row["error_vs_fp32"] = {
        "plex": [rel_error(a, b) for a, b in zip(y_plex, ref, strict=False)],
        "torch_eager": [rel_error(a, b) for a, b in zip(y_torch, ref, strict=False)],
    }
    row["plex_vs_torch_eager"] = [rel_error(a, b) for a, b in zip(y_plex, y_torch, strict=False)]

    def eager():
        with torch.no_grad():
            return eager_model(**xs)

    fns = {"plex": plex, "torch_eager": eager}
    if not args.no_compile:
        try:
            compiled = torch.compile(eager_model)
            with torch.no_grad():
                y_comp = outputs(compiled(**xs))
            row["error_vs_fp32"]["torch_compile"] = [
                rel_error(a, b) for a, b in zip(y_comp, ref, strict=False)
            ]

            def compiled_call():
                with torch.no_grad():
                    return compiled(**xs)

            fns["torch_compile"] = compiled_call
        except Exception as e:  # reported; the run goes on
            row["torch_compile_skipped"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    row["times"] = timed(fns, args.rounds, args.calls, sync)
    plex_ms = row["times"]["plex"]["median_ms"]
    row["speedup"] = {
        f"vs_{name}": row["times"][name]["median_ms"] / plex_ms for name in fns if name != "plex"
    }
    del session, loaded, instance
    model.to("cpu")
    if on_gpu:
        torch.cuda.empty_cache()
    return row


def table(out: dict) -> str:
    lines = [
        "| model | coverage | PLeX ms | eager ms | compile ms | PLeX/eager | PLeX/compile "
        "| err PLeX | err eager |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in out["models"].items():
        if "error" in row:
            lines.append(f"| {name} | failed: {row['error'][:120]} |")
            continue
        t = row["times"]
        comp = t.get("torch_compile", {}).get("median_ms")
        cov = (row.get("coverage") or "").removeprefix("kernels: ").removesuffix(" kernels")
        lines.append(
            f"| {name} | {cov} | {t['plex']['median_ms']:.3f} | "
            f"{t['torch_eager']['median_ms']:.3f} | {'-' if comp is None else f'{comp:.3f}'} | "
            f"{row['speedup']['vs_torch_eager']:.2f}x | "
            f"{row['speedup'].get('vs_torch_compile', float('nan')):.2f}x | "
            f"{row['error_vs_fp32']['plex'][0]:.1e} | "
            f"{row['error_vs_fp32']['torch_eager'][0]:.1e} |"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--artifacts", type=Path, default=REPO / "benchmarks/gpu/artifacts/zoo")
    p.add_argument("--json", type=Path, default=Path("zoo.json"))
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--models", nargs="*", help="a subset (default: every model built)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    index = json.loads((args.artifacts / "zoo.json").read_text())
    if args.models:
        index["models"] = [m for m in index["models"] if m["model"] in args.models]
    zoo = load_models()
    out: dict = {"torch": torch.__version__, "size": index["size"], "models": {}}
    if args.device == "cuda":
        out["device"] = torch.cuda.get_device_name()
    keep: dict = {}
    rebuilt = rebuild_all(index, args.artifacts, zoo, keep)  # before CUDA: payload forks
    for entry in index["models"]:
        name = entry["model"]
        model, inputs, mln = keep.pop(name)
        try:
            row = run_model(entry, model, inputs, mln, args)
        except Exception as e:  # reported; the other models run
            row = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        row.update(rebuilt[name])
        out["models"][name] = row
        del model
        mln.unlink(missing_ok=True)  # GBs: one model's file at a time
        print(json.dumps({name: {k: row.get(k) for k in ("speedup", "error_vs_fp32", "error")}}))
        args.json.write_text(json.dumps(out, indent=1))
    print(table(out))
    args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
