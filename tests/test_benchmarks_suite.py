"""The benchmark suite's data: every case file loads into cases the runner knows how to run, and
docs/benchmarks.md's results section is exactly what the result files regenerate (no timing
here: the numbers are the result files')."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import anchors, causal_lm, report, results, runner, scenarios, zoo
from benchmarks.gpu.llm import models

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks.md"


def test_the_manual_equals_the_regeneration_from_the_result_files():
    text = DOC.read_text()
    assert report.regenerate(text) == text, (
        "docs/benchmarks.md is stale: run `python -m benchmarks report --write docs/benchmarks.md`"
    )


def test_every_result_file_has_the_schema_the_report_reads():
    runs = results.load_all()
    assert runs, "benchmarks/results/ holds no result file"
    for run in runs:
        assert run["suite"] in report.REPORTED, run["_path"]
        for case in run["cases"]:
            for row in case["rows"]:
                kept = {"samples", "summary", "skipped", "error"} & row.keys()
                assert kept, f"{run['_path']}: {case['id']}/{row['runner']} has no result"


@pytest.mark.parametrize("suite", ["cpu", "gpu"])
def test_model_cases_name_known_sources_anchors_and_tolerances(suite):
    cases = runner.load_suite(suite).cases
    assert len({c.id for c in cases}) == len(cases), "case ids must be unique"
    for case in cases:
        assert case.kind in runner.KINDS, case.id
        if case.kind == "causal-lm":  # a models.py family; its check is greedy tokens
            assert case.model in models.FAMILIES, case.id
            assert set(case.anchors) <= set(causal_lm.ANCHORS), case.id
            assert case.seq >= 1 and case.new_tokens >= 2, case.id
            continue
        assert case.model in zoo.known(), case.id
        assert set(case.anchors) <= set(anchors.ANCHORS), case.id
        assert {"cosine"} <= case.tolerance.keys() or {"atol", "rtol"} & case.tolerance.keys()
        assert runner.small(case).small == {}, case.id  # `small` names Case fields
    if suite == "gpu":  # the GPU machine rebuilds weights from seeds; small sizes check on CPU
        assert all(c.model in zoo.GPU_REBUILDABLE for c in cases)
        assert all(c.small for c in cases), "every GPU case needs its `small` sizes"


@pytest.mark.parametrize("suite", ["build", "runtime"])
def test_scenario_cases_name_their_kind(suite):
    _, cases = scenarios.load_cases(suite)
    for case in cases:
        assert case["rounds"] >= 1
        if suite == "build":
            assert (REPO / "examples" / case["example"] / "app.toml").exists(), case["id"]
        else:
            assert case["kind"] in scenarios.RUNTIME_KINDS, case["id"]


def test_a_case_becomes_the_app_its_options_say(tmp_path):
    case = runner.Case(
        id="q4-decoder",
        title="t",
        model="decoder-decode",
        build={"codec": "q4", "data_tiling": False},
    )
    app = runner.write_app(case, tmp_path).read_text()
    assert 'target = "llvm-cpu"' in app and "data_tiling = false" in app
    assert '[weights.codec]\n"*" = "q4"' in app
    assert (
        "zoo.build('decoder-decode', 1, 128, None, {})"
        in (tmp_path / "package/graph.py").read_text()
    )


def test_the_ratio_table_divides_round_by_round():
    case = {
        "id": "c",
        "title": "t",
        "unit": "ms",
        "baseline": "PLeX",
        "rows": [
            {"runner": "PLeX", "samples": [1.0, 2.0, 1.0]},
            {"runner": "torch eager", "samples": [2.0, 2.0, 3.0]},
            {"runner": "OpenVINO", "skipped": "openvino is not installed"},
        ],
    }
    plex, torch_row, skipped = report.case_rows(case)
    assert plex[1] == "1.00" and plex[4] == ""
    assert torch_row[4] == "2.00x (1.00-3.00)"
    assert skipped[1] == "skipped: openvino is not installed"
    json.dumps(case)  # rows are plain data


def test_prepared_cases_run_from_their_skeletons_with_weights_from_seeds(tmp_path):
    """The GPU suite's round trip on the CPU: `prepare` strips the built .mln of its weights,
    `run_prebuilt` computes them again from the seeds (every section's digest must equal the
    build's, or the case fails) and checks PLeX against torch eager. A zoo change that moves a
    weight's name or value fails here, not on the GPU machine. The second case is gpu.toml's
    submitted-call case at its small sizes on the CPU: a burst of `submit`s against torch's
    launches, one sample per round divided by the burst."""
    from benchmarks import gpu_suite

    decoder = runner.Case(
        id="decode-from-seeds",
        title="the decoder's decode step, prepared and run from its skeleton",
        model="decoder-decode",
        seq=8,
        dtype="float32",
        tolerance={"atol": 1e-4, "rtol": 1e-3},
        rounds=1,
        calls=1,
        warmup=0,
    )
    (submit,) = [c for c in runner.load_suite("gpu").cases if c.burst]
    submit = runner.on_device(runner.small(submit), "cpu")
    assert submit.burst and "kernels" not in submit.build
    assert gpu_suite.prepare([decoder, submit], tmp_path) == 0
    assert not any(p.suffix == ".mln" for p in tmp_path.rglob("*")), "weights must not travel"
    done = gpu_suite.run_prebuilt(tmp_path, [decoder, submit], threads=0)
    for case, result in zip((decoder, submit), done, strict=True):
        plex, torch_row = result["rows"]
        assert "error" not in plex, plex.get("error")
        assert plex["check"]["passed"], plex["check"]
        assert torch_row["runner"] == "torch eager" and len(plex["samples"]) == case.rounds
    assert done[1]["options"]["burst"] == submit.burst


def test_every_probe_has_its_question_in_the_readme():
    probes = REPO / "benchmarks" / "probes"
    readme = (probes / "README.md").read_text()
    files = [
        p.relative_to(probes).as_posix()
        for p in probes.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    ]
    missing = [f for f in files if f != "README.md" and f"`{f}`" not in readme]
    assert not missing, f"benchmarks/probes/README.md has no line for {missing}"


def test_a_causal_lm_case_becomes_a_seeded_folder_built_by_the_causal_lm_frontend(tmp_path):
    (case,) = [c for c in runner.load_suite("cpu").cases if c.kind == "causal-lm"]
    app = runner.write_app(case, tmp_path).read_text()
    assert 'target = "llvm-cpu"' in app and "[weights.codec]" not in app
    package = (tmp_path / "package/plex.toml").read_text()
    assert 'frontend = "causal-lm"' in package
    assert f"max_seq = {case.seq + case.new_tokens}" in package
    config = json.loads((tmp_path / "package/model/config.json").read_text())
    assert config["hidden_size"] == case.params["hidden_size"]
    assert config["architectures"] == ["LlamaForCausalLM"]  # what llama.cpp's converter reads


def test_greedy_divergence_is_the_first_position_any_row_differs():
    assert causal_lm.first_divergence([[1, 2, 3]], [[1, 2, 3]]) is None
    assert causal_lm.first_divergence([[1, 2, 3], [4, 5, 6]], [[1, 2, 9], [4, 0, 6]]) == 1
    strict = causal_lm._check([[1, 2]], [[1, 3]], True, "transformers")
    assert strict["passed"] is False and strict["value"] == "token 1 of 2"
    loose = causal_lm._check([[1, 2]], [[1, 3]], False, "PLeX")
    assert loose["passed"] is None
    assert report._check({"check": loose}).startswith("recorded")


def test_a_run_of_some_cases_replaces_only_their_tables():
    def run(date, ids, suite="cpu"):
        cases = [{"id": i} for i in ids]
        return {"suite": suite, "date": date, "machine": {"name": "m"}, "cases": cases}

    old, new = run("2026-01-01", ["a", "b"]), run("2026-01-02", ["b"])
    shown = results.latest_per_case([old, new])
    assert [[c["id"] for c in r["cases"]] for r in shown] == [["b"], ["a"]]
    llm = [run("2026-01-01", ["x"], "llm"), run("2026-01-02", ["y"], "llm")]
    assert [r["date"] for r in results.latest_per_case(llm)] == ["2026-01-02"]
