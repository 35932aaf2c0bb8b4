"""docs/your-model.md runs as written: its bash commands and Python blocks, in the guide's
order, in a temporary copy of examples/your-model (builds write their .mln and plex.lock beside
the app). A command whose comment starts with `error:` must fail with that line (exit 1). A
block that opens with `# examples/your-model/...` shows a file: it must be a verbatim excerpt of
that file, so the guide cannot drift from the files its commands use."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs" / "your-model.md"
EXAMPLE = Path("examples") / "your-model"
TORCHVISION_PLACEHOLDER = REPO / "tests" / "frontends" / "_torchvision_shim"
BIN = Path(sys.executable).parent


@dataclass
class Block:
    language: str
    text: str

    @property
    def shown_file(self) -> Path | None:
        """The repository file a block shows, named by its first line (`# examples/...`)."""
        first = self.text.split("\n", 1)[0]
        match = re.fullmatch(r"# (examples/\S+)", first)
        return Path(match.group(1)) if match else None


@dataclass
class Command:
    argv: list[str]
    expected_error: str | None  # the `# error: ...` comment: the command must fail with it


def guide_blocks() -> list[Block]:
    return [Block(m[1], m[2]) for m in re.finditer(r"```(\w+)\n(.*?)```", GUIDE.read_text(), re.S)]


def commands(block: Block) -> list[Command]:
    """A bash block's commands, one a line, split at `&&`; pip set-up lines are left out (the
    test runs in the environment that is already set up)."""
    found = []
    for line in block.text.splitlines():
        line, _, comment = line.partition("  # ")
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        error = comment.strip() if comment.strip().startswith("error:") else None
        for part in (p.strip() for p in line.split("&&")):
            assert part.startswith(".venv/bin/"), f"not copyable as it is: {part}"
            if not part.startswith(".venv/bin/pip "):
                found.append(Command(shlex.split(part), error))
    return found


def torchvision_loads() -> bool:
    done = subprocess.run([sys.executable, "-c", "import torchvision"], capture_output=True)
    return done.returncode == 0


def test_shown_files_are_the_example_files():
    shown = [b for b in guide_blocks() if b.shown_file is not None]
    assert {str(b.shown_file.parent) for b in shown} >= {f"{EXAMPLE}/{m}" for m in ("gpt2", "timm")}
    for block in shown:
        excerpt = block.text.split("\n", 1)[1]
        assert excerpt.strip() and excerpt in (REPO / block.shown_file).read_text(), (
            f"the guide's {block.shown_file} is not in the file as written"
        )


def test_every_command_and_python_block_runs(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("iree.turbine")
    pytest.importorskip("transformers")
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    if importlib.util.find_spec("timm") is None:  # not imported here: it needs torchvision
        pytest.skip("timm is not installed")
    # what the commands build is left behind: they must make it themselves
    shutil.copytree(
        REPO / EXAMPLE, tmp_path / EXAMPLE, ignore=shutil.ignore_patterns("*.mln", "*.onnx")
    )
    env = {**os.environ, "COLUMNS": "200"}
    if not torchvision_loads():
        # the guide's own advice where no torchvision loads (this project's CI): timm's
        # import goes through the tests' placeholder
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(TORCHVISION_PLACEHOLDER), env.get("PYTHONPATH")])
        )
    ran = {"bash": 0, "python": 0}
    said_by: dict[str, str] = {}  # command line -> what it printed, whitespace folded
    for block in guide_blocks():
        if block.language == "bash":
            for command in commands(block):
                argv = [str(BIN / Path(command.argv[0]).name), *command.argv[1:]]
                start = time.monotonic()
                done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, env=env)
                print(f"{time.monotonic() - start:5.1f}s {shlex.join(command.argv)}")
                said = " ".join((done.stdout + done.stderr).split())
                said_by[shlex.join(command.argv)] = said
                if command.expected_error:
                    assert done.returncode == 1, (command, said)
                    assert command.expected_error in said, (command, said)
                else:
                    assert done.returncode == 0, (command, said)
                ran["bash"] += 1
        elif block.language == "python" and block.shown_file is None:
            done = subprocess.run(
                [sys.executable, "-c", block.text], cwd=tmp_path, capture_output=True, text=True,
                env=env,
            )  # fmt: skip
            assert done.returncode == 0, (block.text, done.stdout, done.stderr)
            ran["python"] += 1
    assert ran["bash"] >= 15 and ran["python"] >= 2, ran
    # what the commands say they write
    for artifact in ("gpt2/gpt2.mln", "timm/resnet.mln", "onnx/bert.mln", "onnx/bert.onnx"):
        assert (tmp_path / EXAMPLE / artifact).is_file(), artifact
    for written in ("logits.npy", "ids.npy", "mask.npy"):
        assert (tmp_path / written).is_file(), written

    # what the guide says the commands print
    def said(command_start: str) -> str:
        return next(out for line, out in said_by.items() if line.startswith(command_start))

    gpt2 = "examples/your-model/gpt2"
    built = said(f".venv/bin/plex build {gpt2}")
    assert "use_cache = True; turned off" in built and "repeated to size 2" in built
    assert "input_ids: int64[batch, seq<=128]" in said(f".venv/bin/plex inspect {gpt2}")
    assert re.search(r"forward logits \d", said(f".venv/bin/plex accuracy {gpt2}"))
    assert "logits: max |plex - torch|" in said(
        f".venv/bin/python examples/your-model/compare.py {gpt2}"
    )
    timm = said(".venv/bin/plex inspect examples/your-model/timm")
    assert "x: float32[batch, 3, 64, 64]" in timm and "output0" in timm
    assert "token_type_ids: int64[batch, seq<=128]" in said(
        ".venv/bin/plex inspect examples/your-model/onnx"
    )
