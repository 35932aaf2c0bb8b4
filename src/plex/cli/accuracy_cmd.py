"""`plex accuracy`: what a weight codec costs in accuracy and buys in size.

Builds the app twice, with its codecs and with every codec off (both through the normal cache,
so the fp32 build is the same artifact `plex build` makes), runs both on the same inputs and
prints, per output, the error of the codec build against the fp32 one. Without --input the
inputs are random: floats from a normal distribution, and integer inputs that index a table
uniformly over the range the artifact records for them. What can be refused is refused before the
second build: a codec that encoded no parameter (there is nothing to compare) and, without
--input, an integer input whose valid range is unknown (random integers would mean nothing).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from plex.cli.build_cmd import _size
from plex.cli.options import app_toml_argument, function_option, inputs_option, jobs_option
from plex.errors import PlexError

if TYPE_CHECKING:
    import numpy as np


def accuracy(
    app_toml: Path = app_toml_argument(),
    codec: str = typer.Option(
        None,
        "--codec",
        help="Encode every parameter the rules allow with this codec (fp16, bf16, int8, q4, "
        'q4:g<group>), as if [weights.codec] ended with "*" = CODEC. Default: the app\'s codecs.',
        metavar="CODEC",
    ),
    function: str = function_option("Entrypoint to compare (default: every entrypoint).", None),
    inputs: list[str] = inputs_option(
        "An argument: @file.npy or SHAPExTYPE=VALUES, repeated in argument order. Default: "
        "random values (seed 0), every dynamic dim 2: floats from a normal distribution, "
        "token ids uniform over the range the artifact records for them."
    ),
    jobs: int = jobs_option("Most build steps at once."),
    keep: Path = typer.Option(
        None,
        "--keep",
        help="Keep the two .mln files in this folder (codec.mln, fp32.mln).",
        metavar="DIR",
    ),
) -> None:
    """Build the codec and fp32 variants of an app and compare their outputs on the same inputs:
    max and mean relative error and cosine similarity, plus the parameter bytes of each."""
    import shutil
    import tempfile
    from dataclasses import replace

    from myelin.codecs import check_codec_name
    from plex.builder.plan import codec_policy
    from plex.cli.build_cmd import quiet_model_progress_bars
    from plex.cli.paths import resolve_app
    from plex.extras import require_for_app
    from plex.manifest import load_app
    from plex.tensor_args import parse_tensor_arg

    app_toml = resolve_app(app_toml)
    args = [parse_tensor_arg(text) for text in inputs]  # a typo fails before any build
    quiet_model_progress_bars()
    app = load_app(app_toml)
    require_for_app(app)  # the two builds below go round the builder's own check
    if codec is not None:
        try:
            check_codec_name(codec)
        except ValueError as e:
            raise PlexError(f"--codec: {e}") from None
        coded = replace(app, codecs=(*app.codecs, ("*", codec)))
    else:
        coded = app
    if all(codec_policy(coded, g).trivial for g in coded.graphs):
        raise PlexError(
            f"{app_toml.name} applies no weight codec; give --codec (e.g. --codec int8) or add "
            "[weights.codec] to the app"
        )
    reference = replace(
        app,
        codecs=(),
        graphs=tuple(
            replace(g, weights=replace(g.weights, codec="fp32")) if g.weights else g
            for g in app.graphs
        ),
    )
    folder = keep or Path(tempfile.mkdtemp(prefix="plex-accuracy-"))
    folder.mkdir(parents=True, exist_ok=True)
    built: dict[str, Path] = {}
    try:
        built["codec"] = _build(coded, folder / "codec.mln", jobs)
        _check_comparable(built["codec"], codec, function, args)
        built["fp32"] = _build(reference, folder / "fp32.mln", jobs)
        _compare(built["codec"], built["fp32"], function, args)
    finally:
        if keep is None:  # our own temporary folder: nothing in it is the user's
            shutil.rmtree(folder, ignore_errors=True)


def _check_comparable(coded: Path, codec: str | None, function: str | None, given: list) -> None:
    """Refuse, before the fp32 build, a comparison that cannot say anything: no parameter was
    encoded (every error would be 0), or an entrypoint takes integers whose valid range the
    artifact does not record and no --input was given."""
    import myelin
    from myelin.codecs import parameter_rows

    model = myelin.Instance().load(coded)
    try:
        rows = parameter_rows(model.manifest["parameters"])
        if not any(r.codec not in ("none", "fp32") for r in rows):
            what = f"--codec {codec}" if codec else "the app's [weights.codec]"
            if not rows:
                why = "the model has no parameters"
            else:
                reasons = sorted({r.rule for r in rows if r.rule})
                why = f"all {len(rows)} parameters stay as they are" + (
                    f" ({'; '.join(reasons[:2])})" if reasons else ""
                )
            raise PlexError(f"{what} encoded no parameter: {why}; there is nothing to compare")
        if not given:
            for name in _entrypoint_names(model, function):
                _inputs_for(model.entrypoint(name), given)  # raises for integers without range
    finally:
        model.close()


def _entrypoint_names(model, function: str | None) -> list[str]:
    """The entrypoints to compare: the one asked for, else each function once (a
    module-qualified alias names the same one)."""
    if function:
        return [function]
    seen: dict[tuple[str, str], str] = {}
    for name, e in model.entrypoints.items():
        seen.setdefault((e.module, e.function), name)
    return list(seen.values())


def _build(app, output: Path, jobs: int | None) -> Path:
    from plex.builder import default_cache_dir
    from plex.builder.plan import BuildRequest, plan_build
    from plex.builder.versions import fingerprint_salt
    from plex.cli.build_cmd import announce_interrupt
    from synapse import BuildFailed, Cache, Executor, make_progress

    plan = plan_build(app, BuildRequest(output=output.resolve()))
    with make_progress("plain", sys.stderr) as plain, announce_interrupt(plain) as sink:
        executor = Executor(
            Cache(default_cache_dir(app)),
            jobs=jobs or app.build.jobs,
            salt=fingerprint_salt(),
            on_event=sink,
            memory_budget=app.build.temp_memory,
        )
        try:
            executor.run(plan)
        except BuildFailed as e:
            if isinstance(e.__cause__, PlexError):
                raise e.__cause__ from None
            raise PlexError(str(e)) from e
    return output


def _inputs_for(entry, given: list[np.ndarray]) -> list[np.ndarray]:
    import numpy as np

    if given:
        return given
    rng = np.random.default_rng(0)
    args = []
    for spec in entry.signature.inputs:
        shape = () if spec.shape is None else tuple(2 if d is None else d for d in spec.shape)
        if spec.dtype.startswith(("float", "bfloat")):
            args.append(rng.standard_normal(shape).astype(np.float32).astype(spec.dtype))
        elif spec.valid_range is not None:  # indices into a table: any in-range value is valid
            lo, hi = spec.valid_range
            args.append(rng.integers(lo, hi, size=shape).astype(spec.dtype))
        else:
            raise PlexError(
                f"entrypoint {entry.name} takes {spec.describe()}, an integer input whose valid "
                "values the artifact does not record; give its values with --input (e.g. "
                "--input @ids.npy), one per argument"
            )
    return args


def _compare(coded: Path, reference: Path, function: str | None, given: list) -> None:
    import numpy as np

    import myelin
    from myelin.codecs import bytes_by_codec

    instance = myelin.Instance()
    models = {"codec": instance.load(coded), "fp32": instance.load(reference)}
    try:
        names = _entrypoint_names(models["codec"], function)
        for label, path in (("codec", coded), ("fp32", reference)):
            totals = bytes_by_codec(models[label].manifest["parameters"])
            parts = ", ".join(f"{c} {_size(b)}" for c, (b, _) in totals.items())
            typer.echo(f"{label} build: {_size(path.stat().st_size)} ({parts})")
        typer.echo(
            f"{'entrypoint':<16} {'output':<8} {'max rel err':>12} {'mean rel err':>13} "
            f"{'cosine':>10} {'row cosine (mean / min)':>24}"
        )
        for name in names:
            entry = models["codec"].entrypoint(name)
            args = _inputs_for(entry, given)
            outputs = {}
            for label, model in models.items():
                with model.session() as session:
                    result = session.call(name, *args)
                outputs[label] = list(result) if isinstance(result, tuple) else [result]
            results = zip(entry.signature.outputs, outputs["codec"], outputs["fp32"], strict=True)
            for spec, a, b in results:
                typer.echo(_row(name, spec.name, np.asarray(a), np.asarray(b)))
        typer.echo(ERROR_DEFINITION)
    finally:
        for model in models.values():
            model.close()


# printed under the table: the columns' meaning is part of the report, not of a manual
ERROR_DEFINITION = (
    "rel err = |codec - fp32| / max |fp32|, per element of an output; max and mean over its "
    "elements (mean <= max)\ncosine: of the flattened outputs; row cosine: of each row (last "
    "axis), mean and min"
)


def error_stats(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """Errors of `a` (codec) against `b` (fp32), as ERROR_DEFINITION says: the relative error of
    each element is |a-b| over the output's largest |b| (one scale for every element, so values
    near zero do not blow it up), reported as its max and its mean; cosine of the flattened
    tensors, and mean and min cosine over rows (last axis)."""
    import numpy as np

    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    scale = max(float(np.abs(b64).max()), 1e-30) if b.size else 1.0
    relative = np.abs(a64 - b64) / scale
    stats = {
        "max_rel": float(relative.max()) if b.size else 0.0,
        "mean_rel": float(relative.mean()) if b.size else 0.0,
        "cosine": _cosine(a64.reshape(-1), b64.reshape(-1)),
    }
    if a.ndim >= 2:
        rows_a, rows_b = a64.reshape(-1, a.shape[-1]), b64.reshape(-1, b.shape[-1])
        cos = [_cosine(x, y) for x, y in zip(rows_a, rows_b, strict=True)]
        stats["row_cosine_mean"], stats["row_cosine_min"] = float(np.mean(cos)), float(min(cos))
    return stats


def _cosine(x: np.ndarray, y: np.ndarray) -> float:
    import numpy as np

    nx, ny = np.linalg.norm(x), np.linalg.norm(y)
    if nx == 0 or ny == 0:
        return 1.0 if nx == ny else 0.0
    return float(np.dot(x, y) / (nx * ny))


def _row(name: str, output: str, a: np.ndarray, b: np.ndarray) -> str:
    import numpy as np

    if not np.issubdtype(b.dtype, np.floating):
        same = "identical" if np.array_equal(a, b) else f"{int((a != b).sum())} values differ"
        return f"{name:<16} {output:<8} {same}"
    s = error_stats(a, b)
    rows = (
        f"{s['row_cosine_mean']:.6f} / {s['row_cosine_min']:.6f}" if "row_cosine_mean" in s else "-"
    )
    return (
        f"{name:<16} {output:<8} {s['max_rel']:>12.3e} {s['mean_rel']:>13.3e} "
        f"{s['cosine']:>10.6f} {rows:>24}"
    )
