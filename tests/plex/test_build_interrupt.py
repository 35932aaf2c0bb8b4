"""Ctrl-C during `plex build`: a real process, a real SIGINT while IREE compiles."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from plex.builder import build
from synapse import Cache
from tests.plex.build_helpers import write_chain_app


def test_sigint_during_a_compile_stops_cleanly_and_leaves_nothing_half_written(tmp_path):
    app_toml = write_chain_app(tmp_path / "app", functions=6, graphs=2)
    cache_dir = tmp_path / "cache"
    out = tmp_path / "out" / "chains.mln"
    process = subprocess.Popen(
        [sys.executable, "-m", "plex", "build", str(app_toml), "-o", str(out), "--json", "-j", "1"],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PLEX_CACHE_DIR": str(cache_dir)},
    )
    events = []
    assert process.stderr is not None
    for line in process.stderr:
        if not line.startswith("{"):
            continue
        events.append(json.loads(line))
        if events[-1]["kind"] == "start" and events[-1]["node_id"].startswith("compile:"):
            time.sleep(0.5)  # well inside the IREE compile (about 2 s here)
            process.send_signal(signal.SIGINT)
            sent = time.monotonic()
            break
    rest = process.stderr.read()
    returncode = process.wait(timeout=120)
    events += [json.loads(line) for line in rest.splitlines() if line.startswith("{")]

    assert returncode == 130, rest
    assert "plex: interrupted" in rest
    assert time.monotonic() - sent < 30  # the running compile was awaited, nothing else started
    [done] = [e for e in events if e["kind"] == "done"]
    assert done["status"] == "interrupted"
    compiles = {e["node_id"]: e["status"] for e in events if e["kind"] in ("finish", "error")}
    # The compile running when the signal came (the first one, unless it was done within the
    # half second) is the one cancelled; no other node is.
    [interrupted] = [node for node, status in compiles.items() if status == "cancelled"]
    assert interrupted.startswith("compile:")
    started = [e["node_id"] for e in events if e["kind"] == "start"]
    assert started.count(interrupted) == 1 and "compose" not in started

    # Nothing at the output path, no temporary file beside it, nothing half-written in the cache.
    assert not out.exists()
    assert not out.parent.exists() or list(out.parent.iterdir()) == []
    cache = Cache(cache_dir)
    assert list((cache_dir / "tmp").iterdir()) == []
    entries = cache.ls()
    assert interrupted not in {e.node_id for e in entries}
    assert all(cache.get(e.key) == e.path for e in entries)  # every entry passes its hash check

    # The next build reuses what finished before the interrupt and completes.
    result = build(app_toml, out, cache_dir=cache_dir)
    assert result.results[interrupted].status == "built"
    assert all(r.status == "hit" for i, r in result.results.items() if i.startswith("import:"))
    assert out.is_file()


SLOW_MODEL_PY = """
import os
import time
from pathlib import Path

import torch


class Tiny(torch.nn.Module):
    def forward(self, x):
        return torch.tanh(x) * 2


def build():
    # The test's signal: this import step runs now, in this worker process.
    marker = os.environ.get("PLEX_TEST_IMPORT_MARKER")
    if marker:
        Path(marker).write_text(str(os.getpid()))
        time.sleep(120)
    return Tiny().eval(), (torch.zeros(2, 4),)
"""


def _torch_app(root: Path) -> Path:
    (root / "tiny").mkdir(parents=True)
    (root / "tiny" / "model.py").write_text(SLOW_MODEL_PY)
    (root / "tiny" / "plex.toml").write_text(
        '[package]\nname = "tiny"\n\n[graph.tiny]\nsource = "model.py:build"\nfrontend = "torch"\n'
    )
    (root / "app.toml").write_text('[app]\nname = "tiny"\npackages = ["tiny"]\n')
    return root / "app.toml"


def _running(pid: int) -> bool:
    """Whether `pid` is a process that has not exited (a zombie has)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigkill_of_plex_build_kills_its_worker_and_the_next_build_removes_its_leftovers(
    tmp_path,
):
    app_toml = _torch_app(tmp_path / "app")
    cache_dir = tmp_path / "cache"
    marker = tmp_path / "worker.pid"
    env = {**os.environ, "PLEX_CACHE_DIR": str(cache_dir), "PLEX_TEST_IMPORT_MARKER": str(marker)}
    process = subprocess.Popen(
        [sys.executable, "-m", "plex", "build", str(app_toml), "-o", str(tmp_path / "a.mln")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    deadline = time.monotonic() + 180
    while not marker.exists() or not marker.read_text():
        assert process.poll() is None and time.monotonic() < deadline, "the import never ran"
        time.sleep(0.1)
    worker = int(marker.read_text())
    assert worker != process.pid and _running(worker)
    leftovers = list((cache_dir / "tmp").iterdir())
    assert [p.name.split("-")[1] for p in leftovers] == [str(process.pid)]  # its staging folder

    process.kill()
    process.wait(timeout=30)
    killed = time.monotonic()
    while _running(worker) and time.monotonic() - killed < 5:
        time.sleep(0.05)
    assert not _running(worker), "the worker outlived its build by 5 s"

    # The next build, same cache, no marker: it removes the dead build's staging folder.
    result = build(app_toml, tmp_path / "b.mln", cache_dir=cache_dir)
    assert result.results["import:tiny:tiny"].status == "built"
    assert not any(p.exists() for p in leftovers)
    assert list((cache_dir / "tmp").iterdir()) == []
