"""Where a torch graph's import time goes: a 2-layer BERT and GPT-2 at their real widths (768
hidden, their real vocabularies, seeded weights), each through the torch frontend's steps timed
one by one, then IREE's input phase, as `plex build`'s import step runs them.

    .venv/bin/python benchmarks/import_time.py [--rounds 2] [--models bert gpt2]

Columns (seconds, wall and CPU of this process; the median over rounds): `source` builds the
model (the user's function), `export` is torch.export (with how many export attempts: each
suggested range that torch.export asks for costs one more), `decompose` our decomposition table
and rewrites, `turbine` the FX -> torch-dialect import, `lower` torch -> linalg (IREE's torch
passes, run by PLeX), `values` copying the weights into numpy, `input` IREE's input phase on
the result (import_graph). Each round imports a fresh model, in one process, as the build's
import worker does after its first graph (imports of torch, transformers and IREE are not
counted).

Before/after: run it with PYTHONPATH pointing at each revision's `src/` in turn.
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

MODEL_PY = """
import torch, transformers

def bert():
    torch.manual_seed(0)
    config = transformers.BertConfig(num_hidden_layers=2)
    ids = torch.randint(0, config.vocab_size, (1, 16))
    return transformers.AutoModel.from_config(config).eval(), {
        "input_ids": ids, "attention_mask": torch.ones_like(ids)}

def gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2)
    ids = torch.randint(0, config.vocab_size, (1, 16))
    return transformers.GPT2LMHeadModel(config).eval(), {
        "input_ids": ids, "attention_mask": torch.ones_like(ids)}
"""
DYNAMIC = {
    "input_ids": {0: "batch", 1: "seq"},
    "attention_mask": {0: "batch", 1: "seq"},
}
STEPS = ("source", "export", "decompose", "turbine", "lower", "values", "input")


class Clock:
    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        wall, cpu = time.perf_counter(), time.process_time()
        yield
        self.wall[name] = self.wall.get(name, 0.0) + time.perf_counter() - wall
        self.cpu[name] = self.cpu.get(name, 0.0) + time.process_time() - cpu


def counted(module: Any, name: str, counter: list[int]) -> Callable[[], None]:
    """Count calls of module.name; returns the undo."""
    original = getattr(module, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        counter[0] += 1
        return original(*args, **kwargs)

    setattr(module, name, wrapper)
    return lambda: setattr(module, name, original)


def import_once(source: Path, symbol: str) -> tuple[Clock, int]:
    """The steps of myelin.frontends.torch.to_mlir, then import_graph, each timed."""
    from myelin.compiler.pipeline import import_graph
    from myelin.frontends import FrontendRequest
    from myelin.frontends import torch as frontend
    from myelin.frontends._torch_fixes import decomposition_table, float_scalar_comparisons
    from myelin.frontends._torch_source import call_source, entries, imported_source

    request = FrontendRequest(
        source=source, symbol=symbol, module_name=symbol, scope=f"b.{symbol}", dynamic=DYNAMIC
    )
    clock, exports = Clock(), [0]
    undo = counted(frontend, "_trace_once", exports)
    try:
        with frontend._quiet_export_warnings(), imported_source(source) as module:
            with clock.step("source"):
                value = call_source(module, source, symbol)
                found = entries(value, what=symbol, entrypoints=None)
                frontend._caches_off(found)
                found = [frontend._widened(e, frontend._dims_for(e, DYNAMIC), []) for e in found]
            programs = {}
            for e in found:
                dims = frontend._dims_for(e, DYNAMIC)
                shapes = frontend._dynamic_shapes(e, dims, symbol)
                # before the one-export change, _trace took no dims (for before/after runs)
                extra = (dims,) if "dims" in inspect.signature(frontend._trace).parameters else ()
                with clock.step("export"):
                    program = frontend._trace(e, shapes, *extra, source.parent, symbol)
                with clock.step("decompose"):
                    program = program.run_decompositions(decomposition_table())
                    float_scalar_comparisons(program)
                programs[e.name] = program
            with clock.step("turbine"):
                tensors = frontend._externalize(programs, set(), request.scope, symbol)
                torch_mlir = frontend._import(programs)
            names = {
                n: (list(p.graph_signature.user_inputs), frontend.output_names(p))
                for n, p in programs.items()
            }
        with clock.step("lower"):
            mlir, keys = frontend._lower(torch_mlir, programs, names, request, symbol)
        with clock.step("values"):
            frontend._values(keys, tensors, request, symbol)
        with clock.step("input"):
            import_graph(
                mlir, input_type=frontend.LOWERED_INPUT_TYPE, module_name=symbol,
                scope=request.scope, what=symbol,
            )  # fmt: skip
    finally:
        undo()
    return clock, exports[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--models", nargs="+", default=["bert", "gpt2"])
    args = parser.parse_args()
    import torch  # noqa: F401  (loaded before timing: the build's worker has it loaded)
    import transformers  # noqa: F401

    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "models.py"
        source.write_text(MODEL_PY)
        print(f"{'model':6} {'':4} " + " ".join(f"{s:>9}" for s in (*STEPS, "total")) + "  exports")
        for model in args.models:
            runs = [import_once(source, model) for _ in range(args.rounds)]
            for kind in ("wall", "cpu"):
                values = [statistics.median(getattr(c, kind)[s] for c, _ in runs) for s in STEPS]
                cells = " ".join(f"{v:9.2f}" for v in (*values, sum(values)))
                print(f"{model:6} {kind:4} {cells}  {runs[0][1]}")


if __name__ == "__main__":
    main()
