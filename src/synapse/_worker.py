"""Process-isolated steps: a node marked `isolate=True` runs in a worker process of a pool that
lives as long as one `Executor.run`, so that a crash in native code (a segfault in a compiler or
in user model code) or a `sys.exit` in a step is one `StepCrashed` error naming the node, and
the cache stays as it was (the node's staging folder is discarded like any failed node's).

Workers are plain `python -c ...serve(...)` processes (not `multiprocessing`: that would
re-run the user's `__main__`), talking over two pipes with pickled messages: the parent sends
(node, out_dir, dep_outputs, key); the worker runs `run_job` and sends back logs, warnings and
the outcome. The job and its step are found in the worker by `Job.step_module`; the worker gets
the parent's `sys.path`. Cancellation kills the worker: its step stops at once (a thread must be
awaited), and a fresh worker replaces it for the next step.

A worker dies with its parent: a third pipe, the lifeline, is never written; the parent holds
its write end, so the kernel closes it when the parent dies however it dies (SIGKILL, OOM), and a
thread in the worker that waits on the read end kills the worker at once, in the middle of a
step. (`PR_SET_PDEATHSIG` would fire when the *thread* that started the worker exits, and
workers outlive the executor thread that needed them first; a pipe follows the process.)
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import traceback
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from synapse.errors import StepCrashed

_LENGTH = struct.Struct("<Q")
# What a worker process runs (not `-m synapse._worker`: the package imports this module first).
_WORKER_MAIN = (
    "import sys; from synapse._worker import serve; "
    "serve(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))"
)
POLL_S = 0.1  # how often a waiting parent thread looks at the cancellation flag


@dataclass(frozen=True)
class NodeView:
    """What a step in a worker sees of its node (a `Node` holds fingerprints that do not
    pickle, and recomputing them would hash every input file again)."""

    id: str
    job: Any
    label: str = ""

    @property
    def kind(self) -> str:
        return self.job.kind


class StepKilled(Exception):
    """The build was cancelled while the step ran in a worker, so the worker was killed."""


def _write(fd: int, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_LENGTH.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exact(fd: int, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None  # the other end closed: it exited or died
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read(fd: int) -> Any:
    """One message, or EOFError when the other end is gone."""
    head = _read_exact(fd, _LENGTH.size)
    body = _read_exact(fd, _LENGTH.unpack(head)[0]) if head is not None else None
    if body is None:
        raise EOFError
    return pickle.loads(body)


def _signal_name(code: int) -> str:
    try:
        return f"{signal.Signals(-code).name} (signal {-code})"
    except ValueError:
        return f"signal {-code}"


class _Worker:
    def __init__(self) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        lifeline_r, lifeline_w = os.pipe()
        child_fds = (to_child_r, from_child_w, lifeline_r)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _WORKER_MAIN, *map(str, child_fds)],
                pass_fds=child_fds,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        except BaseException:
            for fd in (to_child_w, from_child_r, lifeline_w):
                os.close(fd)
            raise
        finally:
            for fd in child_fds:
                os.close(fd)
        self.to_child, self.from_child, self.lifeline = to_child_w, from_child_r, lifeline_w

    def run(
        self,
        node: Any,
        out_dir: Path,
        dep_outputs: Mapping[str, Path],
        key: str,
        cancelled: threading.Event,
        log: Callable[[str], None],
    ) -> None:
        """Run the node's step in this worker; raise what the step raised, StepCrashed when the
        worker died, StepKilled when `cancelled` was set meanwhile."""
        try:
            request = (node.id, node.job, node.label, out_dir, dict(dep_outputs), key)
            _write(self.to_child, request)
        except (BrokenPipeError, OSError):
            raise self._crashed(node) from None
        while True:
            readable, _, _ = select.select([self.from_child], [], [], POLL_S)
            if not readable:
                if cancelled.is_set():
                    self.kill()
                    raise StepKilled(f"step '{node.id}' stopped: the build is stopping")
                continue
            try:
                kind, *payload = _read(self.from_child)
            except EOFError:
                raise self._crashed(node) from None
            if kind == "log":
                log(payload[0])
            elif kind == "warning":
                message, category, filename, lineno = payload
                warnings.warn_explicit(message, category, filename, lineno)
            elif kind == "done":
                return
            else:  # "error"
                raise payload[0]

    def _crashed(self, node: Any) -> StepCrashed:
        code = self.process.wait()
        how = _signal_name(code) if code < 0 else f"exit code {code}"
        return StepCrashed(
            f"step '{node.id}' crashed: its worker process died from {how} while it ran (a "
            "crash in native code such as the compiler, or in the model's own code); nothing "
            "of it was cached"
        )

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self.process.wait()
        self.close_pipes()

    def stop(self) -> None:
        """Ask an idle worker to exit (it sees end of input), then make sure it did. The
        lifeline closes last, so a worker that exits on its own is not killed on the way."""
        self._close(self.to_child, self.from_child)
        self.to_child = self.from_child = -1
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
        self.close_pipes()

    def close_pipes(self) -> None:
        self._close(self.to_child, self.from_child, self.lifeline)
        self.to_child = self.from_child = self.lifeline = -1

    @staticmethod
    def _close(*fds: int) -> None:
        for fd in fds:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)


class WorkerPool:
    """Worker processes kept for one run: a step takes an idle worker or starts one (at most one
    per running step, so at most the executor's `jobs`)."""

    def __init__(self) -> None:
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self.started = 0  # workers started, for tests and measurements

    def run(self, node: Any, context: Any) -> None:
        fresh = node.fresh_process
        worker = self._start() if fresh else self._take()
        try:
            worker.run(
                node,
                context.out_dir,
                context.dep_outputs,
                context.key,
                context.cancelled,
                context.log,
            )
        except (StepCrashed, StepKilled):
            worker.kill()  # already dead or killed: not returned to the pool
            raise
        except BaseException:
            self._give_back(worker, fresh)  # the step raised: the worker itself is fine
            raise
        self._give_back(worker, fresh)

    def _take(self) -> _Worker:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.alive():
                    return worker
                worker.kill()
        return self._start()

    def _start(self) -> _Worker:
        with self._lock:
            self.started += 1
        return _Worker()

    def _give_back(self, worker: _Worker, retire: bool = False) -> None:
        """Keep the worker for the next step, or stop it (`retire`: its step set state that
        no later step may meet)."""
        if retire:
            worker.stop()
            return
        with self._lock:
            self._idle.append(worker)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.stop()


# --- the worker process ----------------------------------------------------------------------


def _portable(exc: BaseException) -> BaseException:
    """The step's exception if it survives pickling, else a StepCrashed with its text; the
    worker's traceback travels as a note (shown by `--debug` tracebacks)."""
    note = "".join(traceback.format_exception(exc)).rstrip()
    if isinstance(exc, SystemExit):
        exc = StepCrashed(f"the step called sys.exit({exc.code!r}) (a step must raise instead)")
    try:
        exc = pickle.loads(pickle.dumps(exc))
    except Exception:
        exc = StepCrashed(f"{type(exc).__name__}: {exc}")
    with contextlib.suppress(Exception):
        exc.add_note(f"in the worker process:\n{note}")
    return exc


def _die_with_parent(lifeline_fd: int) -> None:
    """Wait until the parent's end of the lifeline closes, then kill this process (mid-step)."""
    with contextlib.suppress(OSError):
        while os.read(lifeline_fd, 1):
            pass  # nothing is ever written; this only guards against a stray byte
    os.kill(os.getpid(), signal.SIGKILL)


def serve(read_fd: int, write_fd: int, lifeline_fd: int) -> None:
    """The worker process's loop: one step per request until the parent closes the pipe."""
    from synapse._job import run_job
    from synapse._plan import NodeContext

    threading.Thread(
        target=_die_with_parent, args=(lifeline_fd,), name="lifeline", daemon=True
    ).start()
    # Ctrl-C reaches the whole process group: the parent decides (it kills us when stopping).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            node_id, job, label, out_dir, dep_outputs, key = _read(read_fd)
        except EOFError:
            return  # the parent closed the pipe or exited
        node = NodeView(node_id, job, label)
        context = NodeContext(
            node=node,  # type: ignore[arg-type]  # a step reads only its id, job and label
            out_dir=out_dir,
            dep_outputs=MappingProxyType(dep_outputs),
            cancelled=threading.Event(),
            key=key,
            _log=lambda msg: _write(write_fd, ("log", str(msg))),
        )
        outcome: tuple
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                run_job(node.job, context)
                outcome = ("done",)
            except BaseException as exc:
                outcome = ("error", _portable(exc))
        for w in caught:
            try:
                pickle.dumps(w.category)
                category = w.category
            except Exception:
                category = UserWarning
            _write(write_fd, ("warning", str(w.message), category, w.filename, w.lineno))
        _write(write_fd, outcome)
