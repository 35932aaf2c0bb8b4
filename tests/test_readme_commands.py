"""The README's commands run as written: the quick start and "The path" are copied out of the
README itself (set-up steps left out: the test runs in the environment that is already set up),
so a README edit that breaks a command breaks this test."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SETUP = re.compile(r"^(python3 -m venv|\.venv/bin/pip install|tools/install_vulkan\.sh$)")


def bash_blocks(readme: Path) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", readme.read_text(), re.S)


def readme_commands() -> list[str]:
    """Every command of the README's bash blocks, split at `&&`, comments dropped."""
    commands = []
    for block in bash_blocks(REPO / "README.md"):
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if not line or line.startswith("#"):
                continue
            commands += [c.strip() for c in line.split("&&")]
    return commands


def test_every_readme_command_uses_the_venv_and_runs(tmp_path):
    commands = readme_commands()
    assert len(commands) >= 10
    for command in commands:
        assert command.startswith(".venv/bin/") or SETUP.match(command), command
    # A checkout-like folder: the example the quick start builds (copied: builds write
    # plex.lock beside their app).
    shutil.copytree(REPO / "examples" / "mlp", tmp_path / "examples" / "mlp")
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "COLUMNS": "120"}
    for command in commands:
        if SETUP.match(command) or command.startswith(".venv/bin/pytest"):
            continue  # set-up, and the test suite itself
        argv = shlex.split(command)
        argv[0] = str(bin_dir / Path(argv[0]).name)
        done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, env=env)
        assert done.returncode == 0, (command, done.stdout, done.stderr)
    assert (tmp_path / "mlp.mln").is_file() and (tmp_path / "mymodel" / "mymodel.mln").is_file()
    assert (tmp_path / "y.npy").is_file() and (tmp_path / "prof" / "trace.json").is_file()


def test_example_readmes_use_the_venv_and_name_their_extras():
    for readme in sorted(REPO.glob("examples/*/README.md")):
        for block in bash_blocks(readme):
            for line in filter(None, (ln.strip() for ln in block.splitlines())):
                assert line.startswith(".venv/bin/"), (readme, line)
                if "pip install" in line:
                    assert re.search(r"-e '\.\[[a-z,]+\]'", line), (readme, line)
