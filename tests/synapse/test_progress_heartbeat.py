"""Plain progress in logs and CI: a node that runs long prints a heartbeat line, so a 60 s
compile does not look like a hang; nothing more is printed once the run is done."""

from __future__ import annotations

import io
import time

from synapse import Event, PlainProgress


def test_a_long_running_node_prints_heartbeats_until_it_finishes():
    out = io.StringIO()
    with PlainProgress(out, heartbeat_s=0.2) as progress:
        progress(Event("plan", message="2 nodes, 0 cached, 2 to run", total=2))
        progress(Event("start", node_id="compile:mlp:mlp:default", total=2, heavy=True))
        progress(Event("start", node_id="weights:mlp:params", total=2))
        progress(Event("finish", node_id="weights:mlp:params", status="built", done=1, total=2))
        time.sleep(0.7)
        progress(
            Event("finish", node_id="compile:mlp:mlp:default", status="built", done=2, total=2)
        )
        progress(Event("done", status="ok", message="2 built", done=2, total=2))
        time.sleep(0.5)  # the heartbeat thread has stopped: no line after the summary
    lines = out.getvalue().splitlines()
    beats = [line for line in lines if " running " in line]
    assert 2 <= len(beats) <= 4, lines
    assert all(b.startswith("[1/2] running   compile:mlp:mlp:default (") for b in beats), beats
    assert all(b.endswith("s so far)") for b in beats)
    assert not any("weights:mlp:params" in b for b in beats)  # it finished at once
    assert lines[-1] == "ok: 2 built"


def test_short_nodes_print_no_heartbeat_and_none_can_be_turned_off():
    for heartbeat in (5.0, None):
        out = io.StringIO()
        with PlainProgress(out, heartbeat_s=heartbeat) as progress:
            progress(Event("start", node_id="import:mlp:mlp", total=1))
            time.sleep(0.3)
            progress(Event("finish", node_id="import:mlp:mlp", status="built", done=1, total=1))
            progress(Event("done", status="ok", message="1 built", done=1, total=1))
        assert "running" not in out.getvalue()
