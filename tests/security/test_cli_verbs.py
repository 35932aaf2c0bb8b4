"""Every verb the manual names exists in the installed `plex`: the docs are parsed for
`plex VERB` (and `plex GROUP SUBVERB`) and each answers `--help` with exit 0 through the console
script, the program a user types. A verb registered only on a test's private app once passed a
whole suite while `plex sign` answered `No such command`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PLEX = Path(sys.executable).parent / "plex"

# `plex build`, `plex cache gc` in inline code; `plex run app.mln ...` or `$ plex ...` at the
# start of a line in a code block. The word after `plex` is the verb, the next one a subverb
# when the verb is a group (decided by the installed CLI, not by this test).
INLINE = re.compile(r"`plex ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?")
COMMAND_LINE = re.compile(r"^\s*(?:\$ )?plex ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?", re.M)


def mentioned_verbs() -> set[tuple[str, str | None]]:
    found: set[tuple[str, str | None]] = set()
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for pattern in (INLINE, COMMAND_LINE):
            found |= {(m[1], m[2]) for m in pattern.finditer(text)}
    return found


def plex(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([str(PLEX), *args], capture_output=True, text=True, env=env)


@cache
def subverbs(verb: str) -> frozenset[str]:
    """The subcommands `plex VERB --help` lists (empty for a plain verb)."""
    shown = plex(verb, "--help").stdout
    if "Commands:" not in shown:
        return frozenset()
    listing = shown.split("Commands:", 1)[1]
    return frozenset(re.findall(r"^\s{2}([a-z][a-z-]*)\s", listing, re.M))


def documented_commands() -> list[tuple[str, ...]]:
    commands: set[tuple[str, ...]] = set()
    for verb, word in mentioned_verbs():
        commands.add((verb,))
        if word is not None and subverbs(verb):
            commands.add((verb, word))
    return sorted(commands)


def test_the_docs_name_the_verbs_this_test_is_about():
    """The parser finds the verbs a user meets first (a parser that finds nothing passes all)."""
    verbs = {verb for verb, _ in mentioned_verbs()}
    assert {"build", "run", "inspect", "sign", "verify", "keygen", "cache"} <= verbs, verbs
    assert PLEX.is_file(), f"the console script is not installed next to {sys.executable}"


@pytest.mark.parametrize("command", documented_commands(), ids=" ".join)
def test_every_documented_verb_answers_help(command):
    result = plex(*command, "--help")
    assert result.returncode == 0, (command, result.stdout, result.stderr)
    assert f"Usage: plex {' '.join(command)}" in result.stdout, result.stdout


def test_the_trust_hint_names_a_verb_that_exists():
    """`plex run --trust` tells the user to `plex sign`; that verb must exist."""
    result = plex("run", "--help")
    assert "(plex sign)" in " ".join(result.stdout.split()), result.stdout
    assert plex("sign", "--help").returncode == 0
