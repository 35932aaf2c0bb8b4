"""Single f16 convolutions on CUDA: is IREE 3.13's own convolution code wrong by itself, and do
the rewritten forms give torch's answer? (docs/kernels.md, "Convolutions")

ResNet-50 in f16 built by PLeX for CUDA gave a wrong answer on an H100 (cosine 0.66) while its
convolutions were IREE's sm_80 code. Here three of ResNet-50's convolutions (the 7x7 stride-2
stem, a 3x3 of layer 1, a 1x1 of layer 1), written as IREE's torch input writes them (f16 x f16
accumulated in f32, then narrowed to f16; the padding a `tensor.pad` before), are compiled in
five forms:

  iree           the convolution as written, IREE's CUDA codegen (sm_80 PTX): PLeX before
  iree-no-igemm  the same with --iree-codegen-llvmgpu-use-igemm=false (IREE's other conv path)
  iree-f32       the same convolution in f32 (inputs widened), IREE's codegen
  im2col-iree    rewritten as im2col + matmul (myelin.kernels._conv), IREE's matmul codegen
  kernels        rewritten and matched: the matmul on the Triton sm_90a kernel (PLeX after)

Here (needs the IREE compiler and Triton; no GPU):
    python benchmarks/probes/gpu/conv_codegen.py prepare    # -> benchmarks/gpu/convs/probe/
There (the GPU machine, after `source benchmarks/gpu/runtime_env.sh`):
    python3 benchmarks/probes/gpu/conv_codegen.py run --out $OUT
Inputs and filters come from numpy seeds on both sides; the reference is torch's conv2d in f32
on the same f16 values (TF32 off). Prints one row per convolution and form: max error relative
to the reference's largest value, cosine, and wall time per call (inputs on the GPU, the result
read back), beside torch's f16 eager conv2d; writes the rows as JSON to $OUT/conv_codegen.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[3]
FOLDER = REPO / "benchmarks" / "gpu" / "convs" / "probe"
# name -> (batch, in channels, side, out channels, kernel, stride, padding)
CONVS = {
    "stem-7x7-s2": (1, 3, 224, 64, 7, 2, 3),
    "layer1-3x3": (1, 64, 56, 64, 3, 1, 1),
    "layer1-1x1": (1, 256, 56, 64, 1, 1, 0),
}
PARALLEL4 = ", ".join(['"parallel"'] * 4)
FORMS = ("iree", "iree-no-igemm", "iree-f32", "im2col-iree", "kernels")


def _out_side(side: int, kernel: int, stride: int, padding: int) -> int:
    return (side + 2 * padding - kernel) // stride + 1


def conv_ir(name: str, dtype: str) -> str:
    """The convolution as IREE's torch input writes it: pad, a zero-filled f32 accumulator,
    `linalg.conv_2d_nchw_fchw`, a truncf (f16), in `func @conv(x, w)`."""
    n, c, side, f, k, s, p = CONVS[name]
    o = _out_side(side, k, s, p)
    padded = side + 2 * p
    x_t, w_t = f"tensor<{n}x{c}x{side}x{side}x{dtype}>", f"tensor<{f}x{c}x{k}x{k}x{dtype}>"
    xp_t = f"tensor<{n}x{c}x{padded}x{padded}x{dtype}>"
    acc_t, out_t = f"tensor<{n}x{f}x{o}x{o}xf32>", f"tensor<{n}x{f}x{o}x{o}x{dtype}>"
    narrow = ""
    result, result_t = "%y", acc_t
    if dtype != "f32":
        narrow = f"""
  %ne = tensor.empty() : {out_t}
  %r = linalg.generic {{indexing_maps = [#id, #id], iterator_types = [{PARALLEL4}]}}
      ins(%y : {acc_t}) outs(%ne : {out_t}) {{
  ^bb0(%v: f32, %o: {dtype}):
    %t = arith.truncf %v : f32 to {dtype}
    linalg.yield %t : {dtype}
  }} -> {out_t}"""
        result, result_t = "%r", out_t
    return f"""#id = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
func.func @conv(%x: {x_t}, %w: {w_t}) -> {result_t} {{
  %pz = arith.constant 0.0 : {dtype}
  %xp = tensor.pad %x low[0, 0, {p}, {p}] high[0, 0, {p}, {p}] {{
  ^bb0(%i0: index, %i1: index, %i2: index, %i3: index):
    tensor.yield %pz : {dtype}
  }} : {x_t} to {xp_t}
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : {acc_t}
  %init = linalg.fill ins(%z : f32) outs(%e : {acc_t}) -> {acc_t}
  %y = linalg.conv_2d_nchw_fchw
      {{dilations = dense<1> : vector<2xi64>, strides = dense<{s}> : vector<2xi64>}}
      ins(%xp, %w : {xp_t}, {w_t}) outs(%init : {acc_t}) -> {acc_t}{narrow}
  return {result} : {result_t}
}}
"""


def inputs(name: str) -> tuple[np.ndarray, np.ndarray]:
    """x and w as f16 values (float16 arrays), from numpy seeds: the same on both machines."""
    n, c, side, f, k, _, _ = CONVS[name]
    rng = np.random.default_rng(29)
    x = rng.standard_normal((n, c, side, side), dtype=np.float32).astype(np.float16)
    w = (rng.standard_normal((f, c, k, k), dtype=np.float32) / np.sqrt(c * k * k)).astype(
        np.float16
    )
    return x, w


def prepare(out: Path) -> int:
    import tempfile

    from myelin.compiler.pipeline import compile_module, import_graph
    from myelin.compiler.targets import TargetDevice
    from myelin.kernels import apply_kernels, normalize_contractions

    out.mkdir(parents=True, exist_ok=True)
    gpu = [TargetDevice("gpu", target="cuda")]  # IREE's sm_80 PTX, as a plain CUDA variant
    listing = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in CONVS:
            for form in FORMS:
                dtype = "f32" if form == "iree-f32" else "f16"
                source = Path(tmp) / f"{name}-{dtype}.mlir"
                source.write_text(conv_ir(name, dtype))
                file = f"{name}.{form}.vmfb"
                listing[f"{name}/{form}"] = {"file": file, "dtype": dtype, "module": "g"}
                if form == "iree-no-igemm":  # a codegen flag the in-process API does not take
                    _iree_compile(source, out / file, "--iree-codegen-llvmgpu-use-igemm=false")
                    listing[f"{name}/{form}"]["module"] = "module"
                    continue
                graph = import_graph(source, input_type="auto", module_name="g", scope="g")
                module = graph.module_bytecode
                if form == "im2col-iree":
                    module, counts = normalize_contractions(module)
                    assert counts["convolutions"] == 1, counts
                if form == "kernels":
                    kernelized = apply_kernels(module, library="triton")
                    (site,) = kernelized.sites
                    assert site["kernel"], site
                    module = kernelized.module_bytecode
                compiled = compile_module(module, phase="input", devices=gpu, functions=["conv"])
                (out / file).write_bytes(compiled.vmfb)
                print(f"{name} {form}: {len(compiled.vmfb) / 1024:.0f} KiB", flush=True)
    (out / "listing.json").write_text(json.dumps(listing, indent=1) + "\n")
    return 0


def _iree_compile(source: Path, vmfb: Path, *flags: str) -> None:
    """IREE's own command line on the plain IR, for IREE's sm_80 CUDA code (as PLeX's CUDA
    variant without kernels builds it) with extra codegen flags."""
    import subprocess

    from iree.compiler.tools import binaries

    tool = binaries.find_tool("iree-compile")
    cuda = ("--iree-hal-target-device=cuda", "--iree-cuda-target=sm_80")
    subprocess.run([tool, *cuda, *flags, str(source), "-o", str(vmfb)], check=True)
    print(f"{vmfb.name}: {vmfb.stat().st_size / 1024:.0f} KiB", flush=True)


def _wall_ms(fn, sync, reps: int = 20, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _errors(got: np.ndarray, want: np.ndarray) -> dict:
    got, want = got.astype(np.float64).ravel(), want.astype(np.float64).ravel()
    if not np.isfinite(got).all():
        return {"max_rel_error": float("inf"), "cosine": float("nan")}
    cosine = float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want) + 1e-30))
    return {"max_rel_error": float(np.abs(got - want).max() / np.abs(want).max()), "cosine": cosine}


def run(folder: Path, out: Path) -> int:
    import iree.runtime as rt
    import torch

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    listing = json.loads((folder / "listing.json").read_text())
    device = rt.get_device("cuda")
    rows = []
    for name, (_, _, _, _, _, stride, padding) in CONVS.items():
        x, w = inputs(name)
        tx, tw = torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda()
        want = torch.nn.functional.conv2d(tx.float(), tw.float(), stride=stride, padding=padding)
        want = want.cpu().numpy()
        got = torch.nn.functional.conv2d(tx, tw, stride=stride, padding=padding)
        ms = _wall_ms(
            lambda tx=tx, tw=tw, s=stride, p=padding: torch.nn.functional.conv2d(
                tx, tw, stride=s, padding=p
            ),
            torch.cuda.synchronize,
        )
        rows.append(
            {"conv": name, "form": "torch-f16", **_errors(got.cpu().numpy(), want), "ms": ms}
        )
        for form in FORMS:
            entry = listing[f"{name}/{form}"]
            row = {"conv": name, "form": form}
            try:
                config = rt.Config(device=device)
                vm = rt.VmModule.copy_buffer(
                    config.vm_instance, (folder / entry["file"]).read_bytes()
                )
                context = rt.SystemContext(vm_modules=[vm], config=config)
                fn = getattr(context.modules, entry["module"])["conv"]
                dt = np.float32 if entry["dtype"] == "f32" else np.float16
                dx = rt.asdevicearray(device, x.astype(dt))
                dw = rt.asdevicearray(device, w.astype(dt))
                result = np.asarray(fn(dx, dw).to_host())
                row.update(_errors(result, want))
                row["ms"] = _wall_ms(lambda fn=fn, dx=dx, dw=dw: fn(dx, dw).to_host(), lambda: None)
            except Exception as e:  # recorded; the other forms run
                row["error"] = f"{type(e).__name__}: {e}"[:300]
            rows.append(row)
    print(f"{'convolution':<14} {'form':<14} {'max rel err':>12} {'cosine':>10} {'ms/call':>9}")
    for r in rows:
        if "error" in r:
            print(f"{r['conv']:<14} {r['form']:<14} FAILED {r['error']}")
            continue
        print(
            f"{r['conv']:<14} {r['form']:<14} {r['max_rel_error']:>12.3e} {r['cosine']:>10.6f} "
            f"{r['ms']:>9.3f}"
        )
    (out / "conv_codegen.json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="compile the forms here (IREE compiler, Triton)")
    prep.add_argument("-o", "--out", type=Path, default=FOLDER)
    there = sub.add_parser("run", help="run them on the GPU against torch")
    there.add_argument("--folder", type=Path, default=FOLDER)
    there.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args(argv)
    if args.command == "prepare":
        return prepare(args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    return run(args.folder, args.out)


if __name__ == "__main__":
    sys.exit(main())
