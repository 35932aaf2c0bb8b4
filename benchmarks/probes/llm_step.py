"""Where a causal-LM prefill and decode step spend their time on this CPU, and A/B timings of
builds of the same model (issue 33: the step around the matvecs).

    python benchmarks/probes/llm_step.py profile A.mln [B.mln ...] [--rounds 5] [--repeat 3]
    python benchmarks/probes/llm_step.py time A.mln B.mln [...] [--rounds 5] [--new 32]
                                         [--threads 2] [--iree-flag=--task_worker_spin_us=50]

`profile`: IREE's HAL profile (myelin.runtime.profiling.capture, as `plex profile`) of one
`prefill` of --prompt tokens and one `decode` at --prompt + 1 tokens held, on ONE worker
(`--task_topology_group_count=1`, the thread count of the llama.cpp comparison), each dispatch
put in a category by its name (matvec / matmul, attention, the cache copy, ...): ms per call
and share of the call's dispatch time, the builds interleaved round by round (median and
min-max of the rounds). The decomposed attention's softmax is elementwise ops and reductions,
counted under those.

`time`: the builds loaded together in one process on --threads threads (IREE runtime flags
given by --iree-flag apply to every build), `Generator.generate` of the
same --prompt random token ids (greedy, --new tokens, no EOS) in alternation for --rounds
rounds; prints each build's median prefill and decode tok/s with min-max, and the load.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

# dispatch name pattern -> category; first match wins (names are IREE's:
# <function>_dispatch_<n>_<ops>_<shape>_<types>)
CATEGORIES = (
    ("attention", r"attention|softmax|batch_matmul"),
    ("KV repeat (repeat_kv copy)", r"elementwise_broadcast_4x8x"),
    ("lm_head (32000 wide)", r"32000"),
    ("matvec / matmul (weights)", r"matmul|matvec|mmt4d|contract|batch_matmul"),
    ("pack / unpack (data tiling)", r"pack|unpack"),
    ("RMSNorm / reductions", r"reduction"),
    ("RoPE / elementwise", r"elementwise|generic"),
    ("copies / slices", r"slow_memcpy|insert_slice|extract_slice|copy|transpose"),
)


def category(name: str) -> str:
    for label, pattern in CATEGORIES:
        if re.search(pattern, name):
            return label
    return "other"


def inputs(prompt: int, kv: int | None):
    import numpy as np

    rng = np.random.default_rng(0)
    if kv is None:  # prefill
        ids = rng.integers(3, 500, (1, prompt)).astype(np.int64)
        return [ids, np.arange(prompt, dtype=np.int64)[None], np.ones((1, prompt), np.int64)]
    ids = rng.integers(3, 500, (1, 1)).astype(np.int64)
    return [ids, np.array([[kv - 1]], np.int64), np.ones((1, kv), np.int64)]


def profile(
    paths: list[Path], prompt: int, repeat: int, rounds: int, top: int, threads: int
) -> None:
    from myelin.runtime import profiling

    command = profiling._command

    def workers(*args, **kwargs):  # the comparison's thread count
        return [*command(*args, **kwargs), f"--task_topology_group_count={threads}"]

    profiling._command = workers
    calls = (("prefill", None), ("decode", prompt + 1))
    # (path, function) -> category -> ms per call, one value per round
    ms: dict[tuple[Path, str], dict[str, list[float]]] = {}
    hottest: dict[tuple[Path, str], list] = {}
    loads = []
    for _ in range(rounds):  # builds and calls interleaved, round by round
        for path in paths:
            for function, kv in calls:
                with tempfile.TemporaryDirectory() as out:
                    result = profiling.capture(
                        path, function, inputs(prompt, kv), out, repeat=repeat
                    )
                by: dict[str, float] = {"(all dispatches)": 0.0}
                for s in result.dispatches:
                    by[category(s.name)] = by.get(category(s.name), 0) + s.total_ns / repeat / 1e6
                    by["(all dispatches)"] += s.total_ns / repeat / 1e6
                for label, value in by.items():
                    ms.setdefault((path, function), {}).setdefault(label, []).append(value)
                hottest[(path, function)] = result.dispatches[:top]
                loads.append(os.getloadavg()[0])
    print(
        f"{rounds} interleaved rounds of {repeat} calls each, {threads} worker(s), prompt {prompt} "
        f"(decode at {prompt + 1} held), load {min(loads):.1f}-{max(loads):.1f}; "
        "ms per call: median [min-max] of the rounds; share of the median total"
    )
    for (path, function), by in ms.items():
        total = statistics.median(by["(all dispatches)"])
        print(f"\n{path} {function}")
        print("| category | ms per call | share |\n|---|---:|---:|")
        for label, values in sorted(by.items(), key=lambda item: -statistics.median(item[1])):
            m = statistics.median(values)
            print(
                f"| {label} | {m:.2f} [{min(values):.2f}-{max(values):.2f}] "
                f"| {100 * m / total:.1f}% |"
            )
        print("hottest dispatches (last round):")
        for s in hottest[(path, function)]:
            print(f"  {s.total_ns / repeat / 1e6:8.3f} ms x{s.count // repeat:3d}  {s.name}")


def time_builds(
    paths: list[Path], prompt: int, new: int, rounds: int, threads: int, iree_flags: list[str]
) -> None:
    import iree.runtime as rt
    import numpy as np

    from myelin.runtime.devices import set_host_threads

    set_host_threads(threads)  # on 1 the causal LMs run on local-sync (host_drivers)
    if iree_flags:  # before the first model: the task executor reads them when it starts
        rt.flags.parse_flags(*iree_flags)
    import myelin
    from myelin.runtime.generation import Generator

    ids = np.random.default_rng(0).integers(3, 500, prompt).tolist()
    instance = myelin.Instance()
    generators = [Generator(instance.load(p)) for p in paths]
    for g in generators:
        g.generate(ids, max_new_tokens=4, use_eos=False)  # warm up
    rows: dict[Path, list[tuple[float, float]]] = {p: [] for p in paths}
    tokens = {}
    loads = []
    for _ in range(rounds):
        for p, g in zip(paths, generators, strict=True):
            r = g.generate(ids, max_new_tokens=new, use_eos=False)
            rows[p].append((r.prefill_tokens_per_s, r.decode_tokens_per_s))
            tokens[p] = list(r.tokens[0])
        loads.append(os.getloadavg()[0])
    print(
        f"prompt {prompt}, {new} new tokens, {rounds} interleaved rounds, {threads} thread(s) "
        f"{' '.join(iree_flags)}, drivers {generators[0].model.drivers}, "
        f"load {min(loads):.1f}-{max(loads):.1f}"
    )
    print("| build | prefill tok/s | decode tok/s | decode ms/step | same tokens as first |")
    print("|---|---:|---:|---:|---|")
    for p in paths:
        pre = [v[0] for v in rows[p]]
        dec = [v[1] for v in rows[p]]
        print(
            f"| {p} | {statistics.median(pre):.1f} [{min(pre):.1f}-{max(pre):.1f}] "
            f"| {statistics.median(dec):.2f} [{min(dec):.2f}-{max(dec):.2f}] "
            f"| {1000 / statistics.median(dec):.1f} | {tokens[p] == tokens[paths[0]]} |"
        )
    for g in generators:
        g.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("profile", "time"))
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument(
        "--threads", type=int, default=1, help="the host thread count (profile: IREE workers)"
    )
    parser.add_argument(
        "--iree-flag", action="append", default=[], help="time: an IREE runtime flag"
    )
    args = parser.parse_args()
    if args.mode == "profile":
        profile(args.paths, args.prompt, args.repeat, args.rounds, args.top, args.threads)
    else:
        time_builds(args.paths, args.prompt, args.new, args.rounds, args.threads, args.iree_flag)


if __name__ == "__main__":
    main()
