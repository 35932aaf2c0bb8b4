"""The GPU suite in two halves: `prepare` builds every case here (the GPU machine has no IREE
compiler) and strips each .mln of its weights (benchmarks/gpu/payload.py: the device call
carries at most 64 MiB); `run_prebuilt`, on the GPU machine, computes the weights again from the
same seeds (benchmarks/zoo.py), checks that every section's digest is the one built, and runs the
cases with the model-suite runner."""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from benchmarks import runner, zoo

# What travels with the runtime wheel (15 MB) and the working tree must stay under the device
# tool's 64 MiB; the skeletons are checked against this share of it.
SKELETON_LIMIT = 24 * 2**20


def _payload():
    from benchmarks.gpu import payload

    return payload


def prepare(cases: list[runner.Case], out: Path) -> int:
    """Build each case, strip its weights into out/<case id>/, list the cases in out/cases.json."""
    payload = _payload()
    unfit = [c.id for c in cases if c.model not in zoo.SEEDED_PURE_TORCH]
    if unfit:
        print(f"error: {unfit} need sources the GPU machine cannot rebuild", file=sys.stderr)
        return 1
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="plex-bench-gpu-") as tmp:
        for case in cases:
            print(f"== {case.id}: building", file=sys.stderr, flush=True)
            mln = runner.build_case(case, Path(tmp) / case.id)
            payload.strip(mln, out / case.id)
    (out / "cases.json").write_text(json.dumps([asdict(c) for c in cases], indent=1) + "\n")
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"{out}: {len(cases)} cases, {size / 2**20:.1f} MiB to carry")
    if size > SKELETON_LIMIT:
        print(f"error: over {SKELETON_LIMIT / 2**20:.0f} MiB: carry fewer cases", file=sys.stderr)
        return 1
    return 0


def run_prebuilt(folder: Path, wanted: list[runner.Case], threads: int) -> list[dict]:
    """Rebuild each prepared case's .mln from seeds and run it; the cases are those prepared
    (cases.json), in the suite's order, limited to `wanted`'s ids."""
    payload = _payload()
    wanted_ids = {c.id for c in wanted}
    prepared = json.loads((folder / "cases.json").read_text())
    done = []
    with tempfile.TemporaryDirectory(prefix="plex-bench-gpu-") as tmp:
        for raw in prepared:
            raw["anchors"] = tuple(raw["anchors"])
            case = runner.Case(**raw)
            if case.id not in wanted_ids:
                continue
            print(f"== {case.id}: weights from seeds", file=sys.stderr, flush=True)
            mln = Path(tmp) / f"{case.id}.mln"
            try:
                differ = payload.rebuild(
                    folder / case.id,
                    mln,
                    lambda c=case: zoo.weights(c.model, c.batch, c.seq, c.dtype),
                )
                if differ:
                    raise RuntimeError(f"rebuilt sections differ from the build: {differ[:3]}")
            except Exception as e:
                done.append(runner.failed_case(case, e))
                continue
            print(f"== {case.id}: checking and timing", file=sys.stderr, flush=True)
            done.append(runner.run_case(case, mln, threads))
            mln.unlink()
    return done
