"""Ctrl-C during `plex build`: a real process, a real SIGINT while IREE compiles."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

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
