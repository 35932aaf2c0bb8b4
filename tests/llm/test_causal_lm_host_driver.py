"""A causal LM loaded in a process set to one host thread runs on local-sync, as every single-CPU-
device model does there (myelin.runtime.devices.host_drivers), records that choice on the
model, and generates the tokens local-task generates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("iree.turbine")

import myelin
from myelin.runtime.devices import ONE_HOST_THREAD
from myelin.runtime.generation import Generator
from tests.llm.builds import PROMPT, build_causal_lm

pytestmark = pytest.mark.slow

NEW_TOKENS = 16

# In a process of its own: the thread count is IREE's process-wide topology.
ONE_THREAD = """
import json, sys
from myelin.runtime.devices import DeviceRegistry, set_host_threads
set_host_threads(1)
import myelin
from myelin.runtime.generation import Generator
model = myelin.Instance().load(sys.argv[1])
with Generator(model) as g:
    tokens = g.generate(g.encode(sys.argv[2]), max_new_tokens=int(sys.argv[3]), use_eos=False)
DeviceRegistry().device("local-task")  # another model's local-task device starts the driver
set_host_threads(1)  # the count it started with: accepted
try:
    set_host_threads(2)
    refused = ""
except RuntimeError as e:
    refused = str(e)
print(json.dumps({"drivers": model.drivers, "host_chosen": model.host_chosen,
                  "tokens": tokens.tokens[0], "refused": refused}))
"""


def test_one_thread_causal_lm_runs_on_local_sync_with_the_same_tokens(tmp_path: Path):
    mln = build_causal_lm(tmp_path)
    model = myelin.Instance().load(mln)  # this process: IREE's default topology
    assert model.drivers == ["local-task"] and model.host_chosen == {}
    with Generator(model) as generator:
        want = generator.generate(
            generator.encode(PROMPT), max_new_tokens=NEW_TOKENS, use_eos=False
        ).tokens[0]
    model.close()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, "-c", ONE_THREAD, str(mln), PROMPT, str(NEW_TOKENS)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["drivers"] == ["local-sync"]
    device = model.device_names[0]
    assert got["host_chosen"] == {
        device: {"driver": {"value": "local-sync", "reason": ONE_HOST_THREAD}}
    }
    assert got["tokens"] == want
    assert "set the thread count before loading the first model" in got["refused"]
