"""The timing half of a split `plex tune` run: times a bundle's candidates on the machine that
has the device and only the runtime (iree-base-runtime + numpy + a copy of this repository's
`src` on PYTHONPATH; no IREE compiler, nothing of plex).

    python -m myelin.tuning.time_bundle BUNDLE -o RESULTS [--rounds N] [--warmup N]

Every candidate artifact is timed interleaved with the reference (`myelin.tuning.timing`:
warm-up calls, then rounds that call each artifact in turn), on the inputs the bundle carries,
and its outputs are checked against the reference's. Writes RESULTS/results.json, which also
embeds bundle.json: `plex tune --collect RESULTS` needs nothing else from this machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from myelin.tuning.timing import outputs_of, same_outputs, time_interleaved

BUNDLE_JSON = "bundle.json"
RESULTS_JSON = "results.json"
INPUTS_NPZ = "inputs.npz"


def load_inputs(bundle_dir: Path) -> list[np.ndarray]:
    """The bundle's inputs, in call order (saved by the compile half as arr_0, arr_1, ...)."""
    with np.load(bundle_dir / INPUTS_NPZ) as data:
        return [data[f"arr_{i}"] for i in range(len(data.files))]


def time_bundle(bundle_dir: Path, rounds: int | None = None, warmup: int = 2) -> dict:
    """Check and time every candidate of the bundle against its reference; the results."""
    bundle = json.loads((bundle_dir / BUNDLE_JSON).read_text())
    function = bundle["function"]
    inputs = load_inputs(bundle_dir)
    reference = bundle_dir / bundle["reference"]
    want = outputs_of(reference, function, inputs)
    candidates = [c for case in bundle["cases"] for c in case["candidates"]]
    status: dict[str, str] = {}
    for c in candidates:
        try:
            got = outputs_of(bundle_dir / c["file"], function, inputs)
        except Exception as e:  # a candidate that cannot run is a result, not the end
            status[c["name"]] = f"failed: {type(e).__name__}: {e}"[:300]
            continue
        status[c["name"]] = "ok" if same_outputs(got, want) else "mismatch"
    timed = [c for c in candidates if status[c["name"]] == "ok"]
    timings = time_interleaved(
        [reference, *(bundle_dir / c["file"] for c in timed)],
        function,
        inputs,
        warmup=warmup,
        rounds=rounds or bundle.get("rounds", 5),
    )
    base = timings[0]
    rows = {name: {"status": s} for name, s in status.items()}
    for c, t in zip(timed, timings[1:], strict=True):
        rows[c["name"]].update(t.to_json(), relative=t.median_s / base.median_s)
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "reference": base.to_json(),
        "candidates": rows,
        "bundle": bundle,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m myelin.tuning.time_bundle", description=__doc__)
    ap.add_argument("bundle", type=Path, help="the folder `plex tune --bundle` wrote")
    ap.add_argument("-o", "--output", type=Path, required=True, help="folder for results.json")
    ap.add_argument("--rounds", type=int, default=None, help="timing rounds (default: bundle's)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed calls per artifact first")
    a = ap.parse_args(argv)
    if not (a.bundle / BUNDLE_JSON).is_file():
        print(f"error: {a.bundle}: no {BUNDLE_JSON}; pass the folder `plex tune --bundle` wrote")
        return 2
    results = time_bundle(a.bundle, a.rounds, a.warmup)
    a.output.mkdir(parents=True, exist_ok=True)
    (a.output / RESULTS_JSON).write_text(json.dumps(results, indent=1))
    ok = [r for r in results["candidates"].values() if r["status"] == "ok"]
    best = min((r["relative"] for r in ok), default=None)
    best_text = f"best {best:.3f}x the reference's time" if best is not None else "none ran right"
    print(f"{len(ok)}/{len(results['candidates'])} candidates ok, {best_text}")
    print(f"wrote {a.output / RESULTS_JSON}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
