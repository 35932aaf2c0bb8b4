"""The tiny causal LMs of tiny_models.py built the way a user builds one (a package whose graph
is the model folder, an app over it), and transformers' own greedy generation to compare with:
the one place the tests of tests/llm get them from."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import build_app
from tests.llm.tiny_models import write_model

PROMPT = "the quick brown fox"
MAX_SEQ = 128


def build_causal_lm(
    root: Path,
    family: str = "llama",
    *,
    max_seq: int = MAX_SEQ,
    max_batch: int = 1,
    graph: str = "",
    app: str = "",
    config: dict[str, object] | None = None,
) -> Path:
    """`family`'s tiny model (seed 0; `config` replaces config keys) under root/lm, built to
    root/lm.mln. `graph` adds lines to the causal-lm graph's table (e.g. `dtype = "float16"`),
    `app` to the app manifest (e.g. a `[weights.codec]` or `[devices.gpu]` table)."""
    write_model(root / "lm" / "model", family, **(config or {}))
    graph_lines = [
        "[package]",
        'name = "lm"',
        "",
        "[graph.lm]",
        'source = "model"',
        'frontend = "causal-lm"',
        f"max_seq = {max_seq}",
        f"max_batch = {max_batch}",
        graph,
    ]
    (root / "lm" / "plex.toml").write_text("\n".join(graph_lines) + "\n")
    (root / "app.toml").write_text(f'[app]\nname = "lm"\npackages = ["lm"]\n\n{app}\n')
    return build_app(root / "app.toml", root / "lm.mln")


def transformers_greedy(folder: Path, prompt: list[int], new_tokens: int) -> list[int]:
    """transformers' own greedy `generate`, never stopping early (as use_eos=False)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    model.generation_config.eos_token_id = None
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()
