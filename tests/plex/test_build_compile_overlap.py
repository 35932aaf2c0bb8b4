"""Two IREE compiler sessions in two threads compile at the same time (proved by timestamps).

Speed-ups are noise on a 2-vCPU machine that gives about one core of throughput, so the proof is
the time line: both compiles are in flight together for most of their duration, and a pure-Python
thread keeps running meanwhile, which it could not if a compile held the GIL.
"""

from __future__ import annotations

import threading
import time

import iree.runtime as rt

from myelin.compiler.session import CompilerSession
from tests.plex.build_helpers import matmul_chain_mlir

FLAGS = (
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
    "--iree-llvmcpu-target-cpu=host",
)


def test_two_compiler_sessions_overlap_through_vmfb_emission():
    sources = [matmul_chain_mlir(4, "a", 8), matmul_chain_mlir(4, "b", 20)]
    ready = threading.Barrier(2)
    spans: dict[int, tuple[float, float]] = {}
    vmfbs: dict[int, bytes] = {}
    errors: list[BaseException] = []

    def compile_one(i: int) -> None:
        try:
            with CompilerSession(FLAGS) as session:
                module = session.parse(sources[i], compile_to="input")
                ready.wait(timeout=60)
                start = time.monotonic()
                vmfbs[i], _ = session.compile(module, compile_from="input")
                spans[i] = (start, time.monotonic())
        except BaseException as e:  # surfaced by the main thread
            errors.append(e)

    ticks: list[float] = []
    stop = threading.Event()

    def heartbeat() -> None:  # needs the GIL for every tick
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.002)

    beat = threading.Thread(target=heartbeat)
    beat.start()
    workers = [threading.Thread(target=compile_one, args=(i,)) for i in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=300)
    stop.set()
    beat.join()
    assert not errors, errors

    (a0, a1), (b0, b1) = spans[0], spans[1]
    overlap = min(a1, b1) - max(a0, b0)
    shorter = min(a1 - a0, b1 - b0)
    assert shorter > 0.5, f"compiles too short to show anything: {spans}"
    assert overlap > 0.5 * shorter, f"compiles did not overlap: {spans}"
    inside = [t for t in ticks if max(a0, b0) <= t <= min(a1, b1)]
    gaps = [b - a for a, b in zip([max(a0, b0), *inside], [*inside, min(a1, b1)], strict=True)]
    assert max(gaps) < 0.25 * overlap, f"a Python thread stalled {max(gaps):.3f}s of {overlap:.3f}s"

    instance = rt.VmInstance()  # both outputs are complete, loadable VM modules
    for i, name in enumerate(("a", "b")):
        module = rt.VmModule.copy_buffer(instance, vmfbs[i])
        assert module.name == name and "f3" in module.function_names
