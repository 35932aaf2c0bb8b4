"""The repository passes the project's linter and formatter, as CI checks it: `ruff check .` and
`ruff format --check .` from the root (Python files, and the Python blocks of the Markdown
docs). ruff is pinned in the test extra: another version formats differently."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]])
def test_the_repository_is_ruff_clean(command: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *command],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    fix = "ruff check --fix ." if command[0] == "check" else "ruff format ."
    assert result.returncode == 0, f"run `{fix}`:\n{result.stdout[-4000:]}{result.stderr[-2000:]}"
