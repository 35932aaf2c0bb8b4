"""Two GPUs of one host: examples/pipeline's decoder pipelined over cuda[0] and cuda[1] vs the
same build's one-GPU variant (prepared for the device kind nvidia-h200-x2; needs two GPUs).

    here:   plex build examples/pipeline/app.toml -o benchmarks/gpu/artifacts/pipeline.mln
    device: python3 benchmarks/probes/gpu/multigpu_h200x2.py \
                --mln benchmarks/gpu/artifacts/pipeline.mln

What it checks and measures, in one run:
1. `two_gpus` (layers 0-1 on gpu0, layers 2-3 and the head on gpu1) and `one_gpu` greedy-decode
   the same prompt for 32 steps: the token ids must be identical (and equal to torch eager on the
   CPU), the logits within 1e-3 of the largest logit (IREE's CUDA code on two GPUs vs one).
2. The moves between the stages (`transfers_by_kind`): every one a peer copy (GPU to GPU), one
   per prefill and one per decode step, none through host memory and none to the host; and the
   bandwidth of a 256 MiB move (buffers from IREE's allocator and from its queue-ordered pool)
   next to torch's cuda:0 -> cuda:1 copy: a move staged through host memory would be several
   times slower than the peer copy.
3. Prefill + decode throughput of both variants: rounds alternate the variants; the table gives
   medians and the spread (min-max) over rounds.
4. With CUDA_VISIBLE_DEVICES=0 (a subprocess): the runtime falls back to `one_gpu`, and asking for
   `two_gpus` is one clear error naming the two devices it needs.

Writes the table to stdout and to $OUT/multigpu_h200x2.md, the raw numbers to
$OUT/multigpu_h200x2.json. Exit status 0 only when every check passed. Needs numpy, torch (for
the eager reference), iree-base-runtime and src/ on PYTHONPATH; no IREE compiler.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
PROMPT = [1, 30, 4, 158, 27, 92, 11, 200, 7, 64, 3, 99, 18, 250, 5, 42]  # 16 tokens
STEPS = 32
STAGES = ("front.prefill", "front.decode", "back.prefill", "back.decode")
VARIANTS = ("two_gpus", "one_gpu")
DEVICES = {"two_gpus": ("gpu0", "gpu1"), "two_cpus": ("cpu0", "cpu1")}  # front's, back's


def pipeline_model():
    folder = ROOT / "examples" / "pipeline"
    spec = importlib.util.spec_from_file_location("pipeline_model", folder / "model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    sys.path.insert(0, str(folder))  # for the llama_model.py beside it
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(folder))
    return module


def greedy(model, pipeline) -> tuple[list[int], list[np.ndarray], float, float]:
    """(ids, logits per step, prefill seconds, decode seconds per token): results stay on their
    GPUs (output="device"); each call returns when its GPU work is done."""
    with model.session() as s:
        calls = [lambda *a, n=n: s.call(n, *a, output="device") for n in STAGES]
        front_prefill, front_decode, back_prefill, back_decode = calls
        start = time.perf_counter()
        hidden, k0, v0 = front_prefill(np.array([PROMPT], dtype=np.int64))
        logits, k1, v1 = back_prefill(hidden)
        logits = [logits.to_host()]
        prefill = time.perf_counter() - start
        ids = []
        start = time.perf_counter()
        for i in range(STEPS):
            token = int(np.argmax(logits[-1][0]))
            ids.append(token)
            if i == STEPS - 1:
                break
            pos = np.array([len(PROMPT) + i], dtype=np.int64)
            hidden, k0, v0 = front_decode(np.array([[token]], dtype=np.int64), pos, k0, v0)
            out, k1, v1 = back_decode(hidden, pos, k1, v1)
            logits.append(out.to_host())
        decode = (time.perf_counter() - start) / (STEPS - 1)
    return ids, logits, prefill, decode


def move_bandwidth(registry, source, target, nbytes: int, pooled: bool, repeats: int) -> float:
    """GB/s of the runtime's move of one `nbytes` device array from `source` to `target` (median
    of `repeats`). `pooled`: the array's buffer comes from the device's queue-ordered pool
    (`queue_alloca`, where IREE's CUDA HAL puts call results), else from its allocator."""
    import iree.runtime as rt

    if pooled:
        ready = source.create_semaphore(0)
        buffer = source.queue_alloca(nbytes, [], [(ready, 1)])
        ready.wait(1)
    else:
        buffer = source.allocator.allocate_buffer(
            memory_type=rt.MemoryType.DEVICE_LOCAL,
            allowed_usage=rt.BufferUsage.DEFAULT,
            allocation_size=nbytes,
        )
    view = rt.HalBufferView(buffer, [nbytes // 4], rt.HalElementType.FLOAT_32)
    array = rt.DeviceArray(source, view, implicit_host_transfer=True, override_dtype=np.float32)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        moved = registry.move(array, target)  # returns once the copy is done
        seconds.append(time.perf_counter() - start)
        del moved
    return nbytes / statistics.median(seconds) / 1e9


def torch_peer_bandwidth(nbytes: int, repeats: int) -> float:
    """GB/s of torch's cuda:0 -> cuda:1 copy (cudaMemcpyPeer with peer access), the reference."""
    import torch

    x = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda:0")
    seconds = []
    for _ in range(repeats):
        torch.cuda.synchronize("cuda:0")
        start = time.perf_counter()
        y = x.to("cuda:1")
        torch.cuda.synchronize("cuda:1")
        seconds.append(time.perf_counter() - start)
        del y
    return nbytes / statistics.median(seconds) / 1e9


FALLBACK_CHECK = """
import sys, myelin
from myelin.errors import DeviceUnavailable
m = myelin.Instance().load(sys.argv[1])
print("chosen:", m.variant_name)
try:
    myelin.Instance().load(sys.argv[1], variant="two_gpus")
    print("two_gpus: loaded (unexpected)")
except DeviceUnavailable as e:
    print("two_gpus:", e)
"""


def fallback_on_one_gpu(mln: Path) -> tuple[bool, str]:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="0")
    run = subprocess.run(
        [sys.executable, "-c", FALLBACK_CHECK, str(mln)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    text = (run.stdout + run.stderr).strip()
    ok = "chosen: one_gpu" in text and "needs 2 'cuda' devices (gpu0, gpu1)" in text
    return ok, text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mln", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--cpu-check",
        action="store_true",
        help="check this script without GPUs: --mln is a build of the same package with "
        "variants two_cpus and one_cpu (tests/myelin/test_pipeline_placement.py's app)",
    )
    args = parser.parse_args(argv)
    out_dir = Path(os.environ.get("OUT", "."))

    import myelin

    two, one, kind = ("two_cpus", "one_cpu", "host") if args.cpu_check else (*VARIANTS, "peer")
    if not args.cpu_check:
        import iree.runtime as rt

        gpus = len(rt.get_driver("cuda").query_available_devices())
        if gpus < 2:
            print(f"this machine has {gpus} GPU(s); the two-GPU run needs 2", file=sys.stderr)
            return 2
    pipeline = pipeline_model()
    instances = {v: myelin.Instance() for v in (two, one)}
    models = {v: instances[v].load(args.mln, variant=v) for v in instances}
    checks: dict[str, bool] = {}
    first = {v: greedy(models[v], pipeline) for v in models}  # also the warm-up
    eager_ids, _ = pipeline.generate(*pipeline.eager(), PROMPT, STEPS)
    checks[f"tokens identical over {STEPS} steps ({two}, {one}, torch eager)"] = (
        first[two][0] == first[one][0] == eager_ids
    )
    err = max(
        float(np.abs(a - b).max() / np.abs(b).max())
        for a, b in zip(first[two][1], first[one][1], strict=True)
    )
    checks[f"logits within 1e-3 of the largest ({two} vs {one})"] = err <= 1e-3
    registry = instances[two].device_registry
    kinds = {k: (c.count, c.bytes) for k, c in registry.transfers_by_kind().items()}
    moves = {k: (c.count, c.bytes) for k, c in registry.transfers.items()}
    checks[f"every move of kind {kind!r}, one per prefill and decode step"] = (
        kinds.keys() == {kind} and kinds[kind][0] == STEPS
    )
    checks[f"{one} moved nothing"] = instances[one].device_registry.transfers == {}

    times: dict[str, dict[str, list[float]]] = {v: {"prefill": [], "decode": []} for v in models}
    for _ in range(args.rounds):
        for v in models:  # interleaved
            _, _, prefill, decode = greedy(models[v], pipeline)
            times[v]["prefill"].append(prefill)
            times[v]["decode"].append(decode)
    # A host bounce shows in the bandwidth of a large move: GPU to GPU over NVLink vs through
    # host memory differ by several times. 256 MiB, buffers from both of IREE's allocation paths.
    nbytes, repeats = 256 << 20, 5
    source, target = (
        models[two].hal_device(DEVICES[two][0]),
        models[two].hal_device(DEVICES[two][1]),
    )
    bandwidth = {
        f"runtime move, {'pool' if pooled else 'allocator'} buffer": move_bandwidth(
            registry, source, target, nbytes, pooled, repeats
        )
        for pooled in (False, True)
    }
    if not args.cpu_check:
        bandwidth["torch cuda:0 -> cuda:1 (peer copy)"] = torch_peer_bandwidth(nbytes, repeats)
        slowest = min(v for k, v in bandwidth.items() if k.startswith("runtime"))
        reference = bandwidth["torch cuda:0 -> cuda:1 (peer copy)"]
        checks["runtime moves at least half torch's peer-copy bandwidth (no host bounce)"] = (
            slowest >= 0.5 * reference
        )
    fallback_text = "(not run: --cpu-check)"
    if not args.cpu_check:
        fallback_ok, fallback_text = fallback_on_one_gpu(args.mln)
        checks["CUDA_VISIBLE_DEVICES=0: falls back to one_gpu; two_gpus refused"] = fallback_ok

    lines = [
        f"examples/pipeline ({pipeline.Config()}), prompt {len(PROMPT)} tokens, {STEPS} decode "
        f"steps, {args.rounds} interleaved rounds; medians (min-max)",
        "",
        "| variant | prefill ms | prefill tokens/s | decode ms/token | decode tokens/s |",
        "|---|---|---|---|---|",
    ]
    for v in models:
        p, d = times[v]["prefill"], times[v]["decode"]
        lines.append(
            f"| {v} | {statistics.median(p) * 1e3:.2f} ({min(p) * 1e3:.2f}-{max(p) * 1e3:.2f}) "
            f"| {len(PROMPT) / statistics.median(p):.0f} "
            f"| {statistics.median(d) * 1e3:.3f} ({min(d) * 1e3:.3f}-{max(d) * 1e3:.3f}) "
            f"| {1 / statistics.median(d):.0f} |"
        )
    lines += ["", f"moves of {two}'s first run by kind (count, bytes): {kinds}"]
    lines += [f"moves by (source, target, method): {moves}"]
    lines += [f"max logits error {two} vs {one}: {err:.2e} of the largest logit", ""]
    lines += [f"move of {nbytes >> 20} MiB, median of {repeats}:"]
    lines += [f"- {name}: {gbs:.1f} GB/s" for name, gbs in bandwidth.items()]
    lines += [""]
    lines += [f"- {'PASS' if ok else 'FAIL'}: {name}" for name, ok in checks.items()]
    lines += ["", "fallback subprocess:", fallback_text]
    table = "\n".join(lines)
    print(table)
    (out_dir / "multigpu_h200x2.md").write_text(table + "\n")
    record = {"times": times, "kinds": kinds, "checks": checks, "logits_error": err}
    record["bandwidth_gbs"] = bandwidth
    record["ids"] = first[two][0]
    (out_dir / "multigpu_h200x2.json").write_text(json.dumps(record, indent=1))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
