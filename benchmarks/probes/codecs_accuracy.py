"""Accuracy and size per weight codec, against the fp32 build, on the two example models: the
tables of docs/codecs.md ("Measured").

    python benchmarks/probes/codecs_accuracy.py [--models minilm,llama]
        [--codecs fp16,bf16,int8,q4,q4:g16]
                                         [--steps 16] [--out DIR] [--mln-dir DIR]

Every artifact is built through the normal build (and its cache) from the example package with
`[weights.codec] "*" = <codec>`, and run by MyeLiN.

- minilm (examples/minilm): the 32 sentences of sentences.txt in one batch; cosine of each
  sentence embedding against the fp32 artifact's, mean and min. "Linear weights" are the 36
  encoder matrices (stored bytes of their parts, against their fp32 bytes).
- llama (examples/llama): prefill of a fixed prompt, then greedy decoding for --steps tokens;
  the first step whose token differs from fp32's. Teacher-forced: every build is fed the fp32
  build's tokens, so the logits of each step are compared on the same context (top-1 agreement,
  max relative error, cosine).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from codec_builds import build_codec

REPO = Path(__file__).resolve().parents[2]
PROMPT = [1, 306, 4658, 278, 6635, 29892]


def example(model: str):
    """The example's model.py as a module (examples are folders, not packages)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        f"{model}_example", REPO / "examples" / model / "model.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    sys.path.insert(0, str(REPO / "examples" / model))
    spec.loader.exec_module(module)
    return module


def linear_bytes(path: Path) -> tuple[int, int]:
    """(stored bytes, fp32 bytes) of MiniLM's 36 encoder matrices, all parts included."""
    from myelin.mln import MlnReader

    with MlnReader(path) as reader:
        params = reader.manifest["parameters"]
    logical = {
        p["key"]: p
        for p in params
        if p.get("role", "data") == "data"
        and ".encoder.layer." in p["key"]
        and p["key"].endswith(".weight")
        and len(p["shape"]) == 2
    }
    stored = sum(p["length"] for p in params if p.get("of", p["key"]) in logical)
    fp32 = sum(4 * int(np.prod(p["shape"])) for p in logical.values())
    assert len(logical) == 36, sorted(logical)
    return stored, fp32


def minilm(codecs: list[str], folder: Path) -> None:
    import myelin

    module = example("minilm")
    sentences = (REPO / "examples" / "minilm" / "sentences.txt").read_text().splitlines()
    ids, mask = module.tokenize(sentences)
    paths = {c: build_codec("minilm", c, folder, prefix="minilm_") for c in ["fp32", *codecs]}
    out = {}
    for codec, path in paths.items():
        model = myelin.Instance().load(path)
        with model.session() as s:
            out[codec] = s.call("forward", ids, mask)
        model.close()
    ref = out["fp32"]
    size0 = paths["fp32"].stat().st_size
    _, lin0 = linear_bytes(paths["fp32"])
    print("\n### all-MiniLM-L6-v2\n")
    print("| codec | .mln | linear weights | mean cosine to fp32 | min cosine |")
    print("|---|---|---|---|---|")
    for codec, path in paths.items():
        e = out[codec]
        cos = (e * ref).sum(1) / np.linalg.norm(e, axis=1) / np.linalg.norm(ref, axis=1)
        size = path.stat().st_size
        lin, _ = linear_bytes(path)
        print(
            f"| {codec} | {size / 2**20:.1f} MiB ({size / size0:.3f}x) | {lin / 2**20:.2f} MiB "
            f"({lin / lin0:.3f}x) | {cos.mean():.6f} | {cos.min():.6f} |"
        )


def llama(codecs: list[str], folder: Path, steps: int, mln_dir: Path | None = None) -> None:
    import myelin

    module = example("llama")
    paths = {
        c: mln_dir / f"{c.replace(':', '_')}.mln"
        if mln_dir is not None and (mln_dir / f"{c.replace(':', '_')}.mln").exists()
        else build_codec("llama", c, folder, prefix="llama_")
        for c in ["fp32", *codecs]
    }
    runs = {}
    for codec, path in paths.items():
        model = myelin.Instance().load(path)
        with model.session() as s:
            prefill, decode = s.resolve("prefill"), s.resolve("decode")
            ids, _ = module.generate(prefill, decode, PROMPT, steps)
            runs[codec] = (ids, forced_logits(prefill, decode, runs.get("fp32", (ids,))[0]))
        model.close()
    ref_ids, ref_logits = runs["fp32"]
    print("\n### Llama-style decoder\n")
    print(
        f"| codec | .mln | greedy tokens ({steps} steps) | teacher-forced: top-1 agreement | "
        "logits max rel. error (max / mean over steps) | logits cosine (mean / min) |"
    )
    print("|---|---|---|---|---|---|")
    for codec, (ids, logits) in runs.items():
        first = next((i for i, (a, b) in enumerate(zip(ids, ref_ids, strict=True)) if a != b), None)
        tokens = (
            "reference"
            if codec == "fp32"
            else ("**identical**" if first is None else f"differ from step {first + 1}")
        )
        pairs = list(zip(logits, ref_logits, strict=True))
        agree = sum(int(np.argmax(a) == np.argmax(b)) for a, b in pairs)
        errs = [np.abs(a - b).max() / np.abs(b).max() for a, b in pairs]
        coss = [float((a * b).sum() / np.linalg.norm(a) / np.linalg.norm(b)) for a, b in pairs]
        print(
            f"| {codec} | {paths[codec].stat().st_size / 2**20:.1f} MiB | {tokens} | "
            f"{agree}/{len(logits)} | {max(errs):.1e} / {np.mean(errs):.1e} | "
            f"{np.mean(coss):.6f} / {min(coss):.6f} |"
        )


def forced_logits(prefill, decode, tokens: list[int]) -> list[np.ndarray]:
    """The logits of every step when the model is fed `tokens` (the reference's)."""
    logits, k, v = prefill(np.array([PROMPT], dtype=np.int64))
    out = [np.asarray(logits)[0]]
    for i, token in enumerate(tokens[:-1]):
        pos = np.array([len(PROMPT) + i], dtype=np.int64)
        logits, k, v = decode(np.array([[token]], dtype=np.int64), pos, k, v)
        out.append(np.asarray(logits)[0])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="minilm,llama")
    parser.add_argument("--codecs", default="fp16,bf16,int8,q4,q4:g16")
    parser.add_argument("--steps", type=int, default=16, help="greedy steps of the decoder")
    parser.add_argument("--out", type=Path, help="keep the .mln files here")
    parser.add_argument(
        "--mln-dir", type=Path, help="llama: use <codec>.mln from here where it exists (else build)"
    )
    args = parser.parse_args()
    folder = args.out or Path(tempfile.mkdtemp(prefix="codecs-accuracy-"))
    folder.mkdir(parents=True, exist_ok=True)
    codecs = [c for c in args.codecs.split(",") if c != "fp32"]
    print(f"# codecs_accuracy.py, {time.strftime('%Y-%m-%d')}")
    if "minilm" in args.models:
        minilm(codecs, folder)
    if "llama" in args.models:
        llama(codecs, folder, args.steps, args.mln_dir)


if __name__ == "__main__":
    main()
