"""A damaged .mln is a clear ArtifactError at load, never a crash or a wrong answer."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import myelin
from myelin.mln import HEADER_SIZE, MlnReader


def damaged_copy(src: Path, dst: Path, offset: int) -> Path:
    shutil.copy(src, dst)
    with dst.open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    return dst


def section_offset(path: Path, kind: str) -> int:
    with MlnReader(path) as r:
        section = next(s for s in r.sections.values() if s.kind == kind)
        return section.offset + section.length // 2


def manifest_offset(path: Path) -> int:
    with MlnReader(path) as r:
        return r.file_size - 10  # the manifest is the file's tail


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("magic", "not a .mln file"),
        ("version", "format version"),
        ("manifest", "manifest"),
        ("parameter", "corrupt"),
        ("module", "corrupt"),
    ],
)
def test_flipped_byte_is_an_artifact_error(mlp_mln, tmp_path, where, message):
    offset = {
        "magic": 1,
        "version": 8,
        "manifest": manifest_offset(mlp_mln),
        "parameter": section_offset(mlp_mln, "parameter"),
        "module": section_offset(mlp_mln, "module"),
    }[where]
    bad = damaged_copy(mlp_mln, tmp_path / "bad.mln", offset)
    with pytest.raises(myelin.ArtifactError, match=message) as info:
        myelin.Instance().load(bad)
    assert str(bad) in str(info.value) or bad.name in str(info.value)


@pytest.mark.parametrize("keep", [0, 10, HEADER_SIZE, 5000, -100, -1])
def test_truncated_file_is_an_artifact_error(mlp_mln, tmp_path, keep):
    data = mlp_mln.read_bytes()
    bad = tmp_path / "cut.mln"
    bad.write_bytes(data[:keep])
    with pytest.raises(myelin.ArtifactError):
        myelin.Instance().load(bad)


def test_missing_file_is_an_artifact_error(tmp_path):
    with pytest.raises(myelin.ArtifactError, match=r"nope\.mln"):
        myelin.Instance().load(tmp_path / "nope.mln")


def test_unverified_load_still_runs_an_intact_file(mlp_mln):
    model = myelin.Instance().load(mlp_mln, verify=False)
    with model.session() as s:
        assert s.call("forward", np.zeros((1, 16), np.float32)).shape == (1, 8)
