"""Weight codecs on the GPU: the float16 decoder's decode step per codec, PLeX (IREE CUDA) side by
side with torch eager float16 on the same GPU, one run.

    python benchmarks/gpu/codecs_h200.py --mln fp16=decoder_fp16.mln --mln int8=decoder_int8.mln \\
                                         --mln q4=decoder_q4.mln [--rounds 7] [--calls 20]

The artifacts are benchmarks/gpu/decoder (float16, batch 8, 576-slot KV cache) built for `cuda`
(sm_80 PTX) with `[weights.codec] "*" = <codec>`; the first `--mln` is the reference (fp16: the
weights as the model has them). Each artifact runs `prefill` on the same random tokens once, then
the timed call is one `decode` step (batch 8, one token each) with the KV caches and logits as
device arrays; the codecs and torch (the same module, the reference's weights, eager) take turns
call by call in a rotated order. Reports the median per call, the spread of the per-round
medians, the ratio to the reference and to torch, and each decode step's logits against the
reference's (cosine, max relative error) and the reference's against torch.

Needs numpy, torch with CUDA, iree-base-runtime and src/ on PYTHONPATH; no IREE compiler.
Writes the table to stdout and to --out (default: $OUT/codecs_h200.md when $OUT is set).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from decoder_h200 import device_name, load_torch_decoder  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mln", action="append", required=True, help="NAME=PATH, reference first")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20, help="timed calls per runner per round")
    out_default = Path(os.environ["OUT"]) / "codecs_h200.md" if os.environ.get("OUT") else None
    parser.add_argument("--out", type=Path, default=out_default)
    args = parser.parse_args(argv)
    artifacts = dict(item.split("=", 1) for item in args.mln)
    table = measure({name: Path(path) for name, path in artifacts.items()}, args)
    print(table)
    if args.out is not None:
        args.out.write_text(table + "\n")
    return 0


def measure(artifacts: dict[str, Path], args: argparse.Namespace) -> str:
    import torch

    import myelin

    names = list(artifacts)
    reference_name = names[0]
    with contextlib.ExitStack() as stack:
        models = {n: myelin.Instance().load(p) for n, p in artifacts.items()}
        sessions = {n: stack.enter_context(m.session()) for n, m in models.items()}
        first = sessions[reference_name].resolve("prefill")
        batch, prompt = first.signature.inputs[0].shape
        vocab = first.signature.outputs[0].shape[-1]
        rng = np.random.default_rng(0)
        tokens = rng.integers(0, vocab, (batch, prompt)).astype(np.int64)
        token = rng.integers(0, vocab, (batch, 1)).astype(np.int64)
        pos = np.array([prompt], np.int64)
        runners, logits = {}, {}
        for n, s in sessions.items():
            prefill, decode = s.resolve("prefill"), s.resolve("decode")
            _, k, v = prefill(tokens, output="device")

            def step(decode=decode, k=k, v=v):
                return decode(token, pos, k, v, output="device")

            logits[n] = np.asarray(step()[0].to_host()).astype(np.float32)
            runners[n] = (step, lambda: None)
        module, _ = load_torch_decoder(artifacts[reference_name], "cuda")
        cuda = torch.device("cuda")
        t_tokens, t_token = torch.from_numpy(tokens).to(cuda), torch.from_numpy(token).to(cuda)
        t_pos = torch.from_numpy(pos).to(cuda)
        with torch.inference_mode():
            _, t_k, t_v = module.prefill(t_tokens)
            torch_logits = module.decode(t_token, t_pos, t_k, t_v)[0].float().cpu().numpy()
            runners["torch fp16"] = (
                lambda: module.decode(t_token, t_pos, t_k, t_v),
                torch.cuda.synchronize,
            )
            order = list(runners)
            for fn, sync in runners.values():  # warm-up: PTX JIT, allocator pools
                for _ in range(3):
                    fn()
                sync()
            per_round: dict[str, list[float]] = {n: [] for n in order}
            for r in range(args.rounds):
                turn = order[r % len(order) :] + order[: r % len(order)]
                times: dict[str, list[float]] = {n: [] for n in order}
                for _ in range(args.calls):
                    for n in turn:
                        fn, sync = runners[n]
                        start = time.perf_counter()
                        fn()
                        sync()
                        times[n].append(time.perf_counter() - start)
                for n in order:
                    per_round[n].append(statistics.median(times[n]))
        reference = logits[reference_name]

        def against(got: np.ndarray, want: np.ndarray) -> str:
            cos = float((got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want))
            return f"{cos:.6f} / {np.abs(got - want).max() / np.abs(want).max():.2e}"

        lines = [
            f"Device: {device_name('cuda')}. PLeX: MyeLiN runtime, IREE 3.13, CUDA (sm_80 PTX). "
            f"Torch {torch.__version__} eager float16. Decode step, batch {batch}, KV cache after "
            f"a {prompt}-token prefill; {args.rounds} rounds x {args.calls} calls per runner, "
            "taking turns call by call.",
            "",
            f"Reference ({reference_name}) vs torch, decode logits: cosine / max rel. error "
            + against(reference, torch_logits),
            "",
            f"| runner | median ms | spread ms | vs {reference_name} (spread) | vs torch (spread) "
            f"| logits vs {reference_name}: cosine / max rel. error |",
            "|---|---|---|---|---|---|",
        ]
        for n in order:
            ms = [t * 1e3 for t in per_round[n]]
            ref = [a / b for a, b in zip(per_round[n], per_round[reference_name], strict=True)]
            tor = [a / b for a, b in zip(per_round[n], per_round["torch fp16"], strict=True)]
            numerics = against(logits[n], reference) if n in logits else "-"
            lines.append(
                f"| {n} | {statistics.median(ms):.3f} | {min(ms):.3f}-{max(ms):.3f} "
                f"| {statistics.median(ref):.2f}x ({min(ref):.2f}-{max(ref):.2f}) "
                f"| {statistics.median(tor):.2f}x ({min(tor):.2f}-{max(tor):.2f}) | {numerics} |"
            )
        runners.clear()
        del k, v, step
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
