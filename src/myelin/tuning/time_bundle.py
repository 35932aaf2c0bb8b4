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

from myelin.tuning.timing import outputs_of, same_outputs, time_interleaved, tuning_instance

BUNDLE_JSON = "bundle.json"
RESULTS_JSON = "results.json"
INPUTS_NPZ = "inputs.npz"


def load_inputs(bundle_dir: Path) -> list[np.ndarray]:
    """The bundle's inputs, in call order (saved by the compile half as arr_0, arr_1, ...)."""
    with np.load(bundle_dir / INPUTS_NPZ) as data:
        return [data[f"arr_{i}"] for i in range(len(data.files))]


def generated_inputs(specs: list[dict], seed: int) -> list[np.ndarray]:
    """Inputs made here from their shapes and a seed: a case whose inputs are too large to
    travel (a 470 MB GEMV weight) names them instead (values ~N(0, 0.1), as torch's are)."""
    rng = np.random.default_rng(seed)
    out = []
    for spec in specs:
        dtype = spec["dtype"]
        if dtype == "bfloat16":
            import ml_dtypes

            dtype = ml_dtypes.bfloat16
        values = rng.standard_normal(spec["shape"], dtype=np.float32) * np.float32(0.1)
        out.append(values.astype(dtype))
    return out


def time_bundle(bundle_dir: Path, rounds: int | None = None, warmup: int = 2) -> dict:
    """Check and time every candidate of the bundle against its reference; the results.

    A case may name its own `function` and `inputs` (shapes and dtypes, generated here from the
    bundle's seed): the kernel-config cases time one generated matmul function each."""

    bundle = json.loads((bundle_dir / BUNDLE_JSON).read_text())
    instance = tuning_instance()  # one for every artifact: one device, created once
    reference = bundle_dir / bundle["reference"]
    shared = load_inputs(bundle_dir) if (bundle_dir / INPUTS_NPZ).is_file() else None
    resident = bool(bundle.get("resident", False))
    rows: dict[str, dict] = {}
    references: dict[str, dict] = {}
    for index, case in enumerate(bundle["cases"]):
        if not case["candidates"]:
            continue
        function = case.get("function", bundle["function"])
        if "inputs" in case:
            inputs = generated_inputs(case["inputs"], bundle.get("seed", 0) + index)
        else:
            assert shared is not None, "a bundle without inputs.npz names each case's inputs"
            inputs = shared
        want = outputs_of(reference, function, inputs, instance)
        status: dict[str, str] = {}
        for c in case["candidates"]:
            try:
                got = outputs_of(bundle_dir / c["file"], function, inputs, instance)
            except Exception as e:  # a candidate that cannot run is a result, not the end
                status[c["name"]] = f"failed: {type(e).__name__}: {e}"[:300]
                continue
            tolerance = case.get("rtol")
            same = (
                same_outputs(got, want, rtol=tolerance, atol=tolerance)
                if tolerance
                else same_outputs(got, want)
            )
            status[c["name"]] = "ok" if same else "mismatch"
        timed = [c for c in case["candidates"] if status[c["name"]] == "ok"]
        timings = time_interleaved(
            [reference, *(bundle_dir / c["file"] for c in timed)],
            function,
            inputs,
            warmup=warmup,
            rounds=rounds or bundle.get("rounds", 5),
            resident=resident,
            instance=instance,
        )
        base = timings[0]
        references[case["dispatch"]] = base.to_json()
        rows.update({name: {"status": s} for name, s in status.items()})
        for c, t in zip(timed, timings[1:], strict=True):
            rows[c["name"]].update(t.to_json(), relative=t.median_s / base.median_s)
        del inputs, want
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "reference": next(iter(references.values()), {}),
        "references": references,
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
