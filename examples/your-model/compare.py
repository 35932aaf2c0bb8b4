"""Compare a built .mln with torch eager on the same inputs: the largest difference of every
output, and the median time of a call on each side.

    .venv/bin/python examples/your-model/compare.py MODEL_PY ARTIFACT [--batch N] [--calls N]

MODEL_PY is the file whose `build()` the package's source names (it returns the torch module
and its example inputs); the example is repeated to N rows along dim 0, so a dynamic batch is
exercised. Outputs are matched by name, as the frontend names them (`logits`, `output0`). It
exits 1 when an output differs by more than --tolerance times its largest |torch| value.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

import myelin


def load_build(model_py: Path) -> Callable:
    spec = importlib.util.spec_from_file_location(model_py.stem, model_py)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build


def named_outputs(result: object) -> dict[str, np.ndarray]:
    """torch's result under the names the artifact gives it (docs/frontends.md)."""
    if isinstance(result, torch.Tensor):
        result = (result,)
    if isinstance(result, tuple):
        return {f"output{i}": t.numpy() for i, t in enumerate(result)}
    return {k: v.numpy() for k, v in result.items() if isinstance(v, torch.Tensor)}


def median_ms(call: Callable[[], object], calls: int) -> float:
    call()  # warm-up
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_py", type=Path)
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--tolerance", type=float, default=1e-4)
    args = parser.parse_args()

    with torch.no_grad():
        module, example = load_build(args.model_py)()
    named = example if isinstance(example, dict) else dict(enumerate(example))
    inputs = {k: t[:1].repeat(args.batch, *[1] * (t.dim() - 1)) for k, t in named.items()}

    def eager() -> object:
        with torch.no_grad():
            if isinstance(example, dict):
                return module(**inputs)
            return module(*inputs.values())

    model = myelin.Instance().load(args.artifact)
    signature = model.entrypoint("forward").signature
    arrays = [t.numpy() for t in inputs.values()]
    with model.session() as session:
        forward = session.resolve("forward")
        results = forward(*arrays)
        results = results if isinstance(results, tuple) else (results,)
        reference = named_outputs(eager())
        pairs = zip(signature.inputs, arrays, strict=True)
        print("inputs " + ", ".join(f"{t.name}={'x'.join(map(str, a.shape))}" for t, a in pairs))
        names = [t.name for t in signature.outputs]
        for name, value in zip(names, results, strict=True):
            diff = float(np.max(np.abs(value - reference[name])))
            print(f"{name}: max |plex - torch| = {diff:.2e}")
            allowed = args.tolerance * max(float(np.max(np.abs(reference[name]))), 1.0)
            if not diff <= allowed:  # NaN fails too
                raise SystemExit(f"error: {name} differs from torch by more than {allowed:.1e}")
        plex_ms = median_ms(lambda: forward(*arrays), args.calls)
    torch_ms = median_ms(eager, args.calls)
    print(f"median per call: plex {plex_ms:.2f} ms, torch eager {torch_ms:.2f} ms")


if __name__ == "__main__":
    main()
