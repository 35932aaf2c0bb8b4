"""Run the placement example: embed (CPU) -> blocks (GPU) -> head (CPU), chained with device
arrays, and check the logits against numpy.

    python examples/placement/run.py [placement.mln]   (default: build app.toml first)

Needs only iree-base-runtime, numpy and src/ on PYTHONPATH when given a built .mln (that is how it
runs on the GPU machine). Without CUDA the runtime picks the CPU-only variant.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def load_weights(path: Path) -> dict[str, np.ndarray]:
    """safetensors without the safetensors package (the GPU machine's runtime needs none)."""
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    out = {}
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        assert entry["dtype"] == "F32"
        begin, end = (8 + length + o for o in entry["data_offsets"])
        out[key] = np.frombuffer(data[begin:end], np.float32).reshape(entry["shape"])
    return out


def reference(ids: np.ndarray) -> np.ndarray:
    w = load_weights(HERE / "params.safetensors")
    h = w["embed.table"][ids]
    for i in range(2):
        h = h + np.maximum(h @ w[f"blocks.{i}.w1"] + w[f"blocks.{i}.b1"], 0) @ w[f"blocks.{i}.w2"]
    return h @ w["head.w"]


def chain(model, ids: np.ndarray) -> np.ndarray:
    """embed -> blocks -> head, passing device arrays: each graph's output stays on its device
    and moves device to device into the next graph's. (A function, so that no device array
    outlives it: IREE objects still alive at interpreter exit can crash its teardown.)"""
    with model.session() as s:
        embedded = s.call("embed", ids, output="device")
        hidden = s.call("blocks", embedded, output="device")
        for name, array in (("embed", embedded), ("blocks", hidden)):
            device = model.device_names[model.devices.index(array._device)]
            print(f"  {name} output lives on {device}")
        return s.call("head", hidden)


def main(argv: list[str]) -> int:
    if argv:
        mln = Path(argv[0])
    else:
        from plex.builder import build

        mln = build(HERE / "app.toml", Path("placement.mln")).output
    import myelin

    instance = myelin.Instance()
    model = instance.load(mln)
    print(f"variant {model.variant_name!r} (drivers here: {', '.join(instance.drivers())})")
    for e in model.variant["entrypoints"]:
        print(f"  {e['name']:7s} runs on {e['device']}")
    ids = np.array([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3]], np.int64).reshape(-1)
    logits = chain(model, ids)
    expected = reference(ids)
    error = float(np.abs(logits - expected).max() / np.abs(expected).max())
    for (source, target, method), count in sorted(instance.device_registry.transfers.items()):
        print(f"  moved {count.count}x {count.bytes} B {source} -> {target} ({method})")
    ok = error < 1e-3
    verdict = "OK" if ok else "FAIL"
    print(f"logits {logits.shape}: max relative error {error:.2e} vs numpy: {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
