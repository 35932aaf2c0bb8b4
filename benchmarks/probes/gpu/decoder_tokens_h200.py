"""The decoder end to end on the GPU: prefill + 32 greedy decode steps, PLeX with the attention
kernels, PLeX untuned and torch eager, on the same GPU in one run.

    python benchmarks/probes/gpu/decoder_tokens_h200.py --mln artifacts/decoder_attention.mln

The .mln is benchmarks/gpu/decoder_attention/app.toml: the decoder (decoder/model.py) built twice,
variant `attention` (`kernels = "triton-attention"`: Triton matmuls, flash attention for the
causal prefill, split-KV attention with the cache's additive mask for decode) and `untuned`
(IREE's own code). Torch runs the same module with the weights read back from the .mln.

One generation: prefill of batch 8 x 512 tokens, its last logits' argmax as the first new token,
then 32 decode steps, each feeding the previous token back (33 new tokens per sequence). All
three do the same host work per step: the logits [8, vocab] come to the host and numpy takes the
argmax, so the tokens are compared without a GPU argmax's tie rules; the KV cache stays on the
GPU (PLeX: device arrays passed back; torch: CUDA tensors).

Checks: the two PLeX builds' tokens must be identical (exit 1 otherwise); torch eager's tokens
are reported next to them (equal, or the first step where they differ). Timing: the whole
generation, and per decode step, in rounds alternating attention / untuned / torch after one
warm-up generation each; medians and min-max over rounds.

Writes decoder_tokens.json and decoder_tokens.md under --out-dir (default $OUT).
Needs numpy, torch with CUDA, iree-base-runtime and src/ on PYTHONPATH; no IREE compiler.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
GPU = HERE.parents[1] / "gpu"  # the models, payload.py and artifacts these scripts read
sys.path[:0] = [str(HERE), str(GPU)]

from decoder_h200 import device_name, load_torch_decoder  # noqa: E402

VARIANTS = ("attention", "untuned")


def plex_generate(prefill, decode, tokens: np.ndarray, steps: int):
    """Greedy generation with one PLeX variant: (new tokens [b, steps + 1], seconds of the whole
    run, seconds per decode step, the first decode step's logits)."""
    prompt = tokens.shape[1]
    start = time.perf_counter()
    logits, k, v = prefill(tokens, output="device")
    out = [np.argmax(logits.to_host(), axis=-1)]
    per_step, first = [], None
    for step in range(steps):
        t0 = time.perf_counter()
        token = out[-1][:, None].astype(np.int64)
        pos = np.array([prompt + step], np.int64)
        logits, k, v = decode(token, pos, k, v, output="device")
        host = logits.to_host()
        out.append(np.argmax(host, axis=-1))
        per_step.append(time.perf_counter() - t0)
        if first is None:
            first = host.astype(np.float32)
    return np.stack(out, 1), time.perf_counter() - start, per_step, first


def torch_generate(model, tokens, steps: int):
    """The same generation in torch eager (tokens a CUDA tensor)."""
    import torch

    prompt = tokens.shape[1]
    start = time.perf_counter()
    logits, k, v = model.prefill(tokens)
    out = [np.argmax(logits.cpu().numpy(), axis=-1)]
    per_step, first = [], None
    for step in range(steps):
        t0 = time.perf_counter()
        token = torch.from_numpy(out[-1][:, None].astype(np.int64)).to(tokens.device)
        pos = torch.tensor([prompt + step], device=tokens.device)
        logits, k, v = model.decode(token, pos, k, v)
        host = logits.cpu().numpy()
        out.append(np.argmax(host, axis=-1))
        per_step.append(time.perf_counter() - t0)
        if first is None:
            first = host.astype(np.float32)
    return np.stack(out, 1), time.perf_counter() - start, per_step, first


def first_difference(a: np.ndarray, b: np.ndarray) -> str:
    if np.array_equal(a, b):
        return "identical"
    cols = np.nonzero((a != b).any(0))[0]
    rows = int((a != b).any(1).sum())
    return f"differ from token {int(cols[0])} on ({rows} of {a.shape[0]} sequences)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mln", type=Path, default=GPU / "artifacts" / "decoder_attention.mln")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--torch-device", default="cuda", help="cpu: a smoke test without GPU")
    out = os.environ.get("OUT")
    parser.add_argument("--out-dir", type=Path, default=Path(out) if out else None)
    args = parser.parse_args(argv)

    import torch

    import myelin

    instance = myelin.Instance()
    models = {name: instance.load(args.mln, variant=name) for name in VARIANTS}
    reference, config = load_torch_decoder(args.mln, args.torch_device)
    cuda = torch.device(args.torch_device)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, config.vocab, (config.batch, config.prompt)).astype(np.int64)
    t_tokens = torch.from_numpy(tokens).to(cuda)

    results: dict = {"tokens": {}, "whole_s": {}, "step_s": {}, "first_s": {}}
    firsts = {}
    sessions = {name: m.session() for name, m in models.items()}
    try:
        calls = {name: (s.resolve("prefill"), s.resolve("decode")) for name, s in sessions.items()}
        runs = {
            name: (lambda c=c: plex_generate(*c, tokens, args.steps)) for name, c in calls.items()
        }
        with torch.inference_mode():
            runs["torch"] = lambda: torch_generate(reference, t_tokens, args.steps)
            for name, run in runs.items():  # warm-up (PTX JIT, allocator pools), and the tokens
                start = time.perf_counter()
                toks, _, _, first = run()
                results["first_s"][name] = time.perf_counter() - start
                results["tokens"][name] = toks.tolist()
                firsts[name] = first
            for name in runs:
                results["whole_s"][name], results["step_s"][name] = [], []
            for _ in range(args.rounds):
                for name, run in runs.items():
                    toks, whole, steps, _ = run()
                    assert toks.tolist() == results["tokens"][name], f"{name}: not deterministic"
                    results["whole_s"][name].append(whole)
                    results["step_s"][name].extend(steps)
    finally:
        for s in sessions.values():
            s.close()

    toks = {name: np.array(t) for name, t in results["tokens"].items()}
    want = firsts["torch"]
    results["first_step_logit_error"] = {
        name: float(np.abs(firsts[name] - want).max() / np.abs(want).max()) for name in VARIANTS
    }
    results["compare"] = {
        "attention vs untuned": first_difference(toks["attention"], toks["untuned"]),
        "attention vs torch": first_difference(toks["attention"], toks["torch"]),
        "untuned vs torch": first_difference(toks["untuned"], toks["torch"]),
    }
    results["prompt"] = list(tokens.shape)
    results["device"] = device_name(args.torch_device)
    results["torch"] = torch.__version__
    results["variants"] = {n: m.variant_name for n, m in models.items()}
    table = summary(results, args)
    print(table)
    if args.out_dir is not None:
        (args.out_dir / "decoder_tokens.json").write_text(json.dumps(results, indent=1) + "\n")
        (args.out_dir / "decoder_tokens.md").write_text(table + "\n")
    return 0 if results["compare"]["attention vs untuned"] == "identical" else 1


def summary(results: dict, args: argparse.Namespace) -> str:
    whole, step = results["whole_s"], results["step_s"]
    t_whole = statistics.median(whole["torch"])
    t_step = statistics.median(step["torch"])
    lines = [
        f"Device: {results['device']}. Torch {results['torch']} eager. Prefill "
        f"{' x '.join(map(str, results['prompt']))} + "
        f"{args.steps} greedy decode steps, {args.rounds} rounds alternating "
        f"{' / '.join(whole)} after one warm-up generation each.",
        "",
        "Tokens: " + "; ".join(f"{k}: {v}" for k, v in results["compare"].items()) + ".",
        "First decode step's logits vs torch (max error / max |logit|): "
        + ", ".join(f"{k} {v:.2e}" for k, v in results["first_step_logit_error"].items()),
        "",
        "| run | whole generation ms (median, min-max) | torch/run | decode step ms (median, "
        "p10-p90) | torch/run | first generation ms (JIT) |",
        "|---|---|---|---|---|---|",
    ]
    for name in whole:
        w, s = whole[name], sorted(step[name])
        p10, p90 = s[len(s) // 10], s[(9 * len(s)) // 10]
        lines.append(
            f"| {name} | {statistics.median(w) * 1e3:.2f} ({min(w) * 1e3:.2f}-"
            f"{max(w) * 1e3:.2f}) | {t_whole / statistics.median(w):.2f}x | "
            f"{statistics.median(s) * 1e3:.3f} ({p10 * 1e3:.3f}-{p90 * 1e3:.3f}) | "
            f"{t_step / statistics.median(s):.2f}x | {results['first_s'][name] * 1e3:.0f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
