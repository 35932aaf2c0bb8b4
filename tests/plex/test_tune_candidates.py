"""A candidate build that hangs (IREE 3.13's tuning-spec pass can deadlock) is killed with
everything it started, so one hung compile cannot hang `plex tune`."""

from __future__ import annotations

import os
import sys
import time

from plex.tune._candidates import _run_bounded

HANGS = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
time.sleep(600)
"""


def test_a_hung_candidate_is_killed_with_its_children():
    start = time.monotonic()
    returncode, output = _run_bounded([sys.executable, "-c", HANGS], dict(os.environ), 3)
    assert returncode is None
    assert time.monotonic() - start < 30
    grandchild = int(output.split()[0])
    time.sleep(0.5)
    try:
        os.kill(grandchild, 0)
    except ProcessLookupError:
        pass
    else:  # a zombie until init reaps it is gone too: its state says so
        with open(f"/proc/{grandchild}/stat") as stat:
            assert stat.read().split()[2] == "Z"


def test_a_finished_candidate_returns_its_exit_status_and_output():
    returncode, output = _run_bounded(
        [sys.executable, "-c", "print('built'); raise SystemExit(3)"], dict(os.environ), 30
    )
    assert (returncode, output.strip()) == (3, "built")


def _candidates(tmp_path, monkeypatch, timeout_s: float):
    import plex.tune._candidates as candidates
    from plex.tune import _Candidates

    monkeypatch.setenv("PLEX_BUILD_ISOLATE", "0")  # the step in this process: the patch applies
    monkeypatch.setattr(candidates, "CANDIDATE_TIMEOUT_S", timeout_s)
    app = '[app]\nname = "broken"\npackages = ["nowhere"]\n'  # fails to build, if it runs at all
    return _Candidates(app, (), tmp_path / "cache", tmp_path, jobs=1)


def test_a_timed_out_candidate_is_not_served_from_the_cache_next_time(tmp_path, monkeypatch):
    from synapse import Cache

    trials = _candidates(tmp_path, monkeypatch, timeout_s=0.05)  # killed before Python starts
    assert trials.build(["// spec"]) == [None]
    assert Cache(tmp_path / "cache" / "tune").ls() == []


def test_a_failed_candidate_stays_cached(tmp_path, monkeypatch):
    from synapse import Cache

    trials = _candidates(tmp_path, monkeypatch, timeout_s=300)
    assert trials.build(["// spec"]) == [None]
    assert len(Cache(tmp_path / "cache" / "tune").ls()) == 1
