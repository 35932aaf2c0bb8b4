"""The GPU suite in two halves, because the GPU machine has no IREE compiler and a device call
carries at most 64 MiB: `prepare` builds every case here and strips each .mln of its weights
(benchmarks/gpu/payload.py); `run_prebuilt`, on the GPU machine, computes the weights again from
the same seeds (benchmarks/zoo.py, benchmarks/gpu_sources.py), checks that every section's digest
is the one built (a zoo that changed would time another model), and runs the cases with the
model-suite runner.

`prepare --small --device cpu` and `run_prebuilt` on that folder run the same path end to end on
this machine at small sizes (docs/benchmarks.md, "Checking the GPU suite without a GPU").
"""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path

from benchmarks import results, runner, zoo

REPO = Path(__file__).resolve().parents[1]
# Everything one device call carries (the working tree, the wheels in .whl/, the prepared
# cases) must stay under the device tool's 64 MiB; checked against 60 MiB, as the tool's own
# count differs a little from this one.
# In the prepared folder: the commit the cases were built at (gpu/run_suite.sh records it).
REVISION_FILE = "revision"
TRAVEL_LIMIT = 60 * 2**20


def _payload():
    from benchmarks.gpu import payload

    return payload


def tree_bytes() -> int:
    """The bytes of the working tree a device call sends besides the carried paths: tracked
    files and untracked ones git does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    paths = (REPO / p for p in listed.split("\0") if p)
    return sum(p.stat().st_size for p in paths if p.is_file() and not p.is_symlink())


def travelling_bytes(prepared: Path) -> dict[str, int]:
    """What the suite's device call carries, by part."""
    wheels = REPO / ".whl"
    return {
        "prepared cases": sum(f.stat().st_size for f in prepared.rglob("*") if f.is_file()),
        "wheels (.whl)": sum(f.stat().st_size for f in wheels.glob("*.whl")),
        "working tree": tree_bytes(),
    }


def _build_and_strip(raw: dict, out: str) -> float:
    """One case, in a process of its own: a 7B-wide model holds gigabytes while it is exported,
    and the next case should not start with them."""
    case = runner.Case(**raw)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="plex-bench-gpu-") as tmp:
        mln = runner.build_case(case, Path(tmp) / case.id)
        _payload().strip(mln, Path(out) / case.id)
    return time.perf_counter() - start


def prepare(cases: list[runner.Case], out: Path) -> int:
    """Build each case, strip its weights into out/<case id>/, list the cases in out/cases.json,
    and say what the device call will carry."""
    unfit = [c.id for c in cases if c.model not in zoo.GPU_REBUILDABLE]
    if unfit:
        print(f"error: {unfit} need sources the GPU machine cannot rebuild", file=sys.stderr)
        return 1
    out.mkdir(parents=True, exist_ok=True)
    context = multiprocessing.get_context("spawn")
    built, failed = [], []
    for case in cases:
        print(f"== {case.id}: building", file=sys.stderr, flush=True)
        try:
            with ProcessPoolExecutor(1, mp_context=context) as pool:
                seconds = pool.submit(_build_and_strip, asdict(case), str(out)).result()
        except Exception as e:  # the other cases still build; the exit status says it
            print(f"== {case.id}: FAILED: {e}".splitlines()[0][:400], file=sys.stderr, flush=True)
            failed.append(case.id)
            continue
        print(f"== {case.id}: built and stripped in {seconds:.0f} s", file=sys.stderr, flush=True)
        built.append(case)
    (out / "cases.json").write_text(json.dumps([asdict(c) for c in built], indent=1) + "\n")
    # the commit the cases were built at: the run there records it (its tree's .git is stale)
    (out / REVISION_FILE).write_text(f"{results.plex_revision() or 'unknown'}\n")
    parts = travelling_bytes(out)
    total = sum(parts.values())
    shown = ", ".join(f"{k} {v / 2**20:.1f}" for k, v in parts.items())
    print(f"{out}: {len(cases)} cases; the device call carries {total / 2**20:.1f} MiB ({shown})")
    if total > TRAVEL_LIMIT:
        print(f"error: over {TRAVEL_LIMIT / 2**20:.0f} MiB: prepare fewer cases", file=sys.stderr)
        return 1
    if failed:
        print(f"error: {failed} did not build (above); the rest are prepared", file=sys.stderr)
        return 1
    return 0


class _Done(list):
    """The results so far; `on_case` hears of each one as it is added."""

    def __init__(self, on_case: Callable[[dict], None] | None) -> None:
        super().__init__()
        self.on_case = on_case

    def append(self, result: dict) -> None:
        super().append(result)
        if self.on_case:
            self.on_case(result)


def run_prebuilt(
    folder: Path,
    wanted: list[runner.Case],
    threads: int,
    deadline_s: float | None = None,
    on_case: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Rebuild each prepared case's .mln from seeds and run it; the cases are those prepared
    (cases.json, in its order), limited to `wanted`'s ids. Past `deadline_s` seconds no case
    starts: the rest are recorded as skipped, so one slow case cannot cost the whole run.
    `on_case` gets each case's result as soon as it exists (the caller writes it down)."""
    payload = _payload()
    wanted_ids = {c.id for c in wanted}
    prepared = json.loads((folder / "cases.json").read_text())
    start = time.monotonic()
    done = _Done(on_case)
    with tempfile.TemporaryDirectory(prefix="plex-bench-gpu-") as tmp:
        for raw in prepared:
            raw["anchors"] = tuple(raw["anchors"])
            case = runner.Case(**raw)
            if case.id not in wanted_ids:
                continue
            if deadline_s is not None and time.monotonic() - start > deadline_s:
                why = f"not started: the run's {deadline_s:.0f} s were spent"
                done.append(runner.failed_case(case, None, why))
                continue
            print(f"== {case.id}: weights from seeds", file=sys.stderr, flush=True)
            mln = Path(tmp) / f"{case.id}.mln"
            try:
                differ = payload.rebuild(
                    folder / case.id,
                    mln,
                    lambda c=case: zoo.weights(c.model, c.batch, c.seq, c.dtype, c.params),
                )
                if differ:
                    raise RuntimeError(f"rebuilt sections differ from the build: {differ[:3]}")
            except Exception as e:
                done.append(runner.failed_case(case, e, "weights from seeds"))
                continue
            print(f"== {case.id}: checking and timing", file=sys.stderr, flush=True)
            try:
                for result in runner.run_case(case, mln, threads):
                    done.append(result)
            except Exception as e:  # recorded; the other cases run
                done.append(runner.failed_case(case, e, "run"))
            mln.unlink()
            _release_gpu_memory()
    return list(done)


def _release_gpu_memory() -> None:
    """torch's cached blocks and compiled graphs from one case are memory the next case's PLeX
    cannot use (and the zoo's models share one `forward`, whose compiled graphs would pile up
    against dynamo's per-function cache limit)."""
    import gc

    if "torch" in sys.modules:
        import torch

        torch._dynamo.reset()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
