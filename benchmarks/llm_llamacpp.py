"""Prefill and decode tokens/s of a TinyLlama-1.1B-shaped model on this CPU: PLeX (the
Generator of `plex generate`) against llama.cpp (llama-cpp-python) and onnxruntime-genai, per
bit width and thread count, on the same seeded weights and the same token ids, interleaved.

    pip install -e '.[llm,llm-bench]'   # llama-cpp-python from source, see docs/benchmarks.md
    python benchmarks/llm_llamacpp.py --llama-cpp-src DIR [--cache DIR] [--threads 1 2]
                                      [--pairs fp32:F16 int8:Q8_0 q4:Q4_0] [--rounds 3]
                                      [--runners llama.cpp onnxruntime-genai]

The model: LlamaForCausalLM with TinyLlama-1.1B's shape (hidden 2048, 22 layers, 32 heads / 4
KV heads, FFN 5632, vocab 32000), seed 0, weights normal(0, 0.02), saved once with
`save_pretrained` under --cache (4.4 GB, reused by later runs). From that folder:

- PLeX builds it (frontend "causal-lm", max_seq = prompt + new) with every weight in the
  pair's codec (`[weights.codec] "*" = ...`; fp32 is no codec); each build's log, with the
  time of each build step and the peak RSS, is kept beside its .mln;
- llama.cpp's own `convert_hf_to_gguf.py` (in the llama-cpp-python sdist, under
  vendor/llama.cpp: --llama-cpp-src) writes GGUF F16, and `llama_model_quantize` (the
  library's C API) makes Q8_0 and Q4_0 from it;
- onnxruntime-genai's model builder (`python -m onnxruntime_genai.models.builder -e cpu`)
  writes an ONNX model per precision (ORT_PRECISIONS): PLeX's float codecs meet its fp32 model,
  as ONNX Runtime's CPU provider has no fast fp16 MatMul (one row through a 2048 x 5632 fp16
  MatMul takes longer than through fp32's, docs/llm.md); int8 and q4 meet its int8
  and int4, weight-only MatMulNBits in blocks of 32 along the input (as Q8_0 and Q4_0) with
  int8 activations (accuracy level 4, as llama.cpp's quantized dot products); it quantizes
  every MatMul, the LM head included, and keeps the embedding table fp32. Built once per
  precision under --cache/ortgenai, its log and seconds beside it.

Every runner gets the same `--prompt` random token ids (no tokenizer in the loop), decodes
greedy for `--new` tokens and never stops at EOS. PLeX: the Generator's timings (prefill =
prompt tokens over the time to the first token; decode = the tokens after it over the wall
clock from the first token's choice to the last's; the app names no driver, as a user's need
not: the host's choice, `plex_drivers`, is the default's). llama.cpp: one `eval` of the prompt
(n_batch = prompt), then one `eval` per token and the argmax of its last logits; timed the
same way. onnxruntime-genai: `og.Generator` greedy (do_sample off), `append_tokens` of the
prompt, then `generate_next_token` per token; timed the same way. Its search stops at EOS
(its config's eos_token_id must be a token of the vocabulary), so min_length = max_length keeps
it going: that masks EOS, which changes a pick only where token 2 was the argmax (the
`same leading tokens` check shows where).

Thread counts: IREE's task topology is process-wide, so each thread count runs in a process of
its own (llama.cpp gets n_threads = n_threads_batch = the same count; onnxruntime-genai its
session's intra_op_num_threads, through a `og.Config` overlay of genai_config.json; PLeX's is
`set_host_threads`, on 1 thread the model then runs on local-sync: each case's
`plex_drivers`). Within it, each pair's models are loaded together (at most one per runner in
memory), warmed up, and timed in alternation for `--rounds` rounds. Prints a table of medians
with the spread of the per-round ratios (PLeX / each other runner: above 1 means PLeX is
faster), the CPU and the load, and writes benchmarks/results/llm/<date>_<machine>.json; each
other runner's row records how many leading greedy tokens it shares with PLeX.

Why convert_hf_to_gguf runs with its BPE pre-tokenizer check answered "gpt-2": the seeded
model's tokenizer is a small byte-level BPE trained here, whose hash llama.cpp does not know;
the pre-tokenizer only matters for text, and this benchmark feeds token ids.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.results import new_run, ratios, spread, write  # noqa: E402

# TinyLlama-1.1B's shape (its config.json), seeded weights.
SHAPE = dict(
    vocab_size=32000,
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=22,
    num_attention_heads=32,
    num_key_value_heads=4,
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
    tie_word_embeddings=False,
)
PAIRS = ("fp32:F16", "int8:Q8_0", "q4:Q4_0")
# llama.cpp's file types (enum llama_ftype) for the quantizations made here.
FTYPES = {"Q8_0": 7, "Q4_0": 2}
PLEX_BUILD = [sys.executable, "-m", "plex", "build"]
# Each runner's name in the result file; PLeX, every ratio's baseline, always runs, and
# --runners names the others.
RUNNERS = {"plex": "PLeX", "llama.cpp": "llama.cpp", "onnxruntime-genai": "onnxruntime-genai"}
# onnxruntime-genai's builder precision for each PLeX codec (the module docstring says why).
ORT_PRECISIONS = {"fp32": "fp32", "fp16": "fp32", "bf16": "fp32", "int8": "int8", "q4": "int4"}
# Blocks of 32 like Q8_0 / Q4_0; accuracy level 4: int8 activations (the builder's CPU default).
ORT_QUANT_OPTIONS = ["block_size=32", "accuracy_level=4"]
ORT_BUILD = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-e", "cpu"]
DEFAULT_CACHE = Path(os.environ.get("PLEX_BENCH_CACHE", Path.home() / ".cache" / "plex-bench"))


def write_model(folder: Path) -> None:
    """The seeded model and a tokenizer, once: later runs reuse the folder."""
    if (folder / "model.safetensors").exists():
        return
    import torch
    import transformers

    from tests.llm.tiny_models import write_tokenizer

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**SHAPE))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.02)
    model.eval().save_pretrained(folder)
    write_tokenizer(folder)


CONVERT = """
import runpy, sys
src = sys.argv[1]
sys.path.insert(0, src)
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
def no_sentencepiece(self):
    raise FileNotFoundError("no tokenizer.model")
base.TextModel._set_vocab_sentencepiece = no_sentencepiece  # see the module docstring
sys.argv = [src + "/convert_hf_to_gguf.py", *sys.argv[2:]]
runpy.run_path(src + "/convert_hf_to_gguf.py", run_name="__main__")
"""


def write_gguf(model: Path, folder: Path, llama_cpp_src: Path | None, kind: str) -> Path:
    """GGUF F16 by llama.cpp's converter; Q8_0 / Q4_0 quantized from it by the library."""
    target = folder / f"model-{kind}.gguf"
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "F16":
        if llama_cpp_src is None or not (llama_cpp_src / "convert_hf_to_gguf.py").exists():
            raise SystemExit(
                "--llama-cpp-src must be the vendor/llama.cpp folder of the llama-cpp-python "
                "0.3.36 sdist (pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36)"
            )
        command = [sys.executable, "-c", CONVERT, str(llama_cpp_src), str(model)]
        subprocess.run([*command, "--outtype", "f16", "--outfile", str(target)], check=True)
        return target
    import llama_cpp

    source = write_gguf(model, folder, llama_cpp_src, "F16")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[kind]
    params.nthread = os.cpu_count() or 1
    status = llama_cpp.llama_model_quantize(
        str(source).encode(), str(target).encode(), llama_cpp.byref(params)
    )
    if status != 0:
        raise SystemExit(f"llama_model_quantize to {kind} failed with status {status}")
    return target


def build_plex(model: Path, folder: Path, codec: str, max_seq: int) -> Path:
    """`plex build` of the model with every weight in `codec`; the build's step log and its
    peak RSS go to build.log and build.json beside the .mln. Built on every run: the build
    cache makes an unchanged one quick, and a .mln kept from an earlier run would time the
    code it was built with (build.json then holds this run's, cached, seconds)."""
    root = folder / codec
    mln = root / "lm.mln"
    package = root / "lm"
    (package / "model").mkdir(parents=True, exist_ok=True)
    for f in model.iterdir():  # hard links: a package reads only files inside its folder
        link = package / "model" / f.name
        if not link.exists():
            os.link(f, link)
    (package / "plex.toml").write_text(
        '[package]\nname = "lm"\n\n[graph.lm]\nsource = "model"\nfrontend = "causal-lm"\n'
        f"max_seq = {max_seq}\n"
    )
    weights = "" if codec == "fp32" else f'\n[weights.codec]\n"*" = "{codec}"\n'
    (root / "app.toml").write_text(
        textwrap.dedent(
            """\
            [app]
            name = "lm"
            packages = ["lm"]

            [build]
            temp_memory = "2GiB"
            cache = "../cache"

            [devices.cpu]
            target = "llvm-cpu"
            cpu = "host"
            """
        )
        + weights
    )
    start = time.perf_counter()
    with open(root / "build.log", "w") as log:
        subprocess.run(
            [*PLEX_BUILD, str(root / "app.toml"), "-o", str(mln), "--progress", "plain"],
            stdout=log,
            stderr=subprocess.STDOUT,
            check=True,
        )
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    (root / "build.json").write_text(
        json.dumps({"seconds": time.perf_counter() - start, "peak_rss_bytes": peak}) + "\n"
    )
    return mln


def build_ortgenai(model: Path, folder: Path, precision: str) -> Path:
    """onnxruntime-genai's model builder on the same folder, once per precision (later runs
    reuse it, as they do the GGUF files); its log and seconds go to build.log and build.json
    in it. Written under another name and renamed when done, so that a stopped build is not
    taken for a finished one."""
    target = folder / precision
    if (target / "genai_config.json").exists():
        return target
    partial, scratch = folder / f"{precision}.partial", folder / f"{precision}.scratch"
    for path in (partial, scratch):
        shutil.rmtree(path, ignore_errors=True)
    partial.mkdir(parents=True)
    extra = [] if precision == "fp32" else ORT_QUANT_OPTIONS
    command = [*ORT_BUILD, "-i", str(model), "-o", str(partial), "-p", precision]
    command += ["-c", str(scratch), *(["--extra_options", *extra] if extra else [])]
    start = time.perf_counter()
    with open(partial / "build.log", "w") as log:
        subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=True)
    seconds = time.perf_counter() - start
    record = {"seconds": seconds, "precision": precision, "extra_options": extra}
    (partial / "build.json").write_text(json.dumps(record) + "\n")
    shutil.rmtree(scratch, ignore_errors=True)
    partial.rename(target)
    return target


def plex_run(generator, prompt: list[int], new: int) -> tuple[float, float, list[int]]:
    r = generator.generate(prompt, max_new_tokens=new, use_eos=False)
    return r.prefill_tokens_per_s, r.decode_tokens_per_s, list(r.tokens[0])


def llama_run(llm, prompt: list[int], new: int) -> tuple[float, float, list[int]]:
    import llama_cpp
    import numpy as np

    vocab = llm.n_vocab()

    def greedy() -> int:
        # Llama.eval keeps no logits unless logits_all; the C API has the last token's.
        logits = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(logits, shape=(vocab,))))

    llm.reset()
    start = time.perf_counter()
    llm.eval(prompt)
    prefill = time.perf_counter() - start
    tokens = [greedy()]
    start = time.perf_counter()
    for _ in range(new - 1):
        llm.eval([tokens[-1]])
        tokens.append(greedy())
    decode = time.perf_counter() - start
    return len(prompt) / prefill, (new - 1) / decode, tokens


def ortgenai_run(model, prompt: list[int], new: int) -> tuple[float, float, list[int]]:
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    # min_length = max_length masks EOS: its greedy search would otherwise stop there
    length = len(prompt) + new
    params.set_search_options(do_sample=False, max_length=length, min_length=length)
    generator = og.Generator(model, params)
    start = time.perf_counter()
    generator.append_tokens(prompt)
    generator.generate_next_token()
    tokens = [int(generator.get_next_tokens()[0])]
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(new - 1):
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    decode = time.perf_counter() - start
    return len(prompt) / prefill, (new - 1) / decode, tokens


class Unavailable(Exception):
    """A runner has no model for a pair; the message says why, and goes into its row."""


# One generation: (prefill tok/s, decode tok/s, tokens).
Run = Callable[[list[int], int], tuple[float, float, list[int]]]


def open_llama_cpp(args: argparse.Namespace, pair: str, stack: contextlib.ExitStack) -> Run:
    import llama_cpp

    threads = args.threads[0]
    llm = llama_cpp.Llama(
        str(args.cache / "gguf" / f"model-{pair.split(':')[1]}.gguf"),
        n_ctx=args.prompt + args.new,
        n_batch=args.prompt,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )
    stack.callback(llm.close)
    return functools.partial(llama_run, llm)


def open_ortgenai(args: argparse.Namespace, pair: str, stack: contextlib.ExitStack) -> Run:
    import onnxruntime_genai as og

    codec = pair.split(":")[0]
    if codec not in ORT_PRECISIONS:
        raise Unavailable(f"no onnxruntime-genai precision for PLeX's {codec} codec")
    config = og.Config(str(args.cache / "ortgenai" / ORT_PRECISIONS[codec]))
    threads = {"intra_op_num_threads": args.threads[0]}
    config.overlay(json.dumps({"model": {"decoder": {"session_options": threads}}}))
    model = og.Model(config)
    return functools.partial(ortgenai_run, model)


OPENERS = {"llama.cpp": open_llama_cpp, "onnxruntime-genai": open_ortgenai}


def worker(args: argparse.Namespace) -> None:
    """One thread count: every pair, rounds interleaved; one JSON line per pair on stdout."""
    import numpy as np

    from myelin.runtime.devices import set_host_threads

    # IREE's worker count, and the host's driver choice for a causal LM (local-sync on 1)
    set_host_threads(args.threads[0])
    import myelin
    from myelin.runtime.generation import Generator

    prompt = np.random.default_rng(0).integers(3, 32000, args.prompt).tolist()
    instance = myelin.Instance()
    for pair in args.pairs:
        runs: dict[str, Run] = {}
        skipped: dict[str, str] = {}
        with contextlib.ExitStack() as stack:
            model = instance.load(args.cache / "plex" / pair.split(":")[0] / "lm.mln")
            stack.callback(model.close)
            drivers = model.drivers
            runs["plex"] = functools.partial(plex_run, stack.enter_context(Generator(model)))
            for name in args.runners[1:]:
                try:
                    runs[name] = OPENERS[name](args, pair, stack)
                except Unavailable as why:
                    skipped[name] = str(why)
            for run in runs.values():
                run(prompt, 4)  # warm up each
            samples: dict[str, list] = {name: [] for name in runs}
            for _ in range(args.rounds):
                for name, run in runs.items():
                    samples[name].append(run(prompt, args.new))
            runs.clear()  # onnxruntime-genai's model has no close: this drops it
        plex_tokens = samples["plex"][0][2]
        print(
            json.dumps(
                {
                    "pair": pair,
                    "threads": args.threads[0],
                    "load": os.getloadavg()[0],
                    "plex_drivers": drivers,
                    "samples": {name: [list(v[:2]) for v in got] for name, got in samples.items()},
                    "same_leading_tokens": {
                        name: leading_agreement(plex_tokens, got[0][2])
                        for name, got in samples.items()
                        if name != "plex"
                    },
                    "skipped": skipped,
                }
            ),
            flush=True,
        )


def leading_agreement(a: list[int], b: list[int]) -> int:
    """How many leading tokens two greedy runs agree on: different weight formats (fp32 against
    F16, int8 against Q8_0) round differently, so seeded random weights drift apart at some
    point; the count shows where, it is not a check."""
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def ratio_cell(plex: list[float], other: list[float]) -> str:
    # tok/s: the ratio is plex / other, so above 1 means PLeX is faster
    each = spread(ratios(other, plex))
    return f"{each.median:.2f}x ({each.low:.2f}-{each.high:.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--llama-cpp-src", type=Path, default=None)
    parser.add_argument("--pairs", nargs="+", default=list(PAIRS))
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    others = [name for name in RUNNERS if name != "plex"]
    parser.add_argument(
        "--runners", nargs="+", choices=others, default=others, help="beside PLeX (always run)"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.runners = ["plex", *dict.fromkeys(args.runners)]  # PLeX first: every ratio's baseline
    if args.worker:
        worker(args)
        return

    model = args.cache / "tinyllama-1.1b"
    write_model(model)
    ort_builds = {}
    for pair in args.pairs:
        codec, kind = pair.split(":")
        build_plex(model, args.cache / "plex", codec, args.prompt + args.new)
        if "llama.cpp" in args.runners:
            write_gguf(model, args.cache / "gguf", args.llama_cpp_src, kind)
        if "onnxruntime-genai" not in args.runners:
            continue
        if codec in ORT_PRECISIONS:
            built = build_ortgenai(model, args.cache / "ortgenai", ORT_PRECISIONS[codec])
            ort_builds[built.name] = json.loads((built / "build.json").read_text())
        else:
            print(f"onnxruntime-genai: no precision for PLeX's {codec}, its cells are left out")

    others = args.runners[1:]
    run = new_run(
        "llm",
        {
            "rounds": args.rounds,
            "prompt": args.prompt,
            "new": args.new,
            "threads": args.threads,
            "runners": args.runners,
        },
    )
    results = []
    for threads in args.threads:
        command = [sys.executable, __file__, "--worker", "--cache", str(args.cache)]
        command += ["--threads", str(threads), "--pairs", *args.pairs]
        command += ["--prompt", str(args.prompt), "--new", str(args.new)]
        command += ["--rounds", str(args.rounds), "--runners", *args.runners[1:]]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        results += [json.loads(line) for line in out.splitlines() if line.startswith("{")]

    print(
        f"TinyLlama-1.1B shape, seeded; prompt {args.prompt}, {args.new} new tokens greedy; "
        f"median of {args.rounds} interleaved rounds; {run['machine']['cpu']}, "
        f"{run['machine']['cores']} cores; load {run['machine']['load_before'][0]:.1f} before"
    )
    vs = " | ".join(f"PLeX / {RUNNERS[name]} (min-max)" for name in others)
    print(
        f"| {' / '.join(RUNNERS[name] for name in args.runners)} | threads "
        f"| prefill tok/s | {vs} | decode tok/s | {vs} | load |"
    )
    print("|---|---:|" + "---:|" * (2 + 2 * len(others)) + "---:|")
    for r in results:
        samples = r["samples"]
        codec, kind = r["pair"].split(":")
        names = {"plex": codec, "llama.cpp": kind, "onnxruntime-genai": ORT_PRECISIONS.get(codec)}
        options = {"plex_drivers": r["plex_drivers"]}
        if "onnxruntime-genai" in others:
            options["onnxruntime_genai_precision"] = ORT_PRECISIONS.get(codec)
        cells = []
        for i in (0, 1):
            plex = [v[i] for v in samples["plex"]]
            rates = [
                f"{statistics.median(v[i] for v in samples[name]):.1f}" if name in samples else "-"
                for name in args.runners
            ]
            cells.append(" / ".join(rates))
            for name in others:
                got = samples.get(name)
                cells.append(ratio_cell(plex, [v[i] for v in got]) if got else "-")
        print(
            f"| {' / '.join(names[name] or '-' for name in args.runners)} | {r['threads']} "
            f"| {' | '.join(cells)} | {r['load']:.1f} |"
        )
        for i, metric in enumerate(("prefill", "decode")):
            rows = [{"runner": RUNNERS["plex"], "samples": [v[i] for v in samples["plex"]]}]
            for name in others:
                if name in r["skipped"]:
                    rows.append({"runner": RUNNERS[name], "skipped": r["skipped"][name]})
                    continue
                check = {
                    "metric": "same leading tokens as PLeX",
                    "value": r["same_leading_tokens"][name],
                    "limit": "recorded only",
                    "passed": None,
                }
                got = [v[i] for v in samples[name]]
                rows.append({"runner": RUNNERS[name], "samples": got, "check": check})
            run["cases"].append(
                {
                    "id": f"{r['pair'].replace(':', '-').lower()}-t{r['threads']}-{metric}",
                    "title": f"{metric} tok/s, {r['pair']}, {r['threads']} threads",
                    "unit": "tok/s",
                    "baseline": RUNNERS["plex"],
                    "options": options,
                    "rows": rows,
                }
            )
    builds = {
        codec: json.loads((args.cache / "plex" / codec / "build.json").read_text())
        for codec in (p.split(":")[0] for p in args.pairs)
        if (args.cache / "plex" / codec / "build.json").exists()
    }
    run["builds"] = builds
    run["ortgenai_builds"] = ort_builds
    print(f"wrote {write(run)}")


if __name__ == "__main__":
    main()
