"""`plex --help` and every verb's help as a user reads them: fast, complete, and showing each
help string as written (no markup eaten, no type placeholder on flags)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

import pytest
import typer.main

from plex.cli import app
from tests.plex.test_cli import plex

VERBS = [
    "init",
    "build",
    "inspect",
    "run",
    "bench",
    "accuracy",
    "profile",
    "cache",
    "keygen",
    "sign",
    "verify",
]
CACHE_VERBS = ["ls", "gc", "clear"]


def _commands() -> dict[tuple[str, ...], Any]:
    """The click commands typer builds (typer vendors its own click: matched by shape)."""
    root = typer.main.get_command(app)
    found: dict[tuple[str, ...], Any] = {(): root}
    for name, command in root.commands.items():
        found[(name,)] = command
        if hasattr(command, "commands"):
            for sub, subcommand in command.commands.items():
                found[(name, sub)] = subcommand
    return found


def _words(text: str) -> str:
    return " ".join(text.split())


def test_every_verb_is_listed_with_its_summary():
    result = plex("--help")
    assert result.returncode == 0, result.stderr
    for verb in VERBS:
        assert re.search(rf"^\s+{verb}\s+\S", result.stdout, re.M), (verb, result.stdout)
    assert "--version" in result.stdout


@pytest.mark.parametrize(
    "path", [(), *((v,) for v in VERBS), *(("cache", v) for v in CACHE_VERBS)], ids=" ".join
)
def test_help_shows_every_help_string_as_written(path):
    command = _commands()[path]
    result = plex(*path, "--help")
    assert result.returncode == 0, result.stderr
    shown = _words(result.stdout)
    options = [p for p in command.params if p.param_type_name == "option"]
    for param in options:
        if param.help:
            # `[build] jobs`, `"*" = CODEC`, `<app name>.mln`: every character survives.
            assert _words(param.help) in shown, (param.opts, param.help, result.stdout)
        if param.is_flag:
            line = next(ln for ln in result.stdout.splitlines() if param.opts[-1] in ln)
            assert "<bool>" not in line and "BOOLEAN" not in line, line
    assert "<bool>" not in result.stdout


def test_build_help_keeps_the_bracketed_manifest_keys():
    shown = _words(plex("build", "--help").stdout)
    assert "(default: [build] jobs, else the CPU count)" in shown
    assert "(default: [build] cache, else $PLEX_CACHE_DIR" in shown
    assert 'as if [weights.codec] ended with "*" = CODEC' in _words(
        plex("accuracy", "--help").stdout
    )


def test_version_names_plex_and_the_pinned_iree():
    result = plex("--version")
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(
        r"plex \d+\.\d+\.\d+\S* \(IREE compiler 3\.13\.0, runtime 3\.13\.0; Python 3\.\d+\.\d+\)\n",
        result.stdout,
    ), result.stdout


def test_help_loads_no_verb_machinery():
    """Start-up: `plex --help` imports typer and the verbs' declarations only; numpy, pydantic,
    rich, IREE and the build and runtime layers load when a verb runs."""
    code = (
        "import sys, json\n"
        "from plex.cli import main\n"
        "sys.argv = ['plex', '--help']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(json.dumps(sorted(sys.modules)), file=sys.stderr)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    loaded = set(json.loads(result.stderr.strip().splitlines()[-1]))
    heavy = {"numpy", "pydantic", "rich", "iree", "synapse", "safetensors", "plex.manifest"}
    heavy |= {"plex.builder", "myelin.runtime", "myelin.mln", "myelin.compiler"}
    assert sorted(heavy & loaded) == []
