"""The cache salt covers the code a build step runs and nothing else: a docstring edit of a CLI
module keeps every cached compile, an edit of a step's code rebuilds."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from plex.builder.versions import code_digest, code_digest_of, fingerprint_salt, step_code_files
from tests.plex.build_helpers import copy_example

SRC = Path(__file__).resolve().parents[2] / "src"


def _copy_sources(folder: Path) -> Path:
    shutil.copytree(SRC, folder, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return folder


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


def test_the_salt_is_the_digest_of_the_running_step_code():
    assert f"plex-code={code_digest()}" in fingerprint_salt()
    assert code_digest() == code_digest_of(SRC)


def test_step_code_is_what_steps_import_and_not_the_cli():
    files = {path.relative_to(SRC).as_posix() for path in step_code_files(SRC)}
    # every module a job names as its step, and what they reach lazily or through a table
    assert {"plex/builder/steps.py", "plex/builder/link.py", "plex/tune/_candidates.py"} <= files
    assert {"myelin/compiler/pipeline.py", "myelin/codecs/q4.py", "synapse/_job.py"} <= files
    assert {"myelin/codecs/_rewrite.py", "myelin/codecs/_finalize.py"} <= files  # lazy names
    assert "myelin/codecs/q4_matvec_avx2.c" in files  # compiled into a q4 module
    assert not {path for path in files if path.startswith("plex/cli/")}


def test_digest_keeps_docstring_edits_outside_steps_and_follows_step_edits(tmp_path):
    source = _copy_sources(tmp_path / "src")
    before = code_digest_of(source)
    _edit(source / "plex/cli/build_cmd.py", '"""', '"""Edited: ')
    (source / "plex/cli/notes.py").write_text("# a new CLI module\n")
    assert code_digest_of(source) == before
    for edited in ("myelin/codecs/q4.py", "myelin/codecs/q4_matvec_avx2.c"):
        path = source / edited
        original = path.read_bytes()
        path.write_bytes(original + b"\n")
        assert code_digest_of(source) != before, edited
        path.write_bytes(original)
    assert code_digest_of(source) == before


def _build(source: Path, app: Path, output: Path, cache: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(source), "PLEX_CACHE_DIR": str(cache)}
    done = subprocess.run(
        [sys.executable, "-m", "plex", "build", str(app), "-o", str(output)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return re.search(r"(\d+) step\(s\) ran, (\d+) cache hit", done.stderr).group(0)


def test_a_cli_docstring_edit_keeps_the_cache_and_a_step_edit_does_not(tmp_path):
    source = _copy_sources(tmp_path / "src")
    app = copy_example("mlp", tmp_path / "mlp")
    cache = tmp_path / "cache"
    cold = _build(source, app, tmp_path / "1.mln", cache)
    assert cold.endswith(" 0 cache hit")

    _edit(source / "plex/cli/build_cmd.py", '"""', '"""Edited: ')
    assert _build(source, app, tmp_path / "2.mln", cache).startswith("1 step(s) ran")  # compose

    _edit(source / "plex/builder/steps.py", "\n\n\n", "\n\nSTEP_EDITED = True\n\n\n")
    assert _build(source, app, tmp_path / "3.mln", cache) == cold
    assert (tmp_path / "3.mln").read_bytes() == (tmp_path / "1.mln").read_bytes()
