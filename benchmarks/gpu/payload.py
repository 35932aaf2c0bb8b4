"""Move a large .mln to the GPU machine without its weights, and rebuild them there.

The device call carries at most 64 MiB, and a decoder with Llama-7B-shaped layers stores 0.4-1.3
GB of parameters. Its weights are seeded, so the GPU machine can compute them again:

    here:  python benchmarks/gpu/payload.py strip BUILT.mln SKELETON_DIR
    there: python benchmarks/gpu/payload.py rebuild SKELETON_DIR=OUT.mln [...] \\
               --weights benchmarks/gpu/decoder7b/model.py:weights

`strip` writes the .mln's manifest (with every section's SHA-256 digest, the integrity records
the runtime checks) and its non-parameter sections (the compiled modules) into a folder.
`rebuild` gets the logical weights by name from `--weights` (a function returning
{key: array}, the values the torch frontend stored: the same seed, the same module), encodes
each parameter exactly as the build's encode step did (`myelin.codecs.choose_layout` and
`encode` with the codec, shape, dtype, contracted axes and storage order its manifest records:
the same numpy encoders), places every part at its recorded offset, writes the file with MyeLiN's
own writer (`myelin.mln.MlnWriter`) in the recorded section order, and checks that every
section's digest equals the recorded one: the rebuilt file is the built file (exit 1 otherwise).
The compiled module and the weights' names, shapes and encodings are what PLeX built.

`rebuild --placeholder` writes zero parameters instead (seconds: for traces and timings, whose
kernels read the same bytes whatever they hold). `graft OLD NEW OUT` puts skeleton NEW's compiled
module onto OLD's parameter records and digests, for a build whose module changed but whose
parameters did not (the q4 encode need not run again here: benchmarks/gpu/README.md).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

MANIFEST = "manifest.json"
PARAMETER_PREFIX = "param/"


def _section_file(name: str) -> str:
    return name.replace("/", "__")


def strip(mln: Path, out: Path) -> dict:
    """The skeleton of `mln` in folder `out`: its manifest and its non-parameter sections."""
    from myelin.mln import MlnReader

    out.mkdir(parents=True, exist_ok=True)
    with MlnReader(mln) as reader:
        manifest = reader.manifest
        for s in manifest["sections"]:
            if not s["name"].startswith(PARAMETER_PREFIX):
                (out / _section_file(s["name"])).write_bytes(bytes(reader.section_view(s["name"])))
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return manifest


_VALUES: Mapping[str, np.ndarray] = {}  # the logical weights, for the forked encoders
_PARTS: dict[str, list[dict]] = {}
# Output rows per q4 task: the q4 search is seconds per million weights, so the work is cut
# into tasks of ~1M weights over every core (a whole parameter per process left the largest,
# the 131M-weight head, running alone for minutes).
ROWS_PER_TASK = 256


def _layout(key: str):
    from myelin.codecs import choose_layout

    data = next(r for r in _PARTS[key] if "of" not in r)
    codec = data.get("codec", "none")
    if codec in ("none", "fp32"):  # stored as the graph reads it
        return data, None
    shape = tuple(data["shape"])
    layout = choose_layout(
        codec, shape, str(_VALUES[key].dtype), tuple(data["reduce_axes"]), tuple(data["order"])
    )
    if isinstance(layout, str):
        raise ValueError(f"{key}: {codec} does not apply as recorded: {layout}")
    return data, layout


def _stored_parts(key: str, layout, arrays: list[np.ndarray]) -> dict[str, bytes]:
    return {
        key + part.suffix: np.ascontiguousarray(array).tobytes()
        for part, array in zip(layout.parts, arrays, strict=True)
    }


def _encode_one(key: str) -> dict[str, bytes]:
    """One parameter's stored parts by key, as the encode step made them."""
    from myelin.codecs import encode

    data, layout = _layout(key)
    value = np.asarray(_VALUES[key])
    if layout is None:
        return {key: np.ascontiguousarray(value.astype(data["dtype"])).tobytes()}
    return _stored_parts(key, layout, encode(value.reshape(layout.logical_shape), layout))


def _encode_q4_rows(task: tuple[str, int]) -> tuple[np.ndarray, ...]:
    """Output rows [start, start + ROWS_PER_TASK) of a q4 parameter (myelin.codecs.q4)."""
    from myelin.codecs import q4

    key, start = task
    _, layout = _layout(key)
    value = np.asarray(_VALUES[key]).reshape(layout.logical_shape)
    return q4.encode_rows(q4.grouped_rows(value, layout, start, start + ROWS_PER_TASK))


def _encoded_parts(records: list[dict], values: Mapping[str, np.ndarray]) -> dict[str, bytes]:
    """Every stored part's bytes by key, from the logical values, as the encode step made them.

    Forked processes (so the weights are shared, not copied) over every core: q4 parameters
    in tasks of ROWS_PER_TASK output rows (q4 fits each row on its own: the same bytes for any
    cut, `q4.encode_rows`), assembled here; every other parameter in one task."""
    from myelin.codecs import q4

    global _VALUES, _PARTS
    _VALUES, _PARTS = values, {}
    for r in records:
        _PARTS.setdefault(r.get("of", r["key"]), []).append(r)
    rows: dict[str, int] = {}  # q4 parameters: their output rows
    for key in _PARTS:
        _, layout = _layout(key)
        if layout is not None and layout.codec.startswith(q4.NAME + ":"):
            rows[key] = layout.logical_shape[1 - layout.reduce_axes[0]]
    tasks = [(key, start) for key, n in rows.items() for start in range(0, n, ROWS_PER_TASK)]
    context = multiprocessing.get_context("fork")
    out: dict[str, bytes] = {}
    with ProcessPoolExecutor(os.cpu_count() or 1, mp_context=context) as pool:
        chunks = pool.map(_encode_q4_rows, tasks, chunksize=1)
        for parts in pool.map(_encode_one, [k for k in _PARTS if k not in rows]):
            out.update(parts)
        by_key: dict[str, list] = {key: [] for key in rows}
        for (key, _), chunk in zip(tasks, chunks, strict=True):
            by_key[key].append(chunk)
        for key, chunk_list in by_key.items():
            _, layout = _layout(key)
            out.update(_stored_parts(key, layout, q4.assemble(chunk_list, layout)))
    return out


def rebuild(
    skeleton: Path, out: Path, values: Callable[[], Mapping[str, np.ndarray]] | None
) -> list[str]:
    """Write the .mln of `skeleton` with its parameters computed from `values()`; returns the
    sections whose digest differs from the recorded one (empty: the same file). `values` None
    writes zero parameters (a placeholder: the sizes and the module as built, for traces and
    timings, whose kernels read the same bytes whatever they hold; only the module sections are
    then checked against the recorded digests)."""
    from myelin.mln import MlnReader, MlnWriter

    manifest = json.loads((skeleton / MANIFEST).read_text())
    if values is None:
        stored = {p["key"]: bytes(p["length"]) for p in manifest["parameters"]}
    else:
        stored = _encoded_parts(manifest["parameters"], values())
    by_section: dict[str, list[dict]] = {}
    for p in manifest["parameters"]:
        by_section.setdefault(p["section"], []).append(p)
    writer = MlnWriter({k: v for k, v in manifest.items() if k not in ("format", "sections")})
    for s in manifest["sections"]:
        if s["name"] in by_section:
            data = bytearray(s["length"])
            for p in by_section[s["name"]]:
                part = stored[p["key"]]
                if len(part) != p["length"]:
                    raise ValueError(f"{p['key']}: {len(part)} bytes, recorded {p['length']}")
                data[p["offset"] : p["offset"] + p["length"]] = part
            writer.add_section(s["name"], s["kind"], bytes(data))
        else:
            writer.add_section(s["name"], s["kind"], skeleton / _section_file(s["name"]))
    writer.write(out)
    with MlnReader(out) as reader:
        written = {s["name"]: s for s in reader.manifest["sections"]}
        reader.verify_all()
    return [
        s["name"]
        for s in manifest["sections"]
        if written[s["name"]] != s and (values is not None or s["name"] not in by_section)
    ]


def graft(parameters: Path, module: Path, out: Path) -> None:
    """Skeleton `out`: the compiled module (and manifest) of skeleton `module` with the
    parameter records and digests of skeleton `parameters`. For a build whose compiled module
    changed but whose parameters did not (a kernel, not the encoders): its stored parameters
    are then those of `parameters`' build, which `rebuild` checks byte for byte. Refuses
    skeletons whose parameters differ in any record (key, codec, shape, layout, place)."""
    old = json.loads((parameters / MANIFEST).read_text())
    new = json.loads((module / MANIFEST).read_text())
    if old["parameters"] != new["parameters"]:
        raise ValueError(f"{parameters} and {module} store different parameters: no graft")
    digests = {s["name"]: s for s in old["sections"] if s["name"].startswith(PARAMETER_PREFIX)}
    ours = [s["name"] for s in new["sections"] if s["name"].startswith(PARAMETER_PREFIX)]
    if sorted(ours) != sorted(digests):
        raise ValueError(f"{parameters} and {module} have different parameter sections")
    out.mkdir(parents=True, exist_ok=True)
    sections = []
    for s in new["sections"]:
        if s["name"] in digests:
            sections.append({**s, "sha256": digests[s["name"]]["sha256"]})
        else:
            sections.append(s)
            data = (module / _section_file(s["name"])).read_bytes()
            (out / _section_file(s["name"])).write_bytes(data)
    (out / MANIFEST).write_text(json.dumps({**new, "sections": sections}, indent=1, sort_keys=True))


def load_function(spec: str) -> Callable:
    """`path/to/file.py:function`, imported with the file's folder on sys.path."""
    path, _, name = spec.rpartition(":")
    folder = str(Path(path).resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    module_spec = importlib.util.spec_from_file_location(Path(path).stem + "_weights", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return getattr(module, name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("strip", help="the manifest and module sections of a .mln, into a folder")
    s.add_argument("mln", type=Path)
    s.add_argument("skeleton", type=Path)
    r = sub.add_parser("rebuild", help="the .mln of each skeleton, its weights computed again")
    r.add_argument("pairs", nargs="+", metavar="SKELETON=OUT", help="skeleton folder=.mln to write")
    r.add_argument("--weights", help="FILE.py:FUNCTION returning {key: array}")
    r.add_argument(
        "--placeholder", action="store_true", help="zero parameters (traces and timings only)"
    )
    g = sub.add_parser("graft", help="one skeleton's module on another's parameter digests")
    g.add_argument("parameters", type=Path, help="skeleton whose parameter digests to keep")
    g.add_argument("module", type=Path, help="skeleton whose compiled module to take")
    g.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    if args.command == "graft":
        graft(args.parameters, args.module, args.out)
        print(f"{args.out}: the module of {args.module}, the parameters of {args.parameters}")
        return 0
    if args.command == "strip":
        manifest = strip(args.mln, args.skeleton)
        size = sum(f.stat().st_size for f in args.skeleton.iterdir())
        print(f"{args.skeleton}: {len(manifest['parameters'])} parameter records, {size} bytes")
        return 0
    if not args.placeholder and not args.weights:
        parser.error("rebuild needs --weights FILE.py:FUNCTION (or --placeholder)")
    # computed once for every skeleton
    values = None if args.placeholder else functools.cache(load_function(args.weights))
    failed = 0
    for pair in args.pairs:
        skeleton, _, out = pair.partition("=")
        differ = rebuild(Path(skeleton), Path(out), values)
        took = time.perf_counter() - start
        if differ:
            print(f"{out}: {len(differ)} section(s) differ from the build: {differ[:5]}")
            failed = 1
        else:
            what = "every module section's" if values is None else "every section's"
            print(f"{out}: rebuilt ({took:.1f} s so far), {what} digest as built")
    return failed


if __name__ == "__main__":
    sys.exit(main())
