"""Progress renderers: callables that consume executor `Event`s and show them.

    with make_progress("auto", sys.stderr) as progress:
        Executor(cache, on_event=progress).run(plan)

`RichProgress` is a live display for terminals, `PlainProgress` one line per node start/finish for
logs and CI (plus a heartbeat line for a node that runs long), `JsonProgress` one JSON object per
event for tools. All are context managers (the rich one owns a live display, the plain one a
heartbeat thread; both stop at the run's "done" event or on exit) and expect serialized calls,
which the executor guarantees.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import IO, TYPE_CHECKING, Literal

from synapse._events import Event

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

ProgressMode = Literal["auto", "rich", "plain", "json"]
PROGRESS_MODES: tuple[ProgressMode, ...] = ("auto", "rich", "plain", "json")


class ProgressRenderer:
    """Base: an event consumer that may hold a display open between `__enter__` and `__exit__`."""

    def __call__(self, event: Event) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Release the display; safe to call twice."""

    def __enter__(self) -> ProgressRenderer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class PlainProgress(ProgressRenderer):
    """One line per node start and finish (plus errors, discarded cache entries and a summary),
    and a heartbeat: while a node runs longer than `heartbeat_s`, one `running` line for it every
    `heartbeat_s` seconds, so a log or CI job shows that a long compile is alive (None: none).
    """

    def __init__(self, stream: IO[str] | None = None, *, heartbeat_s: float | None = 10.0) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.heartbeat_s = heartbeat_s
        # The heartbeat thread writes too: one lock keeps lines whole and the state consistent.
        self._lock = threading.Lock()
        self._running: dict[str, list[float]] = {}  # node id -> [start, last line], monotonic
        self._counter = ""
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def __call__(self, event: Event) -> None:
        counter = f"[{event.done}/{event.total}]"
        if event.kind == "plan":
            line = f"plan: {event.message}"
        elif event.kind == "start":
            line = f"{counter} start     {event.node_id}"
        elif event.kind == "finish":
            line = f"{counter} {event.status:<9} {event.node_id} ({event.seconds:.2f}s)"
            if event.worker:
                line += f" on {event.worker}"
        elif event.kind == "error":
            line = f"{counter} FAILED    {event.node_id}: {event.message}"
        elif event.kind == "cache" and event.status == "discarded":
            line = f"{counter} discarded {event.node_id}: {event.message}"
        elif event.kind == "log":
            line = f"{' ' * len(counter)} {event.node_id}: {event.message}"
        elif event.kind == "done":
            line = f"{event.status}: {event.message}"
        else:  # cache hits are counted in the plan line; `explain` lists them
            line = None
        with self._lock:
            self._counter = counter
            if event.kind == "start":
                now = time.monotonic()
                self._running[event.node_id] = [now, now]
            elif event.kind in ("finish", "error"):
                self._running.pop(event.node_id, None)
            if line is not None:
                self._write(line)
        if event.kind == "start":
            self._start_heartbeat()
        elif event.kind == "done":
            self.close()

    def _write(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()

    def _start_heartbeat(self) -> None:
        if self.heartbeat_s is None or self._heartbeat is not None or self._stop.is_set():
            return
        self._heartbeat = threading.Thread(
            target=self._beat, name="synapse-progress-heartbeat", daemon=True
        )
        self._heartbeat.start()

    def _beat(self) -> None:
        assert self.heartbeat_s is not None
        every = self.heartbeat_s
        while not self._stop.wait(min(1.0, every / 4)):
            with self._lock:
                now = time.monotonic()
                for node_id, times in self._running.items():
                    if now - times[1] >= every:
                        times[1] = now
                        self._write(
                            f"{self._counter} running   {node_id} ({now - times[0]:.0f}s so far)"
                        )

    def close(self) -> None:
        self._stop.set()
        thread, self._heartbeat = self._heartbeat, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()


class JsonProgress(ProgressRenderer):
    """One JSON object per event, one per line (`Event.to_dict()`)."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream if stream is not None else sys.stdout

    def __call__(self, event: Event) -> None:
        self.stream.write(json.dumps(event.to_dict()) + "\n")
        self.stream.flush()


class RichProgress(ProgressRenderer):
    """A live terminal display: nodes done/total, cache hits, and each running heavy node with
    its elapsed seconds. Errors and discarded cache entries print above it; a summary at the end.

    Use as a context manager so the display is restored even when the build raises; it also
    starts on the first event and stops on the run's "done" event.
    """

    def __init__(self, stream: IO[str] | None = None, *, console: Console | None = None) -> None:
        from rich.console import Console  # rich is only needed for this renderer

        self.console = console or Console(file=stream if stream is not None else sys.stderr)
        self._lock = threading.Lock()  # the live display's refresh thread reads our state
        self._live = None
        self._done = self._total = self._hits = 0
        self._running: dict[str, tuple[str, float, bool]] = {}  # id -> (label, start, heavy)

    def __enter__(self) -> RichProgress:
        self._start()
        return self

    def _start(self) -> None:
        if self._live is None:
            from rich.live import Live

            self._live = Live(
                get_renderable=self._render,
                console=self.console,
                refresh_per_second=4,
                transient=True,
            )
            self._live.start()

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def __call__(self, event: Event) -> None:
        self._start()
        with self._lock:
            self._done, self._total, self._hits = event.done, event.total, event.hits
            if event.kind == "start":
                self._running[event.node_id] = (event.label, time.monotonic(), event.heavy)
            elif event.kind in ("finish", "error"):
                self._running.pop(event.node_id, None)
        from rich.markup import escape

        node, message = escape(event.node_id), escape(event.message)
        if event.kind == "error":
            self.console.print(f"[bold red]failed[/] {node}: {message}", highlight=False)
        elif event.kind == "cache" and event.status == "discarded":
            self.console.print(f"[yellow]discarded[/] {node}: {message}", highlight=False)
        elif event.kind == "finish" and event.heavy and event.status == "built":
            self.console.print(f"[green]built[/] {node} ({event.seconds:.1f}s)", highlight=False)
        elif event.kind == "done":
            self.close()
            style = "green" if event.status == "ok" else "bold red"
            self.console.print(f"[{style}]{event.status}[/]: {message}", highlight=False)
        if self._live is not None:
            self._live.refresh()

    def _render(self) -> RenderableType:
        from rich.markup import escape
        from rich.table import Table

        with self._lock:
            now = time.monotonic()
            heavy = [(i, label, now - t0) for i, (label, t0, h) in self._running.items() if h]
            light = sum(1 for _, _, h in self._running.values() if not h)
            done, total, hits = self._done, self._total, self._hits
        grid = Table.grid(padding=(0, 2))
        head = f"[bold]building[/] {done}/{total} done, {hits} cached"
        if light:
            head += f", {light} other running"
        grid.add_row(head)
        for node_id, label, elapsed in heavy:
            name = escape(node_id)
            if label and label != node_id:
                name += f" [dim]{escape(label)}[/]"
            grid.add_row(f"  [cyan]running[/] {name}  {elapsed:.1f}s")
        return grid


def make_progress(mode: ProgressMode = "auto", stream: IO[str] | None = None) -> ProgressRenderer:
    """A renderer for `mode`: "auto" picks rich on a terminal and plain lines otherwise."""
    stream = stream if stream is not None else sys.stderr
    if mode == "auto":
        is_tty = getattr(stream, "isatty", lambda: False)()
        mode = "rich" if is_tty and os.environ.get("TERM") != "dumb" else "plain"
    if mode == "rich":
        return RichProgress(stream)
    if mode == "plain":
        return PlainProgress(stream)
    if mode == "json":
        return JsonProgress(stream)
    raise ValueError(f"unknown progress mode {mode!r}; expected one of {', '.join(PROGRESS_MODES)}")
