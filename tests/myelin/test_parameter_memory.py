"""The parameter memory IREE wraps is released on a Python thread (myelin.runtime.parameter_memory):
an IREE worker that retires a call after its model was closed holds the last reference to the
file's mapping, and IREE 3.13 drops what it wraps there without the GIL (before the fix: an abort
here, an intermittent segfault in a full test run)."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import time
import weakref

import numpy as np

import myelin
from myelin.runtime import parameter_memory

# The call is queued behind a fence only the script signals, then every Python reference to the
# model goes: the queued work alone holds the parameters, and the worker that runs it releases
# them. MyeLiN's own call path is used below its waiting (session.resolve, the packer, the VM
# context), so that the release cannot happen before the model is gone.
_WORKER_RELEASES = textwrap.dedent(
    """
    import gc, sys, time
    import numpy as np
    import iree.runtime as rt
    import myelin
    from myelin.runtime import parameter_memory
    from myelin.runtime._iree_private import InvokeContext

    model = myelin.Instance().load(sys.argv[1])
    session = model.session()
    call = session.resolve("forward")
    assert call._async, "the mlp example is built with the fences ABI"
    gate = call._device.create_semaphore(0)
    args = call._packer.pack(InvokeContext(call._device), [np.ones((5, 16), np.float32)], {})
    args.push_ref(rt.HalFence.create_at(gate, 1))
    done = rt.HalFence.create_at(gate, 2)
    args.push_ref(done)
    session._context.invoke(call._function, args, rt.VmVariantList(1))
    del args, call
    session.close(); model.close(); del session, model
    gc.collect()
    gate.signal(1)
    done.wait()
    deadline = time.monotonic() + 10
    while parameter_memory.held() and time.monotonic() < deadline:
        time.sleep(0.01)
        parameter_memory.collect()
    print("held", parameter_memory.held())
    """
)


def test_a_worker_that_releases_the_parameters_last_does_not_crash(mlp_mln):
    result = subprocess.run(
        [sys.executable, "-c", _WORKER_RELEASES, str(mlp_mln)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    # ...and the mapping went once the worker was done, on the script's own thread.
    assert result.stdout.split() == ["held", "0"]


def test_a_closed_model_gives_its_mapping_back(mlp_mln):
    model = myelin.Instance().load(mlp_mln)
    mapping = weakref.ref(model._reader.mmap)
    with model.session() as session:
        session.call("forward", np.ones((2, 16), np.float32))
    model.close()
    del model, session
    deadline = time.monotonic() + 10
    while mapping() is not None and time.monotonic() < deadline:
        gc.collect()
        parameter_memory.collect()
        time.sleep(0.01)
    assert mapping() is None
