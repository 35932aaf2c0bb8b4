"""The `causal-lm` case kind: token generation by PLeX's Generator against transformers'
`generate` (and llama.cpp where it can run) on the same seeded weights and prompts.

A case names a family of benchmarks/gpu/llm/models.py (`model = "llama"` or `"qwen2"`) and its
size (`params`: `size`, `layers` and config keys that replace the size's), the prompt length
(`seq`), `new_tokens`, `batch`, `dtype` (what the frontend builds and transformers runs) and
PLeX's `build` options (`codec`). The runner (runner.write_causal_lm_app) writes the seeded
Hugging Face folder into a package whose graph uses the causal-lm frontend, and builds it as
any case; this module runs it.

Every runner generates greedy for `new_tokens` from the same prompt ids (models.prompt_ids),
never stopping at EOS, and is timed in interleaved rounds (each round runs every runner for
`calls` generations, in an order that rotates by round, after `warmup` generations each; a
sample is the round's median). Two results come back, read like every other case:

- `<id>-ttft`: time to first token in ms (the prompt's forward and the first token's choice);
- `<id>-decode`: decode tokens/s over the remaining `new_tokens - 1` steps (all rows).

PLeX's times are the Generator's own. transformers: `generate` eager (its default dynamic cache,
scaled-dot-product attention) with a streamer that stamps each token on the host, so both
sides measure the same span. llama.cpp (batch 1): one `eval` of the prompt, then one per token
(benchmarks/llm_llamacpp.py's loop) on a GGUF that llama.cpp's own converter writes from the
same folder (float16: the seeded weights are float16 values, so nothing is rounded); without
llama-cpp-python or the converter its row says why.

The check: PLeX's greedy tokens against transformers', the first position where any row
differs. float32 on the CPU must agree on every token (the two compute the same function in the
same precision, and a greedy argmax only flips on a near tie); at other dtypes and codecs the
divergence is recorded, not judged, as is llama.cpp's against PLeX's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from benchmarks.runner import Case

PLEX = "PLeX"
TRANSFORMERS = "transformers eager"
LLAMA_CPP = "llama.cpp"
ANCHORS = ("transformers", "llama.cpp")  # what a causal-lm case's `anchors` may name
# The llama.cpp source folder whose convert_hf_to_gguf.py writes the GGUF (the vendor/llama.cpp
# folder of the llama-cpp-python sdist, as benchmarks/llm_llamacpp.py takes it).
LLAMA_CPP_SRC = "PLEX_LLAMA_CPP_SRC"

# One generation: (time to first token s, decode s, tokens per row).
Generation = tuple[float, float, list[list[int]]]


class _Clock:
    """A transformers streamer that stamps each `put` on the host: the prompt, then one per
    generated token (generate moves each step's tokens to the host before calling it)."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def put(self, value: object) -> None:
        self.stamps.append(time.perf_counter())

    def end(self) -> None:
        pass


def _plex(mln: Path, prompts: list[list[int]], new: int, keep: list) -> Callable[[], Generation]:
    import myelin
    from myelin.runtime.generation import Generator

    model = myelin.Instance().load(mln)
    generator = Generator(model)
    keep += [model, generator]

    def run() -> Generation:
        r = generator.generate(prompts, max_new_tokens=new, use_eos=False)
        return r.time_to_first_token_s, r.timings["decode_s"], [list(t) for t in r.tokens]

    return run


def transformers_generation(
    model: Any, ids: Any, new: int, sync: Callable[[], None] = lambda: None, **options: Any
) -> Callable[[], Generation]:
    """One transformers `generate` per call (greedy, `new` tokens, the prompt `ids` unpadded),
    timed by a streamer as PLeX's Generator times itself; `sync` waits for the device (CUDA),
    `options` go to `generate` (e.g. `cache_implementation="static"`)."""
    import torch

    mask = torch.ones_like(ids)

    def run() -> Generation:
        clock = _Clock()
        sync()
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=new,
                do_sample=False,
                streamer=clock,
                **options,
            )
        sync()
        stamps = clock.stamps  # [prompt, token 1, ..., token new]
        return stamps[1] - start, stamps[-1] - stamps[1], out[:, ids.shape[1] :].tolist()

    return run


def _transformers(
    folder: Path, dtype: str, prompts: list[list[int]], new: int
) -> Callable[[], Generation]:
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(
        folder, dtype=getattr(torch, dtype), local_files_only=True
    ).eval()
    hf.generation_config.eos_token_id = None  # never stop early, as PLeX's use_eos=False
    hf.generation_config.pad_token_id = 0
    return transformers_generation(hf, torch.tensor(prompts), new)


class Unavailable(Exception):
    """The runner cannot run here or for this case; the message says why."""


def _gguf(case: Case, folder: Path) -> Path:
    """The case's GGUF (`gguf = ...`), else llama.cpp's converter's of the model folder."""
    if case.gguf:
        return Path(case.gguf)
    src = os.environ.get(LLAMA_CPP_SRC)
    if not src or not (Path(src) / "convert_hf_to_gguf.py").exists():
        raise Unavailable(
            f"no GGUF of these weights: set {LLAMA_CPP_SRC} to llama.cpp's source folder "
            "(its convert_hf_to_gguf.py writes one) or name one with `gguf = ...`"
        )
    from benchmarks.llm_llamacpp import CONVERT

    target = folder.parent / "model-F16.gguf"
    command = [sys.executable, "-c", CONVERT, src, str(folder)]
    done = subprocess.run(
        [*command, "--outtype", "f16", "--outfile", str(target)],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise RuntimeError(f"convert_hf_to_gguf failed: {done.stderr.strip().splitlines()[-1:]}")
    return target


def _llama_cpp(
    case: Case, folder: Path, prompts: list[list[int]], new: int, threads: int, keep: list
) -> Callable[[], Generation]:
    if importlib.util.find_spec("llama_cpp") is None:
        raise Unavailable("llama-cpp-python is not installed (pip install llama-cpp-python)")
    if len(prompts) != 1:
        raise Unavailable("batch 1 only (its loop generates one sequence)")
    if case.build.get("codec", "fp32") != "fp32" or (case.dtype or "float32") != "float32":
        raise Unavailable("only beside float32 builds (its GGUF here is F16)")
    import llama_cpp

    from benchmarks.llm_llamacpp import llama_run

    gguf = _gguf(case, folder)
    count = threads or os.cpu_count() or 1
    llm = llama_cpp.Llama(
        str(gguf),
        n_ctx=case.seq + new,
        n_batch=case.seq,
        n_threads=count,
        n_threads_batch=count,
        verbose=False,
    )
    keep.append(llm)

    def run() -> Generation:
        prefill_rate, decode_rate, tokens = llama_run(llm, prompts[0], new)
        return len(prompts[0]) / prefill_rate, (new - 1) / decode_rate, [tokens]

    return run


def rows_first_divergence(a: list[list[int]], b: list[list[int]]) -> list[int | None]:
    """Per row, the first position where the token lists differ (None: equal throughout)."""
    out = []
    for x, y in zip(a, b, strict=True):
        n = next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), None)
        out.append(n if n is not None or len(x) == len(y) else min(len(x), len(y)))
    return out


def first_divergence(a: list[list[int]], b: list[list[int]]) -> int | None:
    """The first position where any row's tokens differ (None: equal throughout)."""
    return min((n for n in rows_first_divergence(a, b) if n is not None), default=None)


def _check(plex: list[list[int]], other: list[list[int]], strict: bool, against: str) -> dict:
    n = first_divergence(plex, other)
    new = len(plex[0])
    return {
        "metric": f"first greedy divergence from {against}",
        "value": f"none in {new}" if n is None else f"token {n} of {new}",
        "limit": "none" if strict else "recorded only",
        "passed": n is None if strict else None,
    }


def run_causal_lm_case(case: Case, mln: Path, threads: int, mln_bf16: object = None) -> list[dict]:
    """PLeX's Generator beside transformers' `generate` (and llama.cpp): two results, time to
    first token and decode tokens/s. `mln_bf16` is the model kind's; a causal-lm case has none."""
    from benchmarks.runner import _llm_models

    folder = mln.parent / "package" / "model"
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    prompts = _llm_models().prompt_ids(case.batch, case.seq, vocab).tolist()
    new, dtype = case.new_tokens, case.dtype or "float32"
    strict = dtype == "float32" and case.build.get("codec", "fp32") == "fp32"
    strict = strict and case.device == "cpu"
    keep: list[Any] = []
    factories: dict[str, Callable[[], Callable[[], Generation]]] = {
        PLEX: lambda: _plex(mln, prompts, new, keep),
        TRANSFORMERS: lambda: _transformers(folder, dtype, prompts, new),
    }
    if "llama.cpp" in case.anchors:
        factories[LLAMA_CPP] = lambda: _llama_cpp(case, folder, prompts, new, threads, keep)
    runners: dict[str, Callable[[], Generation]] = {}
    rows: dict[str, dict] = {}
    tokens: dict[str, list[list[int]]] = {}
    for title, make in factories.items():
        rows[title] = {"runner": title}
        try:
            fn = make()
            tokens[title] = fn()[2]
            runners[title] = fn
        except Unavailable as e:
            rows[title]["skipped"] = str(e)
        except Exception as e:  # a failure is a result too: the table says what failed
            rows[title]["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            traceback.print_exc(file=sys.stderr)
    if PLEX in tokens:
        if TRANSFORMERS in tokens:
            rows[PLEX]["check"] = _check(tokens[PLEX], tokens[TRANSFORMERS], strict, "transformers")
        if LLAMA_CPP in tokens:
            rows[LLAMA_CPP]["check"] = _check(tokens[PLEX], tokens[LLAMA_CPP], False, "PLeX")
    ttft, decode = _time_rounds(runners, case, new * case.batch)
    for obj in keep[::-1]:
        obj.close()
    options = case.options()
    out = []
    for suffix, what, unit, samples in (
        ("ttft", "time to first token", "ms", ttft),
        ("decode", "decode", "tok/s", decode),
    ):
        result_rows = []
        for title, row in rows.items():
            row = dict(row)
            if title in samples:
                row["samples"] = [round(v, 4) for v in samples[title]]
            result_rows.append(row)
        out.append(
            {
                "id": f"{case.id}-{suffix}",
                "title": f"{case.title}: {what}",
                "unit": unit,
                "baseline": PLEX,
                "options": options,
                "rows": result_rows,
            }
        )
    return out


def _time_rounds(
    runners: dict[str, Callable[[], Generation]], case: Case, decoded: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per runner and round: the median time to first token (ms) and decode rate (tokens/s,
    `decoded` tokens less the first of each row) of `calls` generations."""
    for fn in runners.values():
        for _ in range(case.warmup):
            fn()
    names = list(runners)
    ttft: dict[str, list[float]] = {n: [] for n in names}
    decode: dict[str, list[float]] = {n: [] for n in names}
    steps = decoded - case.batch
    for r in range(case.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            runs = [runners[name]() for _ in range(case.calls)]
            ttft[name].append(statistics.median(t for t, _, _ in runs) * 1e3)
            decode[name].append(statistics.median(steps / max(d, 1e-9) for _, d, _ in runs))
    return ttft, decode
