"""`plex cache`, `plex init` and the build summary: messages a user can act on."""

from __future__ import annotations

import os
import shlex

from tests.plex.test_cli import EXAMPLES, one_line_error, plex


def _with_cache(cache, *args: str):
    return plex(*args, "--cache", str(cache))


def test_cache_gc_says_what_it_removed_and_kept(tmp_path):
    cache = tmp_path / "cache"
    built = plex(
        "build", str(EXAMPLES / "mlp"), "-o", str(tmp_path / "m.mln"), "--cache", str(cache)
    )
    assert built.returncode == 0, built.stderr
    result = _with_cache(cache, "cache", "gc", "--max-size", "1GiB")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"removed 0 entries (0 B); kept 4 ({_kib(cache)}) in {cache}\n"
    result = _with_cache(cache, "cache", "gc", "--max-size", "0B")
    assert result.stdout.startswith("removed 4 entries (") and "kept 0 (0 B)" in result.stdout
    assert _with_cache(cache, "cache", "clear").stdout == f"removed 0 entries from {cache}\n"


def _kib(cache) -> str:
    from synapse import Cache

    size = sum(e.size for e in Cache(cache).ls())
    return f"{size / 1024:.1f} KiB"


def test_cache_ls_shows_node_ids_as_they_are(tmp_path):
    """Node ids such as `compile:llama:decoder:default` once rendered as emoji (":llama:" is one)."""
    import shutil

    cache = tmp_path / "cache"
    shutil.copytree(EXAMPLES / "mlp", tmp_path / "llama", ignore=shutil.ignore_patterns("*.mln"))
    toml = (tmp_path / "llama" / "plex.toml").read_text()
    toml = toml.replace('name = "mlp"', 'name = "llama"').replace("[graph.mlp]", "[graph.decoder]")
    (tmp_path / "llama" / "plex.toml").write_text(toml)
    (tmp_path / "llama" / "app.toml").write_text('[app]\nname = "llama"\npackages = ["."]\n')
    built = plex("build", str(tmp_path / "llama"), "--cache", str(cache))
    assert built.returncode == 0, built.stderr
    result = _with_cache(cache, "cache", "ls")
    assert result.returncode == 0, result.stderr
    assert "compile:llama:decoder:default" in result.stdout
    assert "🦙" not in result.stdout


def test_bad_gc_limits_and_missing_cache_folders_are_one_line(tmp_path):
    line = one_line_error(_with_cache(tmp_path, "cache", "gc", "--max-size", "banana"))
    assert line.startswith("error: --max-size 'banana': invalid size 'banana'; expected a number")
    result = _with_cache(tmp_path, "cache", "gc", "--older-than-days", "-5")
    assert result.returncode == 2  # a usage error, as for any option out of its range
    assert result.stderr.strip().endswith(
        "Error: Invalid value for '--older-than-days': Input should be greater than or equal to 0"
    )
    for verb in ("ls", "gc", "clear"):
        line = one_line_error(plex("cache", verb, "--cache", "/nonexistent"))
        assert (
            line
            == "error: --cache /nonexistent: no such folder (no build has used it as its cache)"
        )


def test_the_default_cache_not_yet_created_is_said_so(tmp_path):
    env_cache = tmp_path / "never-built"
    result = _plex_env(PLEX_CACHE_DIR=str(env_cache))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{env_cache}: no cache yet (plex build creates it); 0 entries\n"


def _plex_env(**env: str):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "plex", "cache", "ls"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
    )


def test_init_prints_commands_that_paste_into_a_shell(tmp_path):
    folder = tmp_path / "My Model"
    result = plex("init", str(folder))
    assert result.returncode == 0, result.stderr
    app = shlex.quote(str(folder / "app.toml"))
    assert f"  plex build {app} -o my_model.mln\n" in result.stdout
    assert "'" in app  # the space made it quoted
    # and the printed build command works as printed
    build = plex(*shlex.split(result.stdout.splitlines()[1])[1:], cwd=tmp_path)
    assert build.returncode == 0, build.stderr


def test_a_model_without_parameters_says_so(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "plex.toml").write_text(
        '[package]\nname = "pkg"\n\n[graph.g]\nsource = "g.mlir"\n'
    )
    (tmp_path / "pkg" / "g.mlir").write_text(
        "func.func @forward(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
        "  %y = arith.addf %x, %x : tensor<4xf32>\n  return %y : tensor<4xf32>\n}\n"
    )
    (tmp_path / "app.toml").write_text('[app]\nname = "noweights"\npackages = ["pkg"]\n')
    result = plex("build", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().endswith(
        "parameters: 0 (no weights file, and inline constants under 256 bytes stay in the code; larger ones become parameters)"
    )
    shown = plex("inspect", str(tmp_path / "noweights.mln"))
    assert "parameters: 0 (no weights file" in shown.stdout
