"""python -m benchmarks: one runner for PLeX's benchmark suites (docs/benchmarks.md).

python -m benchmarks cpu|build|runtime [--quick] [--case ID ...] [--no-write]
python -m benchmarks cpu --config full --threads 1   (the long table: whole models, 2 batches)
python -m benchmarks prepare gpu [--small] [--device cpu]   (here: builds what the GPU runs)
python -m benchmarks gpu --prebuilt DIR [--deadline S]       (there: runs it, writes the JSON)
python -m benchmarks report [--write docs/benchmarks.md]
python -m benchmarks list
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
from pathlib import Path

from benchmarks import report, results

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks.md"


def _selected(ids: list[str], patterns: list[str] | None) -> set[str]:
    if not patterns:
        return set(ids)
    chosen = {i for i in ids if any(fnmatch.fnmatch(i, p) for p in patterns)}
    if not chosen:
        raise SystemExit(f"error: no case matches {patterns} (cases: {', '.join(ids)})")
    return chosen


def run_model_suite(args: argparse.Namespace) -> dict:
    from benchmarks import gpu_suite, runner

    suite = runner.load_suite(args.suite)
    config = getattr(args, "config", "default")
    in_config = [c for c in suite.cases if c.config == config]
    cases = [c for c in in_config if c.id in _selected([c.id for c in in_config], args.case)]
    if args.quick:
        cases = [runner.quick(c) for c in cases]
    threads = args.threads if args.threads is not None else suite.threads
    runner.set_threads(threads)
    settings = {"threads": threads, "quick": args.quick}
    if config != "default":
        settings["config"] = config
        if args.case:  # a part of the configuration: a table of its own, beside the whole's
            settings["cases"] = list(args.case)
    run = results.new_run(args.suite, settings, gpu=args.suite == "gpu")
    if args.suite == "gpu":
        if not args.prebuilt:
            raise SystemExit(
                "error: the gpu suite runs prebuilt cases: `python -m benchmarks prepare gpu` "
                "here, then `python -m benchmarks gpu --prebuilt benchmarks/gpu/suite` on the "
                "GPU machine (benchmarks/gpu/run_suite.sh)"
            )
        # written after every case: a run stopped by the device call's time limit keeps its cases
        partial = None if args.no_write else results.write(run, args.results)

        def keep(result: dict) -> None:
            run["cases"].append(result)
            if partial:
                results.write(run, args.results, partial)

        gpu_suite.run_prebuilt(Path(args.prebuilt), cases, threads, args.deadline, keep)
        run["_partial"] = partial
        return run
    import tempfile

    with tempfile.TemporaryDirectory(prefix="plex-bench-") as tmp:
        for case in cases:
            print(f"== {case.id}: building", file=sys.stderr, flush=True)
            try:
                mln = runner.build_case(case, Path(tmp) / case.id)
            except Exception as e:  # recorded, and the suite goes on
                run["cases"].append(runner.failed_case(case, e))
                continue
            mln_bf16: Path | Exception | None = None
            if case.bf16:
                bf16 = runner.bf16_case(case)
                try:
                    mln_bf16 = runner.build_case(bf16, Path(tmp) / bf16.id)
                except Exception as e:  # the f32 rows still run; the bf16 row says why not
                    mln_bf16 = e
            print(f"== {case.id}: checking and timing", file=sys.stderr, flush=True)
            try:
                run["cases"] += runner.run_case(case, mln, threads, mln_bf16)
            except Exception as e:  # the reference itself failed: recorded, the suite goes on
                run["cases"].append(runner.failed_case(case, e))
    return run


def run_scenario_suite(args: argparse.Namespace) -> dict:
    from benchmarks import scenarios

    _, cases = scenarios.load_cases(args.suite)
    cases = [c for c in cases if c["id"] in _selected([c["id"] for c in cases], args.case)]
    if args.quick:
        cases = [
            {**c, "rounds": min(c["rounds"], 2)}
            | ({"calls": min(c["calls"], 50)} if "calls" in c else {})
            for c in cases
        ]
    run = results.new_run(args.suite, {"quick": args.quick})
    for case in cases:
        print(f"== {case['id']}", file=sys.stderr, flush=True)
        if args.suite == "build":
            run["cases"].append(scenarios.build_case(case))
        else:
            run["cases"].append(scenarios.run_runtime_case(case))
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for suite in report.SUITES:
        p = sub.add_parser(suite, help=f"run the {suite} suite (benchmarks/cases/{suite}.toml)")
        p.add_argument("--case", nargs="+", help="only these case ids (glob patterns)")
        p.add_argument("--quick", action="store_true", help="fewer rounds and calls")
        p.add_argument("--no-write", action="store_true", help="print only, no result file")
        p.add_argument("--results", type=Path, default=results.RESULTS, help="results folder")
        if suite in ("cpu", "gpu"):
            p.add_argument("--threads", type=int, help="worker threads (0: each runtime's own)")
            p.add_argument(
                "--config",
                default="default",
                help="the cases of this configuration (`config` in the case file; default: "
                "the quick table)",
            )
        if suite == "gpu":
            p.add_argument("--prebuilt", help="the folder `prepare gpu` wrote")
            p.add_argument("--deadline", type=float, help="start no case after this many seconds")
    prep = sub.add_parser("prepare", help="build a suite's cases for another machine")
    prep.add_argument("suite", choices=["gpu"])
    prep.add_argument("-o", "--out", type=Path, default=REPO / "benchmarks" / "gpu" / "suite")
    prep.add_argument("--case", nargs="+", help="only these case ids (glob patterns)")
    prep.add_argument(
        "--config", default="default", help="the cases of this configuration (`config`)"
    )
    prep.add_argument("--small", action="store_true", help="each case's `small` sizes")
    prep.add_argument("--device", choices=["cuda", "cpu"], help="build for this device instead")
    rep = sub.add_parser("report", help="the latest table per suite and machine")
    rep.add_argument("--write", type=Path, help="regenerate this doc's results section")
    sub.add_parser("list", help="the suites and their cases")
    args = parser.parse_args(argv)

    if args.command == "report":
        if args.write:
            args.write.write_text(report.regenerate(args.write.read_text()))
            print(f"wrote {args.write}")
        else:
            print(report.generated_section())
        return 0
    if args.command == "list":
        from benchmarks import runner, scenarios

        for suite in report.SUITES:
            if suite in ("cpu", "gpu"):
                ids = [c.id for c in runner.load_suite(suite).cases]
            else:
                ids = [c["id"] for c in scenarios.load_cases(suite)[1]]
            print(f"{suite}: {' '.join(ids)}")
        return 0
    if args.command == "prepare":
        from benchmarks import gpu_suite, runner

        suite = runner.load_suite("gpu")
        in_config = [c for c in suite.cases if c.config == args.config]
        chosen = _selected([c.id for c in in_config], args.case)
        cases = [c for c in in_config if c.id in chosen]
        if args.small:
            cases = [runner.small(c) for c in cases]
        if args.device:
            cases = [runner.on_device(c, args.device) for c in cases]
        return gpu_suite.prepare(cases, args.out)

    args.suite = args.command
    run = run_model_suite(args) if args.suite in ("cpu", "gpu") else run_scenario_suite(args)
    if args.no_write:
        run.pop("_partial", None)
        report.print_run(run)
        return 0
    path = results.write(run, args.results, run.pop("_partial", None))
    run["_path"] = str(path)
    report.print_run(run)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
