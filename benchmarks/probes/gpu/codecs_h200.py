"""Weight codecs on the GPU: the float16 decoder's decode step per codec, PLeX (IREE CUDA) side by
side with torch eager float16 on the same GPU, one run.

    python benchmarks/probes/gpu/codecs_h200.py --mln fp16=decoder_fp16.mln \\
                                         --mln int8=decoder_int8.mln \\
                                         --mln q4=decoder_q4.mln [--rounds 7] [--calls 20] \\
                                         [--entry decode --entry decode1] [--decoded q4]

The artifacts are benchmarks/gpu/decoder (float16, batch 8, 576-slot KV cache) built for `cuda`
(sm_80 PTX) with `[weights.codec] "*" = <codec>`; the first `--mln` is the reference (fp16: the
weights as the model has them). Each artifact runs `prefill` on the same random tokens once, then
the timed call is one `decode` step (batch 8, one token each) with the KV caches and logits as
device arrays; the codecs and torch (the same module, the reference's weights, eager) take turns
call by call in a rotated order. Reports the median per call, the spread of the per-round
medians, the ratio to the reference and to torch, and each decode step's logits against the
reference's (cosine, max relative error) and the reference's against torch.

`--entry` names the decode entrypoints to time, one table each (benchmarks/gpu/decoder7b has
`decode`, batch 8, and `decode1`, batch 1: that one starts from zero caches, stepped once, as
every runner does). Each table gives the bytes a step reads (every stored parameter but the
gathered embedding table, plus the KV caches) and the rate that makes. `--decoded NAME` adds a
numerics-only reference: torch eager with artifact NAME's weights decoded from its stored parts
(numpy), so that NAME's logits are compared with the same quantized weights, not only with fp16.

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
GPU = HERE.parents[1] / "gpu"  # the models, payload.py and artifacts these scripts read
sys.path[:0] = [str(HERE), str(GPU)]
from decoder_h200 import device_name, load_torch_decoder  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mln", action="append", required=True, help="NAME=PATH, reference first")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20, help="timed calls per runner per round")
    parser.add_argument("--entry", action="append", help="decode entrypoints to time (decode)")
    parser.add_argument(
        "--decoded", help="also compare with torch on this artifact's decoded weights"
    )
    out_default = Path(os.environ["OUT"]) / "codecs_h200.md" if os.environ.get("OUT") else None
    parser.add_argument("--out", type=Path, default=out_default)
    args = parser.parse_args(argv)
    artifacts = dict(item.split("=", 1) for item in args.mln)
    table = measure({name: Path(path) for name, path in artifacts.items()}, args)
    print(table)
    if args.out is not None:
        args.out.write_text(table + "\n")
    return 0


def stored_bytes(mln: Path) -> int:
    """Bytes of every stored parameter but the gathered embedding table (a step reads its rows)."""
    from myelin.mln import MlnReader

    with MlnReader(mln) as reader:
        records = reader.manifest["parameters"]
    return sum(p["length"] for p in records if p.get("of", p["key"]) != "embed.weight")


def decoded_weights(mln: Path) -> dict[str, np.ndarray]:
    """Every parameter of `mln` as the graph reads it, encoded ones decoded in numpy."""
    from myelin.codecs import choose_layout, decode
    from myelin.mln import MlnReader

    with MlnReader(mln) as reader:
        records = {p["key"]: p for p in reader.manifest["parameters"]}

        def raw(r: dict) -> np.ndarray:
            view = reader.section_view(r["section"])[r["offset"] : r["offset"] + r["length"]]
            dtype = r.get("storage", {}).get("dtype", r["dtype"]).replace("uint4", "uint8")
            return np.frombuffer(view, np.dtype(dtype)).copy()

        out = {}
        for key, r in records.items():
            if "of" in r:
                continue
            if r.get("codec", "none") in ("none", "fp32"):
                out[key] = raw(r).view(r["dtype"]).reshape(r["shape"])
                continue
            layout = choose_layout(
                r["codec"],
                tuple(r["shape"]),
                r["dtype"],
                tuple(r["reduce_axes"]),
                tuple(r["order"]),
            )
            parts = [raw(records[key + part.suffix]) for part in layout.parts]
            out[key] = decode(parts, layout).astype(r["dtype"])
    return out


def measure(artifacts: dict[str, Path], args: argparse.Namespace) -> str:
    """One table per decode entrypoint; the artifacts and torch modules are loaded once."""
    import torch

    import myelin

    with contextlib.ExitStack() as stack:
        models = {n: myelin.Instance().load(p) for n, p in artifacts.items()}
        sessions = {n: stack.enter_context(m.session()) for n, m in models.items()}
        reference_name = next(iter(artifacts))
        references = {"torch fp16": load_torch_decoder(artifacts[reference_name], "cuda")[0]}
        if args.decoded:
            module = references["torch fp16"]
            decoded = decoded_weights(artifacts[args.decoded])
            twin = type(module)(module.c).to(module.c.dtype)
            known = set(twin.state_dict())
            twin.load_state_dict(
                {k: torch.from_numpy(a) for k, a in decoded.items() if k in known}, strict=True
            )
            references[f"torch fp16, {args.decoded} weights decoded"] = twin.to("cuda").eval()
            del decoded
        tables = [
            measure_entry(artifacts, sessions, references, args, entry)
            for entry in (args.entry or ["decode"])
        ]
        references.clear()
    return "\n\n".join(tables)


def measure_entry(
    artifacts: dict[str, Path], sessions: dict, references: dict, args: argparse.Namespace,
    entry: str,
) -> str:  # fmt: skip
    import torch

    names = list(artifacts)
    reference_name = names[0]
    first = sessions[reference_name].resolve("prefill")
    prompt = first.signature.inputs[0].shape[1]
    vocab = first.signature.outputs[0].shape[-1]
    cache_shape = sessions[reference_name].resolve(entry).signature.inputs[2].shape
    batch = cache_shape[1]
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, vocab, first.signature.inputs[0].shape).astype(np.int64)
    token = rng.integers(0, vocab, (batch, 1)).astype(np.int64)
    pos = np.array([prompt], np.int64)
    zeros = np.zeros(cache_shape, np.float16)  # the benchmark's decoders are float16
    runners, logits = {}, {}
    for n, s in sessions.items():
        decode = s.resolve(entry)
        if entry == "decode":
            _, k, v = s.resolve("prefill")(tokens, output="device")
        else:  # zero caches, stepped once: device arrays, as the timed step takes them
            _, k, v = decode(token, pos, zeros, zeros, output="device")

        def step(decode=decode, k=k, v=v):
            return decode(token, pos, k, v, output="device")

        logits[n] = np.asarray(step()[0].to_host()).astype(np.float32)
        runners[n] = (step, lambda: None)
    cuda = torch.device("cuda")
    t_tokens, t_token = torch.from_numpy(tokens).to(cuda), torch.from_numpy(token).to(cuda)
    t_pos = torch.from_numpy(pos).to(cuda)
    t_zeros = torch.from_numpy(zeros).to(cuda)
    torch_logits = {}
    with torch.inference_mode():
        for label, module in references.items():
            if entry == "decode":
                _, t_k, t_v = module.prefill(t_tokens)
            else:
                _, t_k, t_v = module.decode(t_token, t_pos, t_zeros, t_zeros.clone())
            torch_logits[label] = module.decode(t_token, t_pos, t_k, t_v)[0].float().cpu()
            torch_logits[label] = torch_logits[label].numpy()
            if label == "torch fp16":
                runners[label] = (
                    lambda m=module, k=t_k, v=t_v: m.decode(t_token, t_pos, k, v),
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

    cache_bytes = 2 * int(np.prod(cache_shape)) * 2
    cache_state = f"after a {prompt}-token prefill" if entry == "decode" else "zeros, stepped once"
    read = {n: stored_bytes(p) + cache_bytes for n, p in artifacts.items()}
    read["torch fp16"] = read[reference_name]
    lines = [
        f"Device: {device_name('cuda')}. PLeX: MyeLiN runtime, IREE 3.13, CUDA (sm_80 PTX, "
        f"the kernel library's sm_90a cubins where the build put them). Torch "
        f"{torch.__version__} eager float16. `{entry}` step, batch {batch}, KV cache "
        f"{list(cache_shape)} ({cache_state}); "
        f"{args.rounds} rounds x {args.calls} calls per runner, taking turns call by call. "
        "Bytes per step: stored parameters but the embedding table, plus both KV caches.",
        "",
        f"Reference ({reference_name}) vs torch, logits: cosine / max rel. error "
        + against(reference, torch_logits["torch fp16"]),
    ]
    for label, value in torch_logits.items():
        if label != "torch fp16":
            for n in names[1:]:
                lines.append(
                    f"{n} vs {label}: cosine / max rel. error " + against(logits[n], value)
                )
    lines += [
        "",
        f"| runner | median ms | spread ms | MB read per step | GB/s | vs {reference_name} "
        f"(spread) | vs torch (spread) | logits vs {reference_name}: cosine / max rel. error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n in order:
        ms = [t * 1e3 for t in per_round[n]]
        ref = [a / b for a, b in zip(per_round[n], per_round[reference_name], strict=True)]
        tor = [a / b for a, b in zip(per_round[n], per_round["torch fp16"], strict=True)]
        numerics = against(logits[n], reference) if n in logits else "-"
        median = statistics.median(ms)
        lines.append(
            f"| {n} | {median:.3f} | {min(ms):.3f}-{max(ms):.3f} | {read[n] / 1e6:.1f} "
            f"| {read[n] / median / 1e6:.0f} "
            f"| {statistics.median(ref):.2f}x ({min(ref):.2f}-{max(ref):.2f}) "
            f"| {statistics.median(tor):.2f}x ({min(tor):.2f}-{max(tor):.2f}) | {numerics} |"
        )
    runners.clear()
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
