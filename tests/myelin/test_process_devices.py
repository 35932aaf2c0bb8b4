"""HAL devices are per process: every Instance (every DeviceRegistry) shares them, so a service
that makes an Instance per request, or a test suite, does not leak a device per Instance."""

from __future__ import annotations

import os
import resource
import threading
from pathlib import Path

import iree.runtime as rt
import numpy as np

import myelin
from myelin.runtime.devices import DeviceRegistry
from tests.models import mlp_reference

RTOL = 1e-5  # fp32 against numpy: same math, different summation order


def native_threads() -> int:
    """Threads of this process, IREE's native workers included (`threading` sees only Python's)."""
    return len(os.listdir("/proc/self/task"))


def call_once(mlp_mln, x: np.ndarray) -> np.ndarray:
    model = myelin.Instance().load(mlp_mln)
    try:
        with model.session() as s:
            return s.call("forward", x)
    finally:
        model.close()


def test_many_instances_do_not_grow_the_thread_count(mlp_mln, mlp_weights):
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    _, want = mlp_reference(mlp_weights, x)
    call_once(mlp_mln, x)  # the first Instance creates the process's devices
    before = native_threads()
    for _ in range(8):
        got = call_once(mlp_mln, x)
        assert np.abs(got - want).max() / np.abs(want).max() < RTOL
    # <=: a thread another test left (a prefetcher winding down) may end meanwhile
    assert native_threads() <= before


def test_registries_share_devices_and_keep_ordinals_distinct():
    first, second = DeviceRegistry(), DeviceRegistry()
    assert first.device("local-task", 0) is second.device("local-task", 0)
    assert first.device("local-task", 1) is second.device("local-task", 1)
    assert first.device("local-task", 0) is not first.device("local-task", 1)
    # a device another registry created is still known by its driver (arrays move between them)
    assert DeviceRegistry().driver_of(first.device("local-task", 1)) == "local-task"


def test_two_instances_run_their_models_concurrently(mlp_mln, mlp_weights):
    models = [myelin.Instance().load(mlp_mln) for _ in range(2)]
    assert models[0].devices[0] is models[1].devices[0]
    errors: list[float] = []
    start = threading.Barrier(len(models))

    def serve(model, seed: int) -> None:
        rng = np.random.default_rng(seed)
        start.wait()
        with model.session() as s:
            for _ in range(20):
                x = rng.standard_normal((int(rng.integers(1, 9)), 16)).astype(np.float32)
                _, want = mlp_reference(mlp_weights, x)
                got = s.call("forward", x)
                errors.append(float(np.abs(got - want).max() / np.abs(want).max()))

    threads = [threading.Thread(target=serve, args=(m, i)) for i, m in enumerate(models)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for model in models:
        model.close()
    assert len(errors) == 40 and max(errors) < RTOL


def test_registries_racing_for_a_new_device_get_one(monkeypatch):
    """The first registries of a process may ask for a device at once (Instances made on several
    threads): the device is created once and all of them get it."""
    from myelin.runtime import devices

    monkeypatch.setattr(devices, "_PROCESS_DEVICES", {})  # this process's devices exist already
    start = threading.Barrier(4)
    got: list[object] = []

    def ask() -> None:
        start.wait()
        got.append(DeviceRegistry().device("local-task", 3))

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 4 and all(d is got[0] for d in got)


def test_a_local_sync_device_reuses_freed_memory_instead_of_faulting_it_in_again():
    """A local-sync device allocates a call's transients inline every call: its caching
    allocator hands the next call the same pages (without it, 64 MiB is 16k page faults each
    time; myelin.runtime.devices.LOCAL_SYNC_ALLOCATOR)."""
    device = DeviceRegistry().device("local-sync")
    data = np.ones(16 << 20, np.float32)  # 64 MiB: glibc maps and unmaps a block this large
    faults = []
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        view = device.allocator.allocate_buffer_copy(
            memory_type=rt.MemoryType.DEVICE_LOCAL,
            allowed_usage=rt.BufferUsage.DEFAULT,
            device=device,
            buffer=data,
            element_type=rt.HalElementType.FLOAT_32,
        )
        del view
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    assert faults[0] > 8000  # the first touch of 64 MiB: the measurement sees faults
    assert max(faults[1:]) < 1000, faults


def test_a_one_thread_cpu_model_alone_on_local_task_is_chosen_local_sync(monkeypatch):
    from myelin.mln import BackendRecord, DeviceRecord
    from myelin.runtime import devices

    cpu = DeviceRecord(name="cpu", target="llvm-cpu", driver="local-task")
    chosen = {"cpu": {"driver": {"value": "local-sync", "reason": devices.ONE_HOST_THREAD}}}
    monkeypatch.setattr(devices, "_HOST_THREADS", 1)
    assert devices.host_drivers([cpu]) == (["local-sync"], chosen)
    # what the artifact says, and no choice recorded: a driver the app pinned, another target,
    # two devices, a backend's device
    pinned = DeviceRecord(name="cpu", target="llvm-cpu", driver="local-sync")
    assert devices.host_drivers([pinned]) == (["local-sync"], {})
    named = DeviceRecord("cpu", "llvm-cpu", "local-task", extras={"driver_pinned": True})
    assert devices.host_drivers([named]) == (["local-task"], {})
    vmvx = DeviceRecord(name="cpu", target="vmvx", driver="local-task")
    assert devices.host_drivers([vmvx]) == (["local-task"], {})
    other = DeviceRecord(name="cpu2", target="llvm-cpu", driver="local-task")
    assert devices.host_drivers([cpu, other]) == (["local-task"] * 2, {})
    plugin = BackendRecord(name="blas", abi=1, ops=("matmul",), plugin="p", libraries=())
    blas = DeviceRecord(name="cpu", target="llvm-cpu", driver="local-task", backend=plugin)
    assert devices.host_drivers([blas]) == (["local-task"], {})
    # more threads, or none set (IREE's default topology: a worker per core)
    for threads in (2, None):
        monkeypatch.setattr(devices, "_HOST_THREADS", threads)
        assert devices.host_drivers([cpu]) == (["local-task"], {})


# In a process of its own: the thread count is IREE's process-wide topology.
ONE_THREAD = """
import json, sys
import numpy as np
from myelin.runtime.devices import set_host_threads
set_host_threads(1)
import myelin
model = myelin.Instance().load(sys.argv[1])
with model.session() as s:
    out = s.call("forward", np.load(sys.argv[2]))
np.save(sys.argv[3], out)
print(json.dumps({"drivers": model.drivers, "host_chosen": model.host_chosen}))
"""


def _in_one_thread_process(mln: Path, x: np.ndarray, folder: Path) -> tuple[dict, np.ndarray]:
    """`forward(x)` in a fresh process of one host thread: its drivers and choices, and the
    result."""
    import json
    import subprocess
    import sys

    np.save(folder / "x.npy", x)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    args = [str(mln), str(folder / "x.npy"), str(folder / "out.npy")]
    run = subprocess.run(
        [sys.executable, "-c", ONE_THREAD, *args], capture_output=True, text=True, env=env
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.splitlines()[-1]), np.load(folder / "out.npy")


def test_a_one_thread_process_runs_the_mlp_on_local_sync_with_the_same_results(mlp_mln, tmp_path):
    """The choice as a process makes it: recorded on the model, results equal to local-task's
    (the same module; one call inline instead of on the worker)."""
    from myelin.runtime.devices import ONE_HOST_THREAD

    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    model = myelin.Instance().load(mlp_mln)  # this process: IREE's default topology
    assert model.drivers == ["local-task"] and model.host_chosen == {}
    with model.session() as s:
        want = s.call("forward", x)
    name = model.device_names[0]
    model.close()
    got, out = _in_one_thread_process(mlp_mln, x, tmp_path)
    assert got["drivers"] == ["local-sync"]
    assert got["host_chosen"] == {
        name: {"driver": {"value": "local-sync", "reason": ONE_HOST_THREAD}}
    }
    np.testing.assert_array_equal(out, want)


def test_a_driver_the_app_names_is_kept_in_a_one_thread_process(tmp_path):
    """`driver = "local-task"` written in the app: the device record says it was pinned, and a
    one-thread process runs it there, with no choice recorded."""
    import shutil

    from tests.conftest import EXAMPLES, build_app

    folder = tmp_path / "mlp"
    shutil.copytree(EXAMPLES / "mlp", folder)
    app = folder / "app.toml"
    app.write_text(
        app.read_text().replace('target = "llvm-cpu"', 'target = "llvm-cpu"\ndriver = "local-task"')
    )
    mln = build_app(app, tmp_path / "pinned.mln")
    model = myelin.Instance().load(mln)
    (device,) = model.manifest["variants"][0]["devices"]
    model.close()
    assert device["driver"] == "local-task" and device["driver_pinned"] is True
    got, _ = _in_one_thread_process(mln, np.ones((2, 16), np.float32), tmp_path)
    assert got == {"drivers": ["local-task"], "host_chosen": {}}
