"""The fence wait policy of async calls (myelin.runtime.waiting), on IREE's local-task device: a
real semaphore signalled from another thread, as IREE's completion thread signals it."""

from __future__ import annotations

import threading
import time

import iree.runtime as rt
import pytest

from myelin.runtime.waiting import FenceWait


def _fence_signalled_after(
    delay_s: float, signalled_at: list[float] | None = None
) -> tuple[rt.HalFence, threading.Thread]:
    """A fence another thread signals after `delay_s`; it appends the time it signals at."""
    device = rt.get_device("local-task")
    semaphore = device.create_semaphore(0)
    fence = rt.HalFence.create_at(semaphore, 1)

    def signal() -> None:
        time.sleep(delay_s)
        if signalled_at is not None:
            signalled_at.append(time.perf_counter())
        semaphore.signal(1)

    thread = threading.Thread(target=signal)
    thread.start()
    return fence, thread


@pytest.mark.parametrize("spin_s", [0.0, 0.002])
def test_a_wait_returns_once_the_fence_is_signalled_and_remembers_how_long(spin_s):
    policy = FenceWait(spin_s)
    for _ in range(2):  # the second wait blocks first, then polls around the expected time
        signalled_at: list[float] = []
        fence, thread = _fence_signalled_after(0.01, signalled_at)
        start = time.perf_counter()
        policy.wait(fence, lambda: 0.02, lambda: None)
        end = time.perf_counter()
        thread.join()
        # Returned once signalled. No bound on how long it took: on a loaded machine the
        # signalling thread's sleep can be mostly over before the wait starts.
        assert end >= signalled_at[0]
        if spin_s:
            assert 0 < policy.expected_s <= end - start  # the wait's own length, remembered
        else:  # a blocking-only wait (a session's policy never changes) times nothing
            assert policy.expected_s is None


def test_a_stop_raised_between_slices_ends_the_wait():
    fence, thread = _fence_signalled_after(0.2)
    checks = []

    def check():
        checks.append(1)
        if len(checks) == 3:
            raise TimeoutError("stopped")

    with pytest.raises(TimeoutError):
        FenceWait(0.001, expected_s=0.05).wait(fence, lambda: 0.005, check)
    assert len(checks) == 3
    thread.join()
