"""The decoder on the GPU: PLeX (MyeLiN runtime, IREE CUDA) vs torch eager, same GPU, one run.

    python benchmarks/probes/gpu/decoder_h200.py --mln benchmarks/gpu/artifacts/decoder.mln

The decoder is benchmarks/gpu/decoder/model.py (examples/llama's architecture, float16): prefill
of batch 8 x 512 tokens, and one decode step of batch 8 against the 576-slot KV cache. Torch runs
the same module with the weights read back from the .mln, so both compute the same function; the
script checks that their logits agree before timing.

Timing: every call is synchronous (PLeX's calls return when the GPU is done; torch calls are
followed by torch.cuda.synchronize()), calls alternate PLeX / torch in rounds, and the table
gives the median per-call time of each, the ratio torch / PLeX (below 1: PLeX is slower) and the
spread of that ratio over rounds. Inputs stay on the GPU for both (PLeX: device arrays from
prefill; torch: CUDA tensors); only PLeX's token ids (32 KiB) are uploaded per call.

Writes the table to stdout and to --out (default: $OUT/decoder_h200.md when $OUT is set).
Needs numpy, torch with CUDA, iree-base-runtime and src/ on PYTHONPATH; no IREE compiler.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
GPU = HERE.parents[1] / "gpu"  # the models, payload.py and artifacts these scripts read


def load_torch_decoder(mln: Path, device: str = "cuda"):
    """The torch module of the decoder in `mln`, with its configuration read from the .mln's
    signatures and parameter shapes and the weights it stores (by their torch names; the .mln also
    holds the rotary frequencies, a buffer torch computes itself)."""
    import torch

    from myelin.mln import MlnReader

    sys.path.insert(0, str(GPU / "decoder"))
    from model import Config, Decoder

    arrays: dict[str, np.ndarray] = {}
    with MlnReader(mln) as reader:
        manifest = reader.manifest
        for p in manifest["parameters"]:
            view = reader.section_view(p["section"])[p["offset"] : p["offset"] + p["length"]]
            arrays[p["key"]] = np.frombuffer(view, np.dtype(p["dtype"])).reshape(p["shape"]).copy()
    entries = {e["name"]: e for e in manifest["variants"][0]["entrypoints"]}
    layers, batch, kv_heads, max_len, head_dim = entries["decode"]["inputs"][2]["shape"]
    vocab, dim = arrays["embed.weight"].shape
    config = Config(
        vocab=vocab,
        dim=dim,
        layers=layers,
        heads=dim // head_dim,
        kv_heads=kv_heads,
        ffn=arrays["blocks.0.w_gate.weight"].shape[0],
        batch=batch,
        prompt=entries["prefill"]["inputs"][0]["shape"][1],
        max_len=max_len,
        dtype=getattr(torch, str(arrays["embed.weight"].dtype)),
    )
    module = Decoder(config).to(config.dtype)
    names = set(module.state_dict())
    state = {k: torch.from_numpy(a) for k, a in arrays.items() if k in names}
    module.load_state_dict(state, strict=True)
    return module.to(device).eval(), config


def device_name(torch_device: str) -> str:
    import torch

    if torch_device == "cuda":
        return torch.cuda.get_device_name(0)
    return f"torch on {torch_device}"


def timed(fn, sync) -> float:
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mln", type=Path, default=GPU / "artifacts" / "decoder.mln")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--prefill-calls", type=int, default=5)
    parser.add_argument("--decode-calls", type=int, default=30)
    parser.add_argument(
        "--once", action="store_true", help="one PLeX prefill and decode, no torch (for a profiler)"
    )
    out_default = Path(os.environ["OUT"]) / "decoder_h200.md" if os.environ.get("OUT") else None
    parser.add_argument("--out", type=Path, default=out_default)
    parser.add_argument("--torch-device", default="cuda", help="cpu: a smoke test without GPU")
    args = parser.parse_args(argv)

    import myelin

    model = myelin.Instance().load(args.mln)
    # Every device array lives inside `measure`: IREE buffers must go before their device does.
    table, ok = measure(model, args)
    print(table)
    if args.out is not None and table:
        args.out.write_text(table + "\n")
    return 0 if ok else 1


def measure(model, args: argparse.Namespace) -> tuple[str, bool]:
    """Check PLeX against torch, then time both; returns the table and whether they agree."""
    import torch

    with model.session() as session:
        prefill, decode = session.resolve("prefill"), session.resolve("decode")
        batch, prompt = prefill.signature.inputs[0].shape
        vocab = prefill.signature.outputs[0].shape[-1]
        rng = np.random.default_rng(0)
        tokens = rng.integers(0, vocab, (batch, prompt)).astype(np.int64)
        token = rng.integers(0, vocab, (batch, 1)).astype(np.int64)
        pos = np.array([prompt], np.int64)

        start = time.perf_counter()
        logits, k, v = prefill(tokens, output="device")
        first_prefill = time.perf_counter() - start
        start = time.perf_counter()
        step_logits = decode(token, pos, k, v, output="device")[0]
        first_decode = time.perf_counter() - start
        if args.once:
            ms = f"first prefill {first_prefill * 1e3:.1f} ms, decode {first_decode * 1e3:.1f} ms"
            return ms, True

        reference, _ = load_torch_decoder(args.mln, args.torch_device)
        cuda = torch.device(args.torch_device)
        sync = torch.cuda.synchronize if cuda.type == "cuda" else (lambda: None)
        t_tokens = torch.from_numpy(tokens).to(cuda)
        t_token, t_pos = torch.from_numpy(token).to(cuda), torch.from_numpy(pos).to(cuda)
        with torch.inference_mode():
            t_logits, t_k, t_v = reference.prefill(t_tokens)
            t_step_logits = reference.decode(t_token, t_pos, t_k, t_v)[0]
            sync()
            errors = {}
            for name, got, want in (
                ("prefill logits", logits.to_host(), t_logits),
                ("decode logits", step_logits.to_host(), t_step_logits),
            ):
                want = want.float().cpu().numpy()
                error = np.abs(got.astype(np.float32) - want).max() / np.abs(want).max()
                errors[name] = float(error)

            cases = {
                f"prefill {batch}x{prompt}": (
                    lambda: prefill(tokens, output="device"),
                    lambda: reference.prefill(t_tokens),
                    args.prefill_calls,
                    batch * prompt,
                ),
                f"decode step {batch}x1": (
                    lambda: decode(token, pos, k, v, output="device"),
                    lambda: reference.decode(t_token, t_pos, t_k, t_v),
                    args.decode_calls,
                    batch,
                ),
            }
            for plex_fn, torch_fn, _, _ in cases.values():  # warm-up: JIT, allocator pools
                for _ in range(3):
                    plex_fn()
                    torch_fn()
            sync()
            times = {c: {"plex": [], "torch": []} for c in cases}
            ratios: dict[str, list[float]] = {c: [] for c in cases}
            for _ in range(args.rounds):
                for case, (plex_fn, torch_fn, calls, _) in cases.items():
                    round_plex, round_torch = [], []
                    for _ in range(calls):  # alternate call by call
                        round_plex.append(timed(plex_fn, lambda: None))
                        round_torch.append(timed(torch_fn, sync))
                    times[case]["plex"].extend(round_plex)
                    times[case]["torch"].extend(round_torch)
                    ratio = statistics.median(round_torch) / statistics.median(round_plex)
                    ratios[case].append(ratio)

    lines = [
        f"Device: {device_name(args.torch_device)}. PLeX: MyeLiN runtime, IREE 3.13, variant "
        f"'{model.variant_name}' ({', '.join(d['target'] for d in model.variant['devices'])}). "
        f"Torch {torch.__version__} eager, {str(reference.c.dtype).removeprefix('torch.')}. "
        f"{args.rounds} rounds, calls alternating PLeX / torch.",
        "",
        f"First calls (include the driver's PTX JIT): prefill {first_prefill * 1e3:.0f} ms, "
        f"decode {first_decode * 1e3:.0f} ms. PLeX vs torch (max error / max |logit|): "
        + ", ".join(f"{name} {e:.2e}" for name, e in errors.items()),
        "",
        "| case | PLeX median ms | torch median ms | torch/PLeX (median) | spread (min-max) "
        "| PLeX tokens/s | torch tokens/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for case, (_, _, _, tokens_per_call) in cases.items():
        p = statistics.median(times[case]["plex"])
        t = statistics.median(times[case]["torch"])
        lines.append(
            f"| {case} | {p * 1e3:.3f} | {t * 1e3:.3f} | {statistics.median(ratios[case]):.3f}x "
            f"| {min(ratios[case]):.3f}-{max(ratios[case]):.3f} | {tokens_per_call / p:,.0f} "
            f"| {tokens_per_call / t:,.0f} |"
        )
    return "\n".join(lines), all(e < 2e-2 for e in errors.values())


if __name__ == "__main__":
    sys.exit(main())
