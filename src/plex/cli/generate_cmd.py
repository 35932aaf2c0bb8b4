"""`plex generate`: stream text from a causal-LM artifact (frontend = "causal-lm")."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from plex.cli.options import artifact_argument, variant_option


def generate(
    artifact: Path = artifact_argument(),
    prompt: list[str] = typer.Option(
        ...,
        "--prompt",
        "-p",
        help="Text to continue. Repeat for a batch (at most the model's max_batch).",
    ),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", "-n", min=1, help="Tokens to add."),
    temperature: float = typer.Option(
        0.0, "--temperature", min=0.0, help="0 picks the most likely token (greedy)."
    ),
    top_k: int = typer.Option(0, "--top-k", min=0, help="Sample among the k likeliest (0: all)."),
    top_p: float = typer.Option(
        1.0, "--top-p", min=0.0, max=1.0, help="Sample within this probability mass."
    ),
    repetition_penalty: float = typer.Option(
        1.0, "--repetition-penalty", help="Above 1 discourages tokens already present."
    ),
    seed: int = typer.Option(None, "--seed", help="Seed of the sampler (same seed, same text)."),
    stop: list[str] = typer.Option([], "--stop", help="Stop at this text. Repeatable."),
    ignore_eos: bool = typer.Option(
        False, "--ignore-eos", help="Keep going past the model's end-of-sequence token."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print one JSON object (texts, tokens, timings) instead of a stream."
    ),
    variant: str = variant_option("Use this variant instead of the first that fits this machine."),
    trust: Path = typer.Option(
        None,
        "--trust",
        help="Run the file only if this public key (PEM) signed it (plex sign).",
        metavar="PUB",
    ),
) -> None:
    """Generate text with a language model built from a Hugging Face folder.

    Streams the continuation of each prompt, then prints time to first token, prefill
    tokens/s and decode tokens/s. Example:

        plex generate lm.mln --prompt "Once upon a time" --max-new-tokens 64
    """
    import myelin
    from myelin.runtime.generation import Generator, Sampling

    sampling = Sampling(
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        repetition_penalty=repetition_penalty,
        seed=seed,
    )
    model = myelin.Instance(trust=trust).load(artifact, variant=variant)
    with Generator(model) as generator:
        stream = generator.stream(
            prompt if len(prompt) > 1 else prompt[0],
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            stop_strings=stop,
            use_eos=not ignore_eos,
        )
        if as_json:
            for _ in stream:
                pass
        else:
            _print_stream(stream, prompt)
        result = stream.result
    assert result is not None
    summary = {
        "time_to_first_token_s": round(result.time_to_first_token_s, 6),
        "prefill_tokens_per_s": round(result.prefill_tokens_per_s, 2),
        "decode_tokens_per_s": round(result.decode_tokens_per_s, 2),
        "prompt_tokens": result.prompt_tokens,
        "new_tokens": sum(len(t) for t in result.tokens),
    }
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "texts": result.texts,
                    "tokens": result.tokens,
                    "stop_reasons": result.stop_reasons,
                    **summary,
                }
            )
        )
        return
    from rich.console import Console

    Console(stderr=True, highlight=False, soft_wrap=True).print(
        f"[dim]time to first token {result.time_to_first_token_s * 1e3:.1f} ms, "
        f"prefill {result.prefill_tokens_per_s:.1f} tokens/s, "
        f"decode {result.decode_tokens_per_s:.1f} tokens/s "
        f"({summary['new_tokens']} new tokens)[/dim]"
    )


def _print_stream(stream, prompts: list[str]) -> None:
    """One prompt streams as it comes; several print each text once it is complete (their
    tokens interleave)."""
    from rich.console import Console

    console = Console(highlight=False, soft_wrap=True)
    if len(prompts) == 1:
        console.print(prompts[0], style="bold", end="")
        for step in stream:
            if step.text:
                console.print(step.text, end="", markup=False)
                sys.stdout.flush()
        console.print()
        return
    for _ in stream:
        pass
    for prompt, text in zip(prompts, stream.result.texts, strict=True):
        console.print(prompt, style="bold", end="")
        console.print(text, markup=False)
