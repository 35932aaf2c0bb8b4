#!/usr/bin/env python
"""ONNX coverage: run onnx's own backend node tests through PLeX and through raw IREE.

    python tools/onnx_coverage.py                 # every node test, both paths, 2 at a time
    python tools/onnx_coverage.py --sample 30     # a fixed, evenly spread sample (CI's)
    python tools/onnx_coverage.py --tests test_abs,test_add --mode plex
    python tools/onnx_coverage.py --results out.jsonl --resume   # continue an interrupted run

Each test runs in its own subprocess with a timeout (a crashing or hanging compiler cannot take
the run down). Per test:
- plex: write a one-graph package around model.onnx, `plex build` it (the ONNX frontend's
  preprocessing included), load the .mln with myelin and call `forward`. Graph inputs that feed
  an operand IREE needs as a constant (axes, pads, shapes: see STATIC_OPERANDS in
  myelin/frontends/_onnx_preprocess.py) are first frozen to the test's values, as an exporter
  would; the result records which tests needed that.
- raw: `iree-import-onnx model.onnx`, `iree-compile --iree-input-type=onnx` with llvm-cpu/host,
  iree.runtime local-task: IREE 3.13 with no preprocessing (the baseline).
Comparison follows onnx's backend runner: same shape, same dtype, np.testing.assert_allclose
with rtol=1e-3, atol=1e-7 (NaNs equal). Tests whose inputs or outputs are not plain tensors
(sequences, optionals, maps) or are strings are skipped on both paths.

onnx==1.22.0 is required: it is the newest wheel that still ships backend/test/data/node.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

RTOL, ATOL = 1e-3, 1e-7
DEFAULT_TIMEOUT = 300
MODES = ("plex", "raw")


def node_test_dir() -> Path:
    import onnx

    path = Path(onnx.__file__).parent / "backend" / "test" / "data" / "node"
    if not path.is_dir():
        sys.exit(
            f"onnx {onnx.__version__} ships no node tests ({path} missing); "
            "install onnx==1.22.0 (pip install 'plex[onnx]')"
        )
    return path


def all_tests() -> list[str]:
    return sorted(p.name for p in node_test_dir().iterdir() if (p / "model.onnx").is_file())


def sample_tests(n: int) -> list[str]:
    """`n` tests evenly spread over the sorted list: fixed, so a recorded floor stays comparable."""
    tests = all_tests()
    if n >= len(tests):
        return tests
    step = len(tests) / n
    return [tests[int(i * step)] for i in range(n)]


# ---------------------------------------------------------------------------------------------
# Worker side: one test, one mode, in this process; prints one JSON line.


def _load_case(test: Path) -> tuple[object, list[tuple[str, np.ndarray]], list[np.ndarray]] | str:
    """(model, [(input name, value)], [expected outputs]), or the reason the test is skipped."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(test / "model.onnx"))
    graph = model.graph
    initialized = {t.name for t in graph.initializer}
    real_inputs = [i for i in graph.input if i.name not in initialized]
    for vi in [*real_inputs, *graph.output]:
        t = vi.type
        if t.WhichOneof("value") != "tensor_type":
            return "non-tensor IO (sequence/optional/map)"
        if t.tensor_type.elem_type == onnx.TensorProto.STRING:
            return "string tensor IO"
    data = test / "test_data_set_0"

    def read(kind: str, count: int) -> list[np.ndarray]:
        arrays = []
        for i in range(count):
            proto = onnx.TensorProto()
            proto.ParseFromString((data / f"{kind}_{i}.pb").read_bytes())
            arrays.append(numpy_helper.to_array(proto))
        return arrays

    inputs = read("input", len(real_inputs))
    outputs = read("output", len(graph.output))
    return model, list(zip([i.name for i in real_inputs], inputs, strict=True)), outputs


def compare(expected: list[np.ndarray], actual: list[np.ndarray]) -> tuple[bool, str, float]:
    """onnx's backend-runner comparison; returns (ok, why not, relative L2 error)."""
    if len(expected) != len(actual):
        return False, f"shape: {len(actual)} outputs, expected {len(expected)}", float("nan")
    worst = 0.0
    for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
        a = np.asarray(a)
        if a.shape != e.shape:
            return False, f"shape: output {i} is {a.shape}, expected {e.shape}", float("nan")
        if a.dtype != e.dtype and a.dtype.itemsize == e.dtype.itemsize and e.dtype.kind in "iub":
            a = a.view(e.dtype)  # IREE integers are signless: uint8 comes back as int8
        if a.dtype != e.dtype:
            return False, f"dtype: output {i} is {a.dtype}, expected {e.dtype}", float("nan")
        if e.size:
            diff = np.linalg.norm((a.astype(np.float64) - e.astype(np.float64)).ravel())
            norm = np.linalg.norm(e.astype(np.float64).ravel())
            if np.isfinite(diff):
                worst = max(worst, float(diff / norm) if norm else float(diff))
        try:
            np.testing.assert_allclose(a, e, rtol=RTOL, atol=ATOL)
        except AssertionError:
            if e.dtype.kind in "iub":
                return False, f"numeric: int/bool mismatch in output {i}", worst
            if not np.array_equal(np.isnan(a), np.isnan(e)) or not np.array_equal(
                np.isinf(a), np.isinf(e)
            ):
                return False, f"numeric: NaN/Inf pattern differs in output {i}", worst
            return False, f"numeric: value mismatch in output {i}", worst
    return True, "", worst


def _fit_input(value: np.ndarray, dtype: str) -> tuple[np.ndarray, bool]:
    """Feed a test value to an input of signature dtype `dtype` (IREE integers are signless,
    IREE 3.13 demotes f64 to f32). Returns (array, converted-lossily)."""
    from myelin.dtypes import numpy_dtype

    try:
        target = numpy_dtype(dtype)
    except (TypeError, AttributeError):
        return value, False
    if value.dtype == target:
        return value, False
    if value.dtype.itemsize == target.itemsize and value.dtype.kind in "iub":
        return value.view(target), False
    return value.astype(target), True


# set by --host-fallback for the worker processes: nodes IREE cannot lower run on the host
HOST_FALLBACK_ENV = "PLEX_COVERAGE_HOST_FALLBACK"


def run_plex(test: Path, work: Path) -> dict:
    import onnx

    from myelin.frontends._onnx_preprocess import freeze_inputs, static_operand_inputs

    case = _load_case(test)
    if isinstance(case, str):
        return {"status": "skip", "stage": "load", "message": case}
    model, inputs, expected = case
    package = work / "pkg"
    package.mkdir()
    static = static_operand_inputs(model)  # type: ignore[arg-type]
    values = dict(inputs)
    frozen = {name: values[name] for name in static}
    if frozen:
        model = freeze_inputs(model, frozen)  # type: ignore[arg-type]
    onnx.save(model, str(package / "model.onnx"))  # type: ignore[arg-type]
    (package / "plex.toml").write_text(
        textwrap.dedent("""\
            [package]
            name = "case"
            version = "0.1.0"

            [graph.model]
            source = "model.onnx"
            """)
        + ("host_fallback = true\n" if os.environ.get(HOST_FALLBACK_ENV) else "")
    )
    (package / "app.toml").write_text('[app]\nname = "case"\npackages = ["."]\n')
    result: dict = {"frozen": sorted(frozen)}
    os.environ["PLEX_CACHE_DIR"] = str(work / "cache")
    from plex.builder import build
    from plex.errors import PlexError

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            build(package / "app.toml", work / "case.mln")
        except PlexError as e:
            return {**result, "status": "fail", "stage": "build", "message": str(e)}
    result["warnings"] = sorted(
        {str(w.message) for w in caught if "BuildWarning" in type(w.message).__name__}
    )
    import myelin

    feeds = [(n, v) for n, v in inputs if n not in frozen]
    lossy = False
    try:
        loaded = myelin.Instance().load(work / "case.mln")
        entry = loaded.entrypoints["forward"]
        args = []
        for spec, (_, value) in zip(entry.signature.inputs, feeds, strict=True):
            fitted, converted = _fit_input(value, spec.dtype)
            lossy |= converted
            args.append(fitted)
        with loaded.session() as session:
            out = session.call("forward", *args)
        actual = list(out) if isinstance(out, tuple) else [out]
    except Exception as e:
        return {**result, "status": "fail", "stage": "run", "message": _one_line(e)}
    result["inputs_converted"] = lossy
    ok, why, relerr = compare(expected, actual)
    return {
        **result,
        "status": "pass" if ok else "fail",
        "stage": "compare",
        "message": why,
        "relerr": relerr,
    }


def run_raw(test: Path, work: Path) -> dict:
    import iree.runtime as rt

    case = _load_case(test)
    if isinstance(case, str):
        return {"status": "skip", "stage": "load", "message": case}
    _, inputs, expected = case
    bindir = Path(sys.executable).parent
    mlir, vmfb = work / "model.mlir", work / "model.vmfb"
    step = subprocess.run(
        [str(bindir / "iree-import-onnx"), str(test / "model.onnx"), "-o", str(mlir)],
        capture_output=True,
        text=True,
    )
    if step.returncode:
        return {"status": "fail", "stage": "import", "message": _last_error(step.stderr)}
    step = subprocess.run(
        [
            str(bindir / "iree-compile"),
            str(mlir),
            "--iree-input-type=onnx",
            "--iree-hal-target-device=local",
            "--iree-hal-local-target-device-backends=llvm-cpu",
            "--iree-llvmcpu-target-cpu=host",
            "-o",
            str(vmfb),
        ],
        capture_output=True,
        text=True,
    )
    if step.returncode:
        return {"status": "fail", "stage": "compile", "message": _compile_error(step.stderr)}
    try:
        config = rt.Config("local-task")
        module = rt.VmModule.copy_buffer(config.vm_instance, vmfb.read_bytes())
        context = rt.SystemContext(vm_modules=[module], config=config)
        name = next(n for n in module.function_names if not n.startswith("__") and "$" not in n)
        out = context.modules[module.name][name](*[v for _, v in inputs])
        outs = out if isinstance(out, tuple | list) else [out]
        actual = [o.to_host() if hasattr(o, "to_host") else np.asarray(o) for o in outs]
    except Exception as e:
        return {"status": "fail", "stage": "run", "message": _one_line(e)}
    ok, why, relerr = compare(expected, actual)
    return {
        "status": "pass" if ok else "fail",
        "stage": "compare",
        "message": why,
        "relerr": relerr,
    }


def _one_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    return text.splitlines()[0][:400]


def _last_error(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error" in line or "error" in line:
            return line.strip()[:400]
    return (lines[-1] if lines else "failed")[:400]


def _compile_error(stderr: str) -> str:
    for line in stderr.splitlines():
        if "error:" in line:
            return line.split("error:", 1)[1].strip()[:400]
    if "Stack dump" in stderr or "Assertion" in stderr:
        return "iree-compile crashed (assertion/signal)"
    return _last_error(stderr)


def worker(mode: str, test: str) -> None:
    path = node_test_dir() / test
    with tempfile.TemporaryDirectory(prefix="onnxcov-") as tmp:
        try:
            result = (run_plex if mode == "plex" else run_raw)(path, Path(tmp))
        except Exception as e:
            result = {
                "status": "fail",
                "stage": "harness",
                "message": _one_line(e),
                "trace": traceback.format_exc()[-2000:],
            }
    print("@@RESULT " + json.dumps({"test": test, "mode": mode, **result}), flush=True)


# ---------------------------------------------------------------------------------------------
# Driver side: subprocesses, timeouts, result file, tables.


def run_one(mode: str, test: str, timeout: float) -> dict:
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--worker", mode, test],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # iree-compile is a Python shim around the real binary: kill the whole process group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {
            "test": test,
            "mode": mode,
            "status": "fail",
            "stage": "timeout",
            "message": f"timeout {timeout:.0f}s",
            "seconds": timeout,
        }
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # stray grandchildren
    seconds = time.perf_counter() - start
    for line in stdout.splitlines():
        if line.startswith("@@RESULT "):
            return {**json.loads(line[len("@@RESULT ") :]), "seconds": round(seconds, 2)}
    return {
        "test": test,
        "mode": mode,
        "status": "fail",
        "stage": "crash",
        "message": f"worker exited {proc.returncode}: {_last_error(stderr)}",
        "seconds": round(seconds, 2),
    }


_CATEGORIES: list[tuple[str, str]] = [
    (r"cannot lower ONNX op\(s\) (\w+)", r"ONNX op has no lowering (\1)"),
    (r"ops outside the ai.onnx domain", "op outside the ai.onnx domain"),
    (r"no default-domain", "model without a default-domain opset"),
    (r"float8 graph input/output", "float8 graph input/output (no float8 dtype in signatures)"),
    (
        r"cannot compile .*(float4e2m1|float8e8m0|int2|uint2|int4/uint4 with an odd|complex)",
        r"unsupported element type (\1)",
    ),
    (r"failed to legalize operation 'torch\.operator'.*?onnx\.(\w+)", r"ONNX op not lowered (\1)"),
    (r"failed to legalize operation '([\w.]+)'", r"op not legalized (\1)"),
    (r"\(onnx\.(\w+)\)|name = \"onnx\.(\w+)\"", r"ONNX op not lowered (\1\2)"),
    (
        r"Unknown ONNX tensor element type|Unsupported builtin tensor type|unsupported dtype",
        "unsupported element type",
    ),
    (r"crashed|Stack dump|Assertion", "compiler crashed"),
    (r"does not have integral number", "sub-byte tensor size"),
    (r"buffer view byte length", "f64 buffer size mismatch (f64 demoted)"),
]


def category(result: dict) -> str:
    stage, message = result.get("stage", ""), result.get("message", "")
    if stage == "compare":
        if "is float32, expected float64" in message:
            return "dtype: float64 computed as float32 (IREE's input phase demotes f64)"
        kind = message.split(":", 1)[0]
        detail = re.sub(r" in output \d+| output \d+.*", "", message.split(":", 1)[-1]).strip()
        return f"{kind}: {detail}" if kind == "numeric" else kind
    if stage in ("timeout", "crash", "harness"):
        return stage
    if "\nerror: " in message:  # compiler diagnostics: the first error says what failed
        message = message.split("\nerror: ", 1)[1]
    message = " ".join(message.split())
    for pattern, label in _CATEGORIES:
        m = re.search(pattern, message)
        if m:
            return f"{stage}: {m.expand(label)}"
    message = re.sub(
        r"^import of graph \S+ failed: (lowering the ONNX model failed: )?", "", message
    )
    text = re.sub(r"'[^']*'|\"[^\"]*\"|\d+", "…", message)
    return f"{stage}: {text[:90]}"


def load_results(path: Path) -> dict[tuple[str, str], dict]:
    results: dict[tuple[str, str], dict] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                results[(r["mode"], r["test"])] = r
    return results


def summarize(results: dict[tuple[str, str], dict], modes: tuple[str, ...], top: int) -> str:
    lines = []
    rows = []
    for mode in modes:
        rs = [r for (m, _), r in results.items() if m == mode]
        tried = [r for r in rs if r["status"] != "skip"]
        passed = [r for r in tried if r["status"] == "pass"]
        rate = 100.0 * len(passed) / len(tried) if tried else 0.0
        rows.append((mode, len(rs), len(rs) - len(tried), len(tried), len(passed), rate))
    lines.append("| path | tests | skipped | tried | pass | pass rate |")
    lines.append("|---|---|---|---|---|---|")
    for mode, n, skipped, tried, passed, rate in rows:
        lines.append(f"| {mode} | {n} | {skipped} | {tried} | {passed} | {rate:.1f}% |")
    plex = {t: r for (m, t), r in results.items() if m == "plex"}
    if plex:
        frozen = sum(1 for r in plex.values() if r.get("frozen"))
        frozen_pass = sum(1 for r in plex.values() if r.get("frozen") and r["status"] == "pass")
        warned = [r for r in plex.values() if r.get("warnings")]
        lines.append("")
        lines.append(
            f"plex: {frozen} tests had graph inputs frozen to constants ({frozen_pass} of them "
            f"pass); {len(warned)} builds carried a silently-wrong-op warning "
            f"({sum(1 for r in warned if r['status'] != 'pass')} of those fail the comparison)."
        )
    for mode in modes:
        cats = Counter(
            category(r) for (m, _), r in results.items() if m == mode and r["status"] == "fail"
        )
        if not cats:
            continue
        lines.append("")
        lines.append(f"Failure categories, {mode} (top {top})")
        lines.append("")
        lines.append("| # | category | examples |")
        lines.append("|---|---|---|")
        for cat, count in cats.most_common(top):
            examples = sorted(
                t
                for (m, t), r in results.items()
                if m == mode and r["status"] == "fail" and category(r) == cat
            )[:3]
            lines.append(f"| {count} | {cat} | {', '.join(examples)} |")
        rest = sum(cats.values()) - sum(c for _, c in cats.most_common(top))
        if rest:
            lines.append(f"| {rest} | ({len(cats) - top} other categories) | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, help="run N tests spread evenly over the suite")
    parser.add_argument("--tests", help="comma-separated test names (default: every node test)")
    parser.add_argument("--mode", choices=[*MODES, "both"], default="both")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT)
    parser.add_argument("--results", type=Path, help="JSONL file to append results to")
    parser.add_argument("--resume", action="store_true", help="skip tests already in --results")
    parser.add_argument("--top", type=int, default=25, help="failure categories to print")
    parser.add_argument("--report-only", action="store_true", help="only print --results tables")
    parser.add_argument(
        "--host-fallback",
        action="store_true",
        help="build with [graph] host_fallback = true (ONNX nodes IREE cannot lower run on the "
        "host, through ONNX Runtime)",
    )
    parser.add_argument("--worker", nargs=2, metavar=("MODE", "TEST"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(*args.worker)
        return 0
    modes = MODES if args.mode == "both" else (args.mode,)
    if args.host_fallback:
        os.environ[HOST_FALLBACK_ENV] = "1"  # inherited by the workers
    if args.tests:
        tests = args.tests.split(",")
    elif args.sample:
        tests = sample_tests(args.sample)
    else:
        tests = all_tests()
    results: dict[tuple[str, str], dict] = {}
    if args.results and (args.resume or args.report_only):
        results = {k: v for k, v in load_results(args.results).items() if k[1] in set(tests)}
    if args.report_only:
        print(summarize(results, modes, args.top))
        return 0
    todo = [(m, t) for t in tests for m in modes if (m, t) not in results]
    out = args.results.open("a") if args.results else None
    start = time.perf_counter()
    done = 0
    try:
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = [pool.submit(run_one, m, t, args.timeout) for m, t in todo]
            for future in futures:
                r = future.result()
                results[(r["mode"], r["test"])] = r
                done += 1
                if out:
                    out.write(json.dumps(r) + "\n")
                    out.flush()
                mark = {"pass": "ok", "skip": "skip"}.get(r["status"], "FAIL")
                print(
                    f"[{done}/{len(todo)} {time.perf_counter() - start:6.0f}s] {r['mode']:4} "
                    f"{mark:4} {r['test']} {category(r) if mark == 'FAIL' else ''}",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        if out:
            out.close()
    print(summarize(results, modes, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
