"""The compile half of issue 17's GPU benchmark cases (docs/tuning.md, 'The benchmark scripts';
the product flow for an app is `plex tune --bundle`): candidates for issue 17's
matmul and GEMV cases, compiled here through SYNaPSe into a bundle that
`time_bundle.py` times on the GPU machine with the runtime alone.

    .venv/bin/python benchmarks/probes/gpu/tune_bundle.py [-o benchmarks/gpu/tune_bundle]
        [--per-case 10]
        [--z3 16]

Matmul candidates: with `--z3 N`, N solutions of IREE's own pipeline constraints
(myelin.tuning.smt: z3, pruned, spread over tile shapes), else a sample of the hand-written space
of myelin.tuning.cuda. GEMV cases are named by the weight's layout in the model (`nk`: torch's
[out, in]); each also gets candidates in the other stored layout (the weight-layout knob,
myelin.tuning.layout): their IR is the one the layout rewrite produces (tests/plex/
test_weight_layout.py checks that it is the other layout's GEMV), and their `layout` field tells
the timing half to feed the weight transposed, as the build stores it.

Writes BUNDLE/<case>/{reference,cNN,lNN}.vmfb and BUNDLE/bundle.json (per candidate: config,
stored layout, matched ops; candidates whose spec matched nothing or did not compile are left
out and listed).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "src"))

from myelin.tuning.cuda import gemv_space, mma_space
from myelin.tuning.spec import ContractionMatch, SpecEntry, render_spec

FLAGS = ("--iree-hal-target-device=cuda", "--iree-cuda-target=sm_80")
M = N = K = 8192
GN, GK = 28672, 8192


def matmul_mlir() -> str:
    t = "tensor<8192x8192xf16>"
    return f"""func.func @main(%a: {t}, %b: {t}) -> tensor<8192x8192xf32> {{
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<8192x8192xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<8192x8192xf32>) -> tensor<8192x8192xf32>
  %r = linalg.matmul ins(%a, %b : {t}, {t}) outs(%f : tensor<8192x8192xf32>) -> tensor<8192x8192xf32>
  return %r : tensor<8192x8192xf32>
}}
"""  # noqa: E501


def gemv_mlir(layout: str) -> str:
    w = f"tensor<{GN}x{GK}xf16>" if layout == "nk" else f"tensor<{GK}x{GN}xf16>"
    wmap = "(d1, d2)" if layout == "nk" else "(d2, d1)"
    o = f"tensor<1x{GN}xf32>"
    return f"""func.func @main(%x: tensor<1x{GK}xf16>, %w: {w}) -> {o} {{
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : {o}
  %f = linalg.fill ins(%z : f32) outs(%e : {o}) -> {o}
  %r = linalg.generic {{indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d2)>, affine_map<(d0, d1, d2) -> {wmap}>, affine_map<(d0, d1, d2) -> (d0, d1)>], iterator_types = ["parallel", "parallel", "reduction"]}} ins(%x, %w : tensor<1x{GK}xf16>, {w}) outs(%f : {o}) {{
  ^bb0(%a: f16, %b: f16, %c: f32):
    %a32 = arith.extf %a : f16 to f32
    %b32 = arith.extf %b : f16 to f32
    %m = arith.mulf %a32, %b32 : f32
    %s = arith.addf %c, %m : f32
    linalg.yield %s : f32
  }} -> {o}
  return %r : {o}
}}
"""  # noqa: E501


MM_MAPS = (
    "affine_map<(d0, d1, d2) -> (d0, d2)>",
    "affine_map<(d0, d1, d2) -> (d2, d1)>",
    "affine_map<(d0, d1, d2) -> (d0, d1)>",
)
# IREE drops the GEMV's unit M loop before configuring it: the matcher sees N and K only.
GEMV_MAPS = {
    "nk": (
        "affine_map<(d0, d1) -> (d1)>",
        "affine_map<(d0, d1) -> (d0, d1)>",
        "affine_map<(d0, d1) -> (d0)>",
    ),
    "kn": (
        "affine_map<(d0, d1) -> (d1)>",
        "affine_map<(d0, d1) -> (d1, d0)>",
        "affine_map<(d0, d1) -> (d0)>",
    ),
}


class Z3Tiles:
    """A z3 solution as the bundle records it (the interface of MmaTiles the loop uses)."""

    def __init__(self, candidate) -> None:
        self.candidate = candidate

    def compilation_info(self) -> str:
        return self.candidate.compilation_info

    def to_json(self) -> dict:
        return {"z3": self.candidate.describe(), **self.candidate.knobs}


def matmul_tiles(per_case: int, z3_count: int, rng: random.Random) -> list:
    if z3_count:
        from myelin.tuning.smt import emit_constraints, pick, solve_constraints

        solved = solve_constraints(emit_constraints(matmul_mlir(), FLAGS), limit=2000)
        print(f"z3: {len(solved)} pruned solutions of IREE's constraints; timing {z3_count}")
        return [Z3Tiles(c) for c in pick(solved, z3_count)]
    mm = mma_space(M, N, K)
    # the notes' 128x256 tile first, then a sample of the rest
    first = [t for t in mm if (t.wm, t.wn, t.sm, t.sn, t.r) == (128, 256, 4, 8, 2)]
    return first + rng.sample([t for t in mm if t not in first], per_case - len(first))


def cases(per_case: int, seed: int, z3_count: int = 0) -> dict[str, dict]:
    rng = random.Random(seed)
    match = ContractionMatch("f16", "f16", "f32", MM_MAPS, (), (M,), (N,), (K,))
    out = {
        "matmul_8192": {
            "source": matmul_mlir(),
            "match": match,
            "tiles": matmul_tiles(per_case, z3_count, rng),
            "inputs": [[M, K], [K, N]],
        }
    }
    spaces = {layout: gemv_space(layout, GN, GK) for layout in ("nk", "kn")}
    picked = {k: rng.sample(v, min(per_case, len(v))) for k, v in spaces.items()}
    for layout in ("nk", "kn"):
        other = "kn" if layout == "nk" else "nk"
        shape = [GN, GK] if layout == "nk" else [GK, GN]
        out[f"gemv_{layout}"] = {
            "source": gemv_mlir(layout),
            "layout": layout,
            "match": ContractionMatch("f16", "f16", "f32", GEMV_MAPS[layout], (), (), (GN,), (GK,)),
            "tiles": picked[layout],
            "inputs": [[1, GK], shape],
            # the layout knob: the weight stored the other way, with that layout's configs
            # (and IREE's default config for it, "l-default")
            "relaid": {
                "layout": other,
                "source": gemv_mlir(other),
                "match": ContractionMatch(
                    "f16", "f16", "f32", GEMV_MAPS[other], (), (), (GN,), (GK,)
                ),
                "tiles": picked[other],
            },
        }
    return out


def main() -> None:
    from plex.builder.versions import fingerprint_salt
    from plex.tune._cuda import CANDIDATE_VMFB, FAILED, MATCHED, CudaCandidateJob
    from synapse import Cache, Executor, Node, Plan

    ap = argparse.ArgumentParser()
    ap.add_argument("-o", "--output", type=Path, default=Path("benchmarks/gpu/tune_bundle"))
    ap.add_argument("--per-case", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache/plex/tune-cuda")
    ap.add_argument(
        "--z3", type=int, default=0, help="matmul: N candidates from IREE's constraints"
    )
    a = ap.parse_args()
    all_cases = cases(a.per_case, a.seed, a.z3)
    nodes, meta, layouts = [], {}, {}
    for name, case in all_cases.items():
        nodes.append(Node(f"{name}:reference", CudaCandidateJob(case["source"], None, FLAGS)))
        layouts[f"{name}:reference"] = case.get("layout")
        for i, tiles in enumerate(case["tiles"]):
            spec = render_spec([SpecEntry(name, case["match"], tiles.compilation_info())])
            nodes.append(Node(f"{name}:c{i:02d}", CudaCandidateJob(case["source"], spec, FLAGS)))
            meta[f"{name}:c{i:02d}"] = tiles.to_json()
            layouts[f"{name}:c{i:02d}"] = case.get("layout")
        relaid = case.get("relaid")
        if relaid is None:
            continue
        node_id = f"{name}:l-default"
        nodes.append(Node(node_id, CudaCandidateJob(relaid["source"], None, FLAGS)))
        meta[node_id], layouts[node_id] = {"default": True}, relaid["layout"]
        for i, tiles in enumerate(relaid["tiles"]):
            spec = render_spec([SpecEntry(name, relaid["match"], tiles.compilation_info())])
            node_id = f"{name}:l{i:02d}"
            nodes.append(Node(node_id, CudaCandidateJob(relaid["source"], spec, FLAGS)))
            meta[node_id], layouts[node_id] = tiles.to_json(), relaid["layout"]
    results = Executor(Cache(a.cache), jobs=a.jobs, salt=fingerprint_salt()).run(Plan(nodes))
    shutil.rmtree(a.output, ignore_errors=True)
    bundle: dict = {"cases": {}, "left_out": {}}
    for name, case in all_cases.items():
        folder = a.output / name
        folder.mkdir(parents=True)
        entries = []
        for node in (n for n in nodes if n.id.startswith(f"{name}:")):
            out = results[node.id].out_dir
            label = node.id.split(":")[1]
            if (out / FAILED).exists():
                bundle["left_out"][node.id] = "compile failed: " + (out / FAILED).read_text()[-300:]
                continue
            matched = int((out / MATCHED).read_text())
            if label not in ("reference", "l-default") and matched == 0:
                bundle["left_out"][node.id] = "spec matched no op"
                continue
            shutil.copyfile(out / CANDIDATE_VMFB, folder / f"{label}.vmfb")
            entries.append(
                {
                    "name": label,
                    "file": f"{name}/{label}.vmfb",
                    "matched": matched,
                    "config": meta.get(node.id),
                    # the weight's stored layout; another than the case's: fed transposed
                    "layout": layouts.get(node.id),
                }
            )
        bundle["cases"][name] = {
            "inputs": case["inputs"],
            "dtype": "float16",
            "layout": case.get("layout"),
            "candidates": entries,
        }
    (a.output / "bundle.json").write_text(json.dumps(bundle, indent=1))
    kept = sum(len(c["candidates"]) for c in bundle["cases"].values())
    print(f"{kept} vmfbs in {a.output}; left out: {len(bundle['left_out'])}")
    for k, v in bundle["left_out"].items():
        print(f"  {k}: {v.splitlines()[0][:160] if v else v}")


if __name__ == "__main__":
    main()
