"""Soak (tools/soak.py, bounded for CI): 64 threads x 1000 calls over 8 sessions of two models
(examples/mlp and examples/placement's `embed`), valid inputs checked against numpy mixed with
invalid ones (wrong dtype, size or rank; ids out of range) that must raise the documented
InputError: no wrong answer, no other error, no crash, and resident memory flat after warm-up."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow

_spec = importlib.util.spec_from_file_location("plex_soak_tool", REPO / "tools" / "soak.py")
assert _spec is not None and _spec.loader is not None
soak_tool = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = soak_tool  # its dataclasses look their module up there
_spec.loader.exec_module(soak_tool)


def test_soak_64_threads_1000_calls_8_sessions_two_models(tmp_path: Path) -> None:
    mlp, embed = soak_tool.build_models(tmp_path)
    report = soak_tool.soak(mlp, embed, threads=64, calls=1000, sessions=8, warmup=200)
    print(report.summary())
    assert report.calls == 64_000
    assert report.wrong == [] and report.unexpected == []
    # every call either matched numpy or was refused as documented, and both kinds happened
    assert report.valid_checked + report.invalid_refused == 64_000
    assert report.valid_checked > 30_000 and report.invalid_refused > 10_000
    assert abs(report.rss_growth) <= 0.05, report.summary()
