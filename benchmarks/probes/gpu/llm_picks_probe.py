"""Checks a causal LM's device-side greedy tokens on the GPU: the reduction against numpy's
argmax of the same call's logits, and the host reads of a submitted call's tokens (queued right
behind it, and after it), then times the queued greedy loop against host picks.

    device: source benchmarks/gpu/runtime_env.sh; python3 benchmarks/probes/gpu/llm_picks_probe.py
    (after benchmarks/gpu/llm/build.py; carry [".whl", "benchmarks/gpu/artifacts/llm"])
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(REPO / "benchmarks" / "gpu" / "llm")]

import run_llm  # noqa: E402

import myelin  # noqa: E402
from myelin.runtime.generation import Generator  # noqa: E402


def check(mln: Path, batch: int) -> dict:
    out: dict = {}
    g = Generator(myelin.Instance().load(mln))
    prompt = 512
    ids = np.random.default_rng(0).integers(3, 500, size=(batch, prompt), dtype=np.int64)
    mask = np.ones((batch, prompt), dtype=np.int64)
    pos = np.broadcast_to(np.arange(prompt, dtype=np.int64), (batch, prompt)).copy()
    prefill = g._static_prefills.get(512, g._prefill)
    logits, picks = prefill(ids, pos, mask, output="numpy")
    out["call_numpy_picks"] = picks[:, 0].tolist()
    out["argmax_of_logits"] = np.argmax(logits, axis=1).tolist()
    _, pk = prefill(ids, pos, mask, output="device")
    out["call_device_then_to_host"] = np.asarray(pk.to_host())[:, 0].tolist()
    p = prefill.submit(ids, pos, mask)
    read = p.read(1)
    p.result()
    out["submit_read_queued"] = read.result()[:, 0].tolist()
    p = prefill.submit(ids, pos, mask)
    p.result()
    out["submit_then_read_after"] = p.read(1).result()[:, 0].tolist()
    out["unchained"] = [prefill._unchained, g._decode._unchained]
    # a decode on device picks vs numpy picks
    m2 = np.ones((batch, prompt + 1), dtype=np.int64)
    p2 = np.full((batch, 1), prompt, dtype=np.int64)
    prefill(ids, pos, mask, output="numpy")
    l3, k3 = g._decode(np.asarray(out["argmax_of_logits"])[:, None], p2, m2, output="numpy")
    out["decode_picks"] = k3[:, 0].tolist()
    out["decode_argmax"] = np.argmax(l3, axis=1).tolist()
    g.close()
    return out


def main() -> None:
    artifacts = REPO / "benchmarks/gpu/artifacts/llm"
    index = json.loads((artifacts / "llm.json").read_text())
    index["builds"] = [x for x in index["builds"] if x["family"] == "llama"]
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        status = run_llm.rebuild_all(index, artifacts, Path(tmp))
        for b in index["builds"]:
            try:
                result[b["name"]] = check(Path(status[b["name"]]["mln"]), b["batch"])
            except Exception:
                import traceback

                result[b["name"]] = {"error": traceback.format_exc()[-3000:]}
            print(json.dumps({b["name"]: result[b["name"]]}), flush=True)


if __name__ == "__main__":
    main()
