"""Generation on the GPU: PLeX's Generator against transformers' `generate` (eager, and with its
static cache and torch.compile) on the same seeded weights, the same GPU, one process.

    python3 benchmarks/gpu/llm/run_llm.py --artifacts benchmarks/gpu/artifacts/llm --out OUT

First, before CUDA is touched (payload.rebuild forks its encoders), each family's Hugging Face
folder is written from the seed (models.py) and every build's .mln rebuilt from its skeleton
with the weights the causal-lm frontend reads from that folder: each section's SHA-256 must
equal the one recorded at build time (`weights_as_built`; a mismatch is reported and the build
is not timed). Then per build (one family, one batch = the build's max_batch):

- prompts: `batch` rows of 512 token ids from numpy's seed (models.prompt_ids); 128 new tokens,
  greedy, never stopping at EOS, on every side;
- PLeX: `myelin.runtime.generation.Generator` over the loaded .mln; time to first token and
  decode time are the Generator's own (`Generation.time_to_first_token_s`, `timings`);
- transformers eager: `model.generate(ids, attention_mask=ones, max_new_tokens=128,
  do_sample=False)` with its default dynamic cache, the model loaded with
  `from_pretrained(folder, dtype=float16, attn_implementation="sdpa")`;
- transformers compiled: the same call with `cache_implementation="static"`, which makes
  `generate` compile the decode step itself (`generation_config.compile_config`, recorded in the
  output: torch.compile, inductor, mode "reduce-overhead"); skipped with the reason if it fails.
  A streamer stamps each token on the host, so time to first token is the prompt's forward
  plus the first token's choice, as for PLeX, and decode time runs from the first to the last.
- rounds interleave the runners (PLeX, eager, compiled, PLeX, ...), after one warm-up each
  (two for compiled: compilation and CUDA-graph capture); medians over rounds;
- greedy tokens: per row, the first position where PLeX's tokens differ from each
  transformers runner's (float16 on both sides: a divergence is expected at some point), and
  at each divergence the float32 model's preference between the two tokens, teacher-forced on
  the shared prefix (`divergence_fp32`: a near tie, or a defect).

Writes `OUT/llm.json` (a benchmarks/results.py run, suite "gpu": cases `llm-<build>-ttft` and
`llm-<build>-decode-step`, in ms, samples per round; each transformers row's check: the first
AGREE_FIRST greedy tokens equal to PLeX's on every row), `OUT/llm-raw.json` (every number, each
row's first divergence) and `OUT/llm.md` (the table).
`--device cpu` runs the same against a CPU build of the small models (build.py --size small
--target cpu), to check the script where there is no GPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))
import models  # noqa: E402

from benchmarks import results  # noqa: E402
from benchmarks.causal_lm import rows_first_divergence, transformers_generation  # noqa: E402
from benchmarks.gpu import payload  # noqa: E402

RUNNERS = ("PLeX", "PLeX, host picks", "transformers eager", "transformers compiled")
# The results' token check: every row's first AGREE_FIRST greedy tokens equal on both sides.
# Both compute in float16 with different kernels, so later tokens may differ where two logits
# are within rounding of each other (the raw output has each row's first divergence).
AGREE_FIRST = 16


@dataclass(frozen=True)
class Settings:
    """What a run measures: the issue's generation (prompt 512, 128 new tokens) by default."""

    device: str = "cuda"  # or "cpu": the small builds, to check the script without a GPU
    rounds: int = 5
    prompt: int = 512
    new: int = 128
    compile: bool = True  # transformers compiled (static cache + torch.compile)
    builds: tuple[str, ...] = ()  # a subset of llm.json's builds (empty: all)
    families: tuple[str, ...] = ()  # a subset of families (empty: all)
    # Builds not started by this many seconds after the start are skipped (reported), so the
    # results are written before the device call's limit (600 s) ends the process.
    budget_s: float = 420.0


def rebuild_all(index: dict, artifacts: Path, work: Path) -> dict[str, dict]:
    """Each family's folder from the seed, and each build's .mln from it: {build: status}."""
    status: dict[str, dict] = {}
    families = sorted({b["family"] for b in index["builds"]})
    for family in families:
        builds = [b for b in index["builds"] if b["family"] == family]
        start = time.perf_counter()
        folder = models.write_folder(work / family, family, index["size"], builds[0]["layers"])
        for dtype in sorted({b.get("dtype", "float32") for b in builds}):
            _rebuild_family(
                [b for b in builds if b.get("dtype", "float32") == dtype],
                models.frontend_values(folder, dtype),
                artifacts,
                work,
                status,
            )
            gc.collect()
        print(f"{family}: {time.perf_counter() - start:.1f} s", flush=True)
    return status


def _rebuild_family(
    builds: list[dict], values: dict, artifacts: Path, work: Path, status: dict
) -> None:
    """Each build's .mln from one family's values (one dtype), into `status`."""
    for b in builds:
        mln = work / f"{b['name']}.mln"
        try:
            differ = payload.rebuild(artifacts / b["name"] / "skeleton", mln, lambda v=values: v)
            status[b["name"]] = {"weights_as_built": not differ, "sections_differ": differ[:5]}
        except Exception as e:  # reported; the other builds go on
            status[b["name"]] = {"weights_as_built": False, "error": f"{type(e).__name__}: {e}"}
        status[b["name"]]["mln"] = str(mln)
        print(f"{b['name']}: {status[b['name']]}", flush=True)


# The runner of PLeX's Generator with greedy picks on the host (`device_picks=False`): what the
# device's picks, and the decode queued ahead on them, gain.
HOST_PICKS = RUNNERS[1]


def plex_runner(generator, prompts: list[list[int]], new: int):
    def run():
        r = generator.generate(prompts, max_new_tokens=new, use_eos=False)
        return r.time_to_first_token_s, r.timings["decode_s"], r.tokens

    return run


def explain_divergences(
    folder: Path, prompt, tokens: dict[str, list[list[int]]], row: dict, device: str
) -> list[dict]:
    """At each row's first divergence between PLeX and a transformers runner, the float32
    model's next-token logits teacher-forced on the prefix both sides share: which of the two
    tokens float32 prefers and by how much. A margin within float16's rounding of the logits
    (~1e-2 here) is a near tie either side may break; a wide one that float32 settles against
    PLeX would be a defect."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="sdpa", local_files_only=True
    )
    model = model.eval().to(device)
    found = []
    for name, rows in row["first_divergence"].items():
        for r, d in enumerate(rows):
            if d is None or d >= len(tokens["PLeX"][r]) or d >= len(tokens[name][r]):
                continue
            ids = list(prompt[r]) + tokens["PLeX"][r][:d]
            with torch.no_grad():
                logits = model(torch.tensor([ids], device=device)).logits[0, -1].float()
            ours, theirs = tokens["PLeX"][r][d], tokens[name][r][d]
            top = torch.topk(logits, 2)
            found.append(
                {
                    "against": name,
                    "row": r,
                    "position": d,
                    "plex_token": ours,
                    "other_token": theirs,
                    "fp32_argmax": int(top.indices[0]),
                    "fp32_logit_plex_minus_other": float(logits[ours] - logits[theirs]),
                    "fp32_top2_margin": float(top.values[0] - top.values[1]),
                }
            )
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return found


def run_build(build: dict, mln: Path, folder: Path, args: Settings) -> dict:
    """Every runner on one build, interleaved; {runner: {ttft_s, decode_step_s, tokens...}}."""
    import torch
    from transformers import AutoModelForCausalLM

    import myelin
    from myelin.runtime.generation import Generator

    on_gpu = args.device == "cuda"
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    batch, new = build["batch"], args.new
    vocab = models.config(build["family"], build["size"], build["layers"]).vocab_size
    prompt = models.prompt_ids(batch, args.prompt, vocab)
    dtype = torch.float16 if on_gpu else torch.float32
    hf = AutoModelForCausalLM.from_pretrained(
        folder, dtype=dtype, attn_implementation="sdpa", local_files_only=True
    )
    hf = hf.eval().to(args.device)
    hf.generation_config.eos_token_id = None  # never stop early, as PLeX's use_eos=False
    hf.generation_config.pad_token_id = 0
    ids = torch.from_numpy(prompt).to(args.device)
    row: dict = {"batch": batch, "prompt": args.prompt, "new": new, "hf_dtype": str(dtype)}

    instance = myelin.Instance()
    loaded = instance.load(mln)
    generator = Generator(loaded)
    # the prefill the Generator picks for this batch: `prefill_<n>` where the build has a static
    # length that holds the prompt (build.py asks for the prompt's), else the dynamic one
    fits = [n for n in generator.prefill_lengths if n >= args.prompt]
    row["plex_prefill"] = f"prefill_{fits[0]}" if fits else "prefill"
    runners = {"PLeX": plex_runner(generator, prompt.tolist(), new)}
    warmups = {"PLeX": 1}
    host_picks = None
    if generator.greedy_tokens:  # the same model, greedy picks on the host, one call at a time
        host_picks = Generator(loaded, device_picks=False)
        runners[HOST_PICKS] = plex_runner(host_picks, prompt.tolist(), new)
        warmups[HOST_PICKS] = 1
    runners["transformers eager"] = transformers_generation(hf, ids, new, sync)
    warmups["transformers eager"] = 1
    if not args.compile:
        row["compiled_skipped"] = "not asked (--no-compile)"
    else:
        compiled = transformers_generation(hf, ids, new, sync, cache_implementation="static")
        try:
            compiled()  # compiles; a failure skips the runner
            runners["transformers compiled"] = compiled
            warmups["transformers compiled"] = 1
            from transformers import CompileConfig

            # generate uses a default CompileConfig where the model's config sets none
            config = hf.generation_config.compile_config or CompileConfig()
            row["compile_config"] = {k: str(v) for k, v in config.to_dict().items()}
            if not on_gpu:
                row["compiled_note"] = "transformers compiles on CUDA only: a static cache here"
        except Exception as e:
            first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
            row["compiled_skipped"] = f"{type(e).__name__}: {first}"
    tokens: dict[str, list[list[int]]] = {}
    for name in list(runners):
        if name not in runners:  # the host picks, taken over as PLeX below
            continue
        try:
            for _ in range(warmups[name]):
                _, _, tokens[name] = runners[name]()
        except Exception as e:
            if name != "PLeX" or HOST_PICKS not in runners:
                raise
            # the device's picks failed: say so, and time the host's picks as PLeX
            row["device_picks_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            runners["PLeX"] = runners.pop(HOST_PICKS)
            _, _, tokens["PLeX"] = runners["PLeX"]()
    samples: dict[str, dict[str, list[float]]] = {n: {"ttft": [], "step": []} for n in runners}
    for _ in range(args.rounds):
        for name, run in runners.items():
            ttft, decode_s, toks = run()
            samples[name]["ttft"].append(ttft * 1e3)
            samples[name]["step"].append(decode_s / (new - 1) * 1e3)
            tokens[name] = toks
    generator.close()
    if host_picks is not None:
        host_picks.close()
    del generator, host_picks, loaded, instance, hf
    gc.collect()
    if on_gpu:
        torch.cuda.empty_cache()
    row["samples_ms"] = samples
    row["median"] = {
        name: {
            "ttft_ms": statistics.median(s["ttft"]),
            "decode_step_ms": statistics.median(s["step"]),
            "decode_tok_s": batch * 1e3 / statistics.median(s["step"]),
        }
        for name, s in samples.items()
    }
    plex = row["median"]["PLeX"]
    row["ratios"] = {
        name: {
            "decode_tok_s_plex_over": plex["decode_tok_s"] / m["decode_tok_s"],
            "ttft_plex_over": plex["ttft_ms"] / m["ttft_ms"],
        }
        for name, m in row["median"].items()
        if name != "PLeX"
    }
    others = [name for name in tokens if name != "PLeX"]
    if HOST_PICKS in tokens:  # the same computation: any difference is a defect, not a tie
        row["host_picks_equal"] = tokens[HOST_PICKS] == tokens["PLeX"]
    row["first_divergence"] = {
        name: rows_first_divergence(tokens["PLeX"], tokens[name]) for name in others
    }
    row["divergence_fp32"] = explain_divergences(folder, prompt, tokens, row, args.device)
    row["tokens_first_row"] = {name: t[0][:16] for name, t in tokens.items()}
    return row


def to_results(out: dict, settings: dict) -> dict:
    """The run as a benchmarks/results.py run: per build a time-to-first-token case and a
    decode-step case (ms per step of the whole batch), rows per runner with their samples."""
    run = results.new_run("gpu", settings, gpu=out["device"] == "cuda")
    for name, row in out["builds"].items():
        if "samples_ms" not in row:
            continue
        b = out["index"][name]
        shape = f"{b['family']} 7B layer shapes x {b['layers']}" if b["size"] == "real" else name
        options = {
            "model": f"llm-{b['family']}",
            "layers": b["layers"],
            "batch": b["batch"],
            "prompt": row["prompt"],
            "new": row["new"],
            "codec": b["codec"],
            "device": out["device"],
        }
        for what, key, title in (
            ("ttft", "ttft", "time to first token"),
            ("decode-step", "step", "decode step (whole batch)"),
        ):
            case = {
                "id": f"llm-{name}-{what}",
                "title": f"{shape}, batch {b['batch']}, prompt {row['prompt']}: {title}",
                "unit": "ms",
                "baseline": "PLeX",
                "options": options,
                "rows": [],
            }
            for runner in RUNNERS:
                if runner not in row["samples_ms"]:
                    compiled = runner == "transformers compiled"
                    reason = row.get("compiled_skipped", "not run") if compiled else "not run"
                    case["rows"].append({"runner": runner, "skipped": reason})
                    continue
                entry: dict = {"runner": runner, "samples": row["samples_ms"][runner][key]}
                if runner != "PLeX":
                    # the earliest row's first differing token (all equal: the tokens made)
                    first = min(
                        row["new"] if d is None else d for d in row["first_divergence"][runner]
                    )
                    entry["check"] = {
                        "metric": "greedy tokens equal to PLeX's before",
                        "value": first,
                        "limit": AGREE_FIRST,
                        "passed": first >= AGREE_FIRST,
                    }
                case["rows"].append(entry)
            run["cases"].append(case)
    return run


def table(out: dict) -> str:
    lines = [
        "| build | runner | TTFT ms | decode tok/s | PLeX decode x | PLeX TTFT x "
        "| first divergence |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for name, row in out["builds"].items():
        if "median" not in row:
            lines.append(f"| {name} | failed: {str(row.get('error', row))[:160]} |")
            continue
        for runner, m in row["median"].items():
            ratio = row["ratios"].get(runner, {})
            speed = ratio.get("decode_tok_s_plex_over")
            ttft = ratio.get("ttft_plex_over")
            diverge = row["first_divergence"].get(runner, "")
            lines.append(
                f"| {name} | {runner} | {m['ttft_ms']:.1f} | {m['decode_tok_s']:.1f} | "
                f"{'' if speed is None else f'{speed:.2f}x'} | "
                f"{'' if ttft is None else f'{ttft:.2f}x'} | {diverge} |"
            )
        if "compiled_skipped" in row:
            lines.append(f"| {name} | transformers compiled | skipped: {row['compiled_skipped']} |")
    return "\n".join(lines)


def run(artifacts: Path, out_dir: Path, args: Settings) -> dict:
    """The whole measurement (what the benchmark suite calls): writes out_dir/llm.json,
    llm-raw.json and llm.md, and returns the results run."""
    import torch

    index = json.loads((artifacts / "llm.json").read_text())
    began = time.perf_counter()
    if args.builds:
        index["builds"] = [b for b in index["builds"] if b["name"] in args.builds]
    if args.families:
        index["builds"] = [b for b in index["builds"] if b["family"] in args.families]
    torch.backends.cuda.matmul.allow_tf32 = False
    out: dict = {
        "device": args.device,
        "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
        "torch": torch.__version__,
        "index": {b["name"]: b for b in index["builds"]},
        "builds": {},
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="plex-llm-run-") as tmp:
        work = Path(tmp)
        rebuilt = rebuild_all(index, artifacts, work)  # before CUDA: payload forks
        for b in index["builds"]:
            name, status = b["name"], rebuilt[b["name"]]
            row: dict = dict(status)
            late = time.perf_counter() - began > args.budget_s
            if late:
                row["error"] = f"not run: past the time budget ({args.budget_s:.0f} s)"
            elif status.get("weights_as_built"):
                try:
                    row.update(run_build(b, Path(status["mln"]), work / b["family"], args))
                except Exception as e:  # reported; the other builds run
                    row["error"] = f"{type(e).__name__}: {e}"
                    row["traceback"] = traceback.format_exc()
            Path(status["mln"]).unlink(missing_ok=True)
            out["builds"][name] = row
            print(json.dumps({name: {k: row.get(k) for k in ("median", "ratios", "error")}}))
            (out_dir / "llm-raw.json").write_text(json.dumps(out, indent=1))
    results_run = to_results(out, asdict(args))
    results_run["machine"]["load_after"] = [round(x, 2) for x in os.getloadavg()]
    (out_dir / "llm.json").write_text(json.dumps(results_run, indent=1) + "\n")
    (out_dir / "llm.md").write_text(table(out) + "\n")
    print(table(out))
    return results_run


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--artifacts", type=Path, default=REPO / "benchmarks/gpu/artifacts/llm")
    p.add_argument("--out", type=Path, default=Path("llm-results"))
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--builds", nargs="*", help="a subset of llm.json's builds (default: all)")
    p.add_argument("--families", nargs="*", help="a subset of families (default: all)")
    p.add_argument("--budget-s", type=float, default=420.0, help="start no build after this")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--no-compile", action="store_true", help="skip transformers compiled")
    a = p.parse_args()
    settings = Settings(
        device=a.device,
        rounds=a.rounds,
        prompt=a.prompt,
        new=a.new,
        compile=not a.no_compile,
        builds=tuple(a.builds or ()),
        families=tuple(a.families or ()),
        budget_s=a.budget_s,
    )
    run(a.artifacts, a.out, settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
