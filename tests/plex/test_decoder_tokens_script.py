"""benchmarks/probes/gpu/decoder_tokens_h200.py without a GPU: a small CPU build of the benchmark
decoder (its model.py at a tiny Config, float32) with the two variant names the script runs,
then the script against torch on the CPU. Checks the script itself (the greedy loop over device
arrays, the token comparison, the files it writes), which otherwise runs only on the H200."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from plex.builder import build

REPO = Path(__file__).resolve().parents[2]
DECODER = REPO / "benchmarks" / "gpu" / "decoder" / "model.py"


def _tiny_decoder_app(folder: Path) -> Path:
    package = folder / "decoder"
    package.mkdir(parents=True)
    (package / "model.py").write_text(
        textwrap.dedent(f"""\
        import importlib.util
        import sys

        import torch

        spec = importlib.util.spec_from_file_location("bench_decoder", {str(DECODER)!r})
        bench = sys.modules["bench_decoder"] = importlib.util.module_from_spec(spec)
        sys.path.insert(0, {str(DECODER.parent)!r})  # for the llama_model.py beside it
        spec.loader.exec_module(bench)  # registered first: its dataclass looks itself up
        sys.path.pop(0)


        def build():
            c = bench.Config(vocab=128, dim=128, layers=2, heads=4, kv_heads=2, ffn=256,
                             batch=2, prompt=16, max_len=56, dtype=torch.float32)
            model = bench.make_decoder(c)
            inputs = bench.example_inputs(c)
            return {{"prefill": (model.prefill, inputs["prefill"]),
                     "decode": (model.decode, inputs["decode"])}}
        """)
    )
    plex_toml = (REPO / "benchmarks" / "gpu" / "decoder" / "plex.toml").read_text()
    (package / "plex.toml").write_text(plex_toml)
    (folder / "app.toml").write_text(
        textwrap.dedent("""\
        [app]
        name = "tiny-decoder"
        packages = ["decoder"]

        [devices.cpu]
        target = "llvm-cpu"
        cpu = "generic"

        [[variant]]
        name = "attention"
        devices = ["cpu"]

        [[variant]]
        name = "untuned"
        devices = ["cpu"]
        """)
    )
    return folder / "app.toml"


def test_the_decoder_tokens_script_runs_both_variants_and_compares_their_tokens(tmp_path):
    mln = tmp_path / "tiny.mln"
    build(_tiny_decoder_app(tmp_path / "app"), mln, cache_dir=tmp_path / "cache")
    out = tmp_path / "out"
    out.mkdir()
    script = REPO / "benchmarks" / "probes" / "gpu" / "decoder_tokens_h200.py"
    args = ["--mln", str(mln), "--torch-device", "cpu", "--steps", "6", "--rounds", "1"]
    done = subprocess.run(
        [sys.executable, str(script), *args, "--out-dir", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    results = json.loads((out / "decoder_tokens.json").read_text())
    assert set(results["tokens"]) == {"attention", "untuned", "torch"}
    assert [len(row) for row in results["tokens"]["attention"]] == [7, 7]  # 1 + 6 per sequence
    # float32 on the CPU: all three agree.
    assert set(results["compare"].values()) == {"identical"}, results["compare"]
    assert all(e < 1e-4 for e in results["first_step_logit_error"].values())
    assert "| attention |" in (out / "decoder_tokens.md").read_text()
