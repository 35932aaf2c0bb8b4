#!/usr/bin/env python3
"""Soak the MyeLiN runtime: many threads calling sessions of two models at once, valid inputs
checked against numpy mixed with invalid ones that must raise the documented InputError.

    .venv/bin/python tools/soak.py                               # 64 threads x 1000 calls
    .venv/bin/python tools/soak.py --threads 64 --calls 20000    # the longer run

The models are examples/mlp (`forward`, `hidden`: float32 batches of any size) and
examples/placement built for the CPU (`embed`: int64 ids into a 256-row table, whose valid range
the runtime checks). Sessions alternate between the two models; thread t uses session t mod S.
Each call is valid (five in eight for the MLP, three in four for embed: results compared
with numpy) or invalid: a wrong dtype,
a wrong size, a wrong rank, or one id out of range at a random position, each of which must raise
InputError with the documented text. The report counts wrong answers, unexpected exceptions and
the resident memory after warm-up and at the end (it must stay flat: no leak per call).
tests/myelin/test_soak.py runs the 64 x 1000 soak in CI.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
RTOL = 1e-5  # relative L2 error against numpy, fp32
EMBED_APP = (
    '[app]\nname = "embed"\npackages = ["placement"]\n\n[devices.cpu]\ntarget = "llvm-cpu"\n'
)


@dataclass
class SoakReport:
    calls: int = 0
    valid_checked: int = 0
    invalid_refused: int = 0
    wrong: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    rss_after_warmup: int = 0
    rss_end: int = 0
    seconds: float = 0.0
    rss_samples: list[int] = field(default_factory=list)  # every half second after warm-up

    @property
    def rss_growth(self) -> float:
        return self.rss_end / self.rss_after_warmup - 1

    def summary(self) -> str:
        return (
            f"{self.calls} calls in {self.seconds:.1f} s: {self.valid_checked} valid checked "
            f"against numpy, {self.invalid_refused} invalid refused with InputError, "
            f"{len(self.wrong)} wrong answers, {len(self.unexpected)} unexpected errors; RSS "
            f"{self.rss_after_warmup / 2**20:.1f} MiB after warm-up, {self.rss_end / 2**20:.1f} "
            f"MiB at the end ({self.rss_growth * 100:+.2f}%)"
        )


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def build_models(folder: Path) -> tuple[Path, Path]:
    """examples/mlp, and examples/placement for the CPU only (its `embed` checks ids)."""
    from plex.builder import build

    package = folder / "placement"
    package.mkdir(parents=True)
    for name in ("plex.toml", "embed.mlir", "blocks.mlir", "head.mlir", "params.safetensors"):
        shutil.copy(REPO / "examples" / "placement" / name, package / name)
    (folder / "app.toml").write_text(EMBED_APP)
    build(REPO / "examples" / "mlp" / "app.toml", folder / "mlp.mln")
    build(folder / "app.toml", folder / "embed.mln")
    return folder / "mlp.mln", folder / "embed.mln"


def _rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def soak(
    mlp_mln: Path,
    embed_mln: Path,
    *,
    threads: int = 64,
    calls: int = 1000,
    sessions: int = 8,
    warmup: int = 200,
) -> SoakReport:
    """Run the soak; `warmup` of each thread's `calls` come before the first RSS reading."""
    from safetensors.numpy import load_file

    import myelin
    from myelin.errors import InputError

    weights = load_file(str(REPO / "examples" / "mlp" / "params.safetensors"))
    table = load_file(str(REPO / "examples" / "placement" / "params.safetensors"))["embed.table"]
    instance = myelin.Instance()
    models = [instance.load(mlp_mln), instance.load(embed_mln)]
    opened = [models[i % 2].session() for i in range(sessions)]
    report = SoakReport()
    lock = threading.Lock()

    def after_warmup() -> None:
        report.rss_after_warmup = rss_bytes()

    barrier = threading.Barrier(threads, action=after_warmup)

    def mlp_call(session, rng: np.random.Generator) -> bool:
        """One call of the MLP; True when it was a valid call whose result matched."""
        batch = int(rng.integers(1, 65))
        x = rng.standard_normal((batch, 16)).astype(np.float32)
        kind = rng.integers(0, 8)
        if kind == 0:
            bad, expect = x.astype(np.float64), "has dtype float64, expected float32"
        elif kind == 1:
            bad, expect = x[:, :15].copy(), "has size 15 in dimension 1, expected 16"
        elif kind == 2:
            bad, expect = x[None], "has rank 3"
        else:
            bad = None
        if bad is not None:
            try:
                session.call("forward", bad)
            except InputError as e:
                if expect not in str(e):
                    raise AssertionError(f"InputError text changed: {e}") from e
                return False
            raise AssertionError("an invalid MLP input was accepted")
        h = np.maximum(x @ weights["w1"] + weights["b1"], 0.0)
        if kind % 2:
            got, want = session.call("hidden", x), h
        else:
            got, want = session.call("forward", x), h @ weights["w2"] + weights["b2"]
        if _rel_err(got, want) >= RTOL:
            raise ValueError(f"MLP result off by {_rel_err(got, want):.2e} (batch {batch})")
        return True

    def embed_call(session, rng: np.random.Generator) -> bool:
        ids = rng.integers(0, 256, size=int(rng.integers(1, 513)), dtype=np.int64)
        if rng.integers(0, 4) == 0:
            at = int(rng.integers(0, len(ids)))
            ids[at] = int(rng.choice([-1, 256, 1000, 100_000_000, -(2**62)]))
            expect = f"embed(ids): value {ids[at]} at [{at}] is out of range [0, 256)"
            try:
                session.call("embed", ids)
            except InputError as e:
                if str(e) != expect:
                    raise AssertionError(f"InputError text changed: {e}") from e
                return False
            raise AssertionError("an out-of-range id was accepted")
        got = session.call("embed", ids)
        if not np.array_equal(got, table[ids]):
            raise ValueError(f"embed rows differ from the table ({len(ids)} ids)")
        return True

    def worker(t: int) -> None:
        rng = np.random.default_rng(t)
        session = opened[t % sessions]
        call = mlp_call if t % sessions % 2 == 0 else embed_call
        valid = invalid = 0
        wrong: list[str] = []
        unexpected: list[str] = []
        for i in range(calls):
            if i == warmup:
                barrier.wait()
            try:
                if call(session, rng):
                    valid += 1
                else:
                    invalid += 1
            except ValueError as e:
                wrong.append(f"thread {t} call {i}: {e}")
            except Exception as e:
                unexpected.append(f"thread {t} call {i}: {type(e).__name__}: {e}")
        with lock:
            report.calls += calls
            report.valid_checked += valid
            report.invalid_refused += invalid
            report.wrong += wrong
            report.unexpected += unexpected

    started = time.perf_counter()
    workers = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    while any(w.is_alive() for w in workers):
        time.sleep(0.5)
        if report.rss_after_warmup:
            report.rss_samples.append(rss_bytes())
    for w in workers:
        w.join()
    report.seconds = time.perf_counter() - started
    report.rss_end = rss_bytes()
    for s in opened:
        s.close()
    for m in models:
        m.close()
    return report


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=64)
    parser.add_argument("--calls", type=int, default=1000, help="calls per thread")
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument(
        "--warmup", type=int, default=200, help="calls per thread before the first RSS reading"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        mlp, embed = build_models(Path(tmp))
        report = soak(
            mlp, embed, threads=args.threads, calls=args.calls, sessions=args.sessions,
            warmup=args.warmup,
        )  # fmt: skip
    print(report.summary())
    samples = report.rss_samples[:: max(1, len(report.rss_samples) // 10)]
    print("RSS every few seconds (MiB):", " ".join(f"{r / 2**20:.1f}" for r in samples))
    for line in (report.wrong + report.unexpected)[:20]:
        print(" ", line)
    ok = not report.wrong and not report.unexpected and abs(report.rss_growth) <= 0.05
    return 0 if ok else 1


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    sys.exit(main())
