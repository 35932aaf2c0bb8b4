"""A damaged cache entry is found, discarded and rebuilt; the build never crashes on it.

The damaged entry is the import's, a node whose dependent (the compile) is still a cache hit:
the build must rebuild the import and serve the compile from the cache. Each way an entry can
be damaged on disk is one case, `.entry.json` included (a deeply nested one, a crafted file,
must be refused like any other unreadable index, not overflow the parser's stack).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from synapse import Cache, Executor, explain
from tests.plex.build_helpers import copy_example
from tests.synapse.synapse_helpers import Recorder, diamond_plan

ENTRY = ".entry.json"


def _flip_a_byte(entry: Path) -> None:
    data = bytearray((entry / "out.txt").read_bytes())
    data[1] ^= 0x20
    (entry / "out.txt").write_bytes(bytes(data))


def _truncate(entry: Path) -> None:
    (entry / "out.txt").write_bytes((entry / "out.txt").read_bytes()[:2])


def _schema(entry: Path, value: object) -> None:
    manifest = json.loads((entry / ENTRY).read_text())
    (entry / ENTRY).write_text(json.dumps({**manifest, "schema": value}))


def _file_meta(entry: Path, meta: object) -> None:
    manifest = json.loads((entry / ENTRY).read_text())
    (entry / ENTRY).write_text(json.dumps({**manifest, "files": {"out.txt": meta}}))


DAMAGES: dict[str, tuple[Callable[[Path], None], str]] = {
    "flip": (_flip_a_byte, "file 'out.txt' content changed"),
    "truncate": (_truncate, "file 'out.txt' changed size"),
    "delete": (lambda e: (e / "out.txt").unlink(), "file 'out.txt' missing"),
    "extra-file": (lambda e: (e / "stray.bin").write_bytes(b"\0"), "unexpected file 'stray.bin'"),
    "missing-index": (lambda e: (e / ENTRY).unlink(), f"{ENTRY} missing or unreadable"),
    "bad-index": (lambda e: (e / ENTRY).write_text("{not json"), f"{ENTRY} missing or unreadable"),
    "unknown-schema": (lambda e: _schema(e, 99), f"{ENTRY} has an unknown layout"),
    "bad-file-meta": (lambda e: _file_meta(e, 5), "file 'out.txt' unreadable"),
    "deeply-nested-index": (
        lambda e: (e / ENTRY).write_text("[" * 100_000 + "]" * 100_000),
        f"{ENTRY} missing or unreadable",
    ),
}


@pytest.mark.parametrize("damage", DAMAGES.values(), ids=DAMAGES.keys())
def test_damaged_entry_of_a_node_whose_dependent_is_cached_is_rebuilt(tmp_path, damage):
    corrupt, problem = damage
    cache = Cache(tmp_path / "cache")
    first = Executor(cache, salt="iree=test").run(diamond_plan())
    corrupt(first["import"].out_dir)

    recorder, events = Recorder(), []
    second = Executor(cache, salt="iree=test", on_event=events.append).run(
        diamond_plan(recorder=recorder)
    )

    assert sorted(recorder.runs) == ["compose", "import"]
    assert explain(second)[1:4] == [
        "import   rebuilt: corrupt cache entry discarded",
        "weights  hit",
        "compile  hit",
    ]
    [discarded] = [e for e in events if e.status == "discarded"]
    assert discarded.message == f"corrupt cache entry discarded: {problem}"
    assert (second["import"].out_dir / "out.txt").read_text() == "(i (r))"
    assert (second["compose"].out_dir / "out.txt").read_text() == "(x (c (i (r)) (w (r))))"
    # The rebuilt entry is whole again: a third build is all hits.
    third = Executor(cache, salt="iree=test").run(diamond_plan())
    assert third["import"].status == "hit"


def test_plex_build_rebuilds_a_damaged_import_entry(tmp_path):
    """The case as a user meets it: `plex build` after a flipped byte in a cached import."""
    app = copy_example("mlp", tmp_path / "mlp")
    cache = tmp_path / "cache"
    env = {"PLEX_CACHE_DIR": str(cache)}
    plex = [sys.executable, "-m", "plex", "build", str(app)]
    first = _run([*plex, "-o", str(tmp_path / "first.mln")], env)
    assert first.returncode == 0, first.stderr

    [entry] = [
        e for e in Cache(cache).ls() if e.node_id.startswith("import:") and e.kind == "import"
    ]
    module = max((p for p in entry.path.rglob("*") if p.is_file() and p.name != ENTRY), key=_size)
    data = bytearray(module.read_bytes())
    data[len(data) // 2] ^= 0x01
    module.write_bytes(bytes(data))

    second = _run([*plex, "-o", str(tmp_path / "second.mln")], env)
    assert second.returncode == 0, second.stderr
    assert "corrupt cache entry discarded" in second.stdout + second.stderr
    assert (tmp_path / "second.mln").read_bytes() == (tmp_path / "first.mln").read_bytes()


def _size(path: Path) -> int:
    return path.stat().st_size


def _run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, capture_output=True, text=True, timeout=300, env={**os.environ, **env}
    )
