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
    returncode, output = _run_bounded([sys.executable, "-c", "print('built'); raise SystemExit(3)"], dict(os.environ), 30)
    assert (returncode, output.strip()) == (3, "built")
