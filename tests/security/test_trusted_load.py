"""Under a trust policy, what was verified is what runs: after `Instance(trust=PUB).load()`,
writing into the file in place (its weights, its module's bytes) or truncating it changes
nothing the model computes, and nothing crashes. Module bytes run from a hashed private copy
with or without trust; the weights are the file's own pages only when the caller chose so
(`private_copy=False`), and then an in-place write shows: the trade-off docs/security.md
measures."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import myelin
from myelin.errors import ModelClosed
from myelin.mln import MlnReader, generate_key_pair, sign_file
from tests.models import mlp_reference

X = np.linspace(-1.0, 1.0, 3 * 16, dtype=np.float32).reshape(3, 16)


@pytest.fixture(scope="module")
def public_key(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("keys")
    private, public = generate_key_pair()
    (folder / "k.pem").write_bytes(private)
    (folder / "k.pub.pem").write_bytes(public)
    return folder / "k.pub.pem"


@pytest.fixture
def signed(mlp_mln, public_key, tmp_path) -> Path:
    path = tmp_path / "signed.mln"
    shutil.copy(mlp_mln, path)
    return sign_file(path, public_key.with_name("k.pem"))


def write_in_place(path: Path, kind: str) -> None:
    """Overwrite, in the same file (not a new one renamed over it), every section of `kind`:
    parameters with float32 1000.0, modules with x86 `ud2` instructions."""
    with MlnReader(path, verify=False) as reader:
        ranges = [(s.offset, s.length) for s in reader.sections.values() if s.kind == kind]
    fill = np.float32(1000.0).tobytes() if kind == "parameter" else b"\x0f\x0b"
    with open(path, "r+b") as file:
        for offset, length in ranges:
            file.seek(offset)
            file.write((fill * (length // len(fill) + 1))[:length])


def forward(model: myelin.Model) -> np.ndarray:
    with model.session() as session:  # a new session: a new VM context over the model
        return np.asarray(session.call("forward", X))


def test_weights_written_in_place_after_a_trusted_load_change_nothing(
    signed, public_key, mlp_weights
):
    want = mlp_reference(mlp_weights, X)[1]
    with myelin.Instance(trust=public_key).load(signed) as model:
        np.testing.assert_allclose(forward(model), want, rtol=1e-5, atol=1e-6)
        write_in_place(signed, "parameter")
        np.testing.assert_allclose(forward(model), want, rtol=1e-5, atol=1e-6)


def test_without_the_private_copy_the_weights_are_the_files_pages(signed, public_key, mlp_weights):
    """The documented trade-off (and the proof that the write above reaches a mapping)."""
    want = mlp_reference(mlp_weights, X)[1]
    with myelin.Instance(trust=public_key).load(signed, private_copy=False) as model:
        np.testing.assert_allclose(forward(model), want, rtol=1e-5, atol=1e-6)
        write_in_place(signed, "parameter")
        assert np.abs(forward(model) - want).max() > 100  # the file's new weights


# In a child process: if the change reached IREE, the process dies (SIGILL, SIGSEGV, SIGBUS).
CHILD = textwrap.dedent("""\
    import sys
    import numpy as np
    import myelin
    from tests.security.test_trusted_load import X, forward, write_in_place

    path, trust, change, out = sys.argv[1:5]
    private = {"default": None, "private": True, "mapped": False}[sys.argv[5]]
    instance = myelin.Instance(trust=trust) if trust else myelin.Instance()
    with instance.load(path, private_copy=private) as model:
        before = forward(model)
        if change == "truncate":
            open(path, "r+b").truncate(0)
        else:
            write_in_place(path, change)
        np.save(out, np.stack([before, forward(model)]))
""")


@pytest.mark.parametrize(
    "change, trusted, copy",
    [
        ("module", True, "default"),  # the whole file copied
        ("module", True, "mapped"),  # the weights mapped: the module still runs from a copy
        ("module", False, "default"),  # no trust: module bytes are still hashed from a copy
        ("truncate", True, "default"),  # under trust, no SIGBUS: nothing reads the file
        ("truncate", False, "private"),  # the same, asked for without trust
    ],
)
def test_changing_the_file_after_load_changes_nothing_and_crashes_nothing(
    change, trusted, copy, signed, public_key, mlp_weights, tmp_path
):
    out = tmp_path / "results.npy"
    done = subprocess.run(
        [sys.executable, "-c", CHILD, signed, public_key if trusted else "", change, out, copy],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    want = mlp_reference(mlp_weights, X)[1]
    before, after = np.load(out)
    np.testing.assert_allclose(before, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(after, want, rtol=1e-5, atol=1e-6)


def test_a_trusted_load_hashes_and_runs_a_sealed_copy(signed, public_key):
    """What IREE wraps is a sealed memfd: nobody, this process included, can write it."""
    with myelin.Instance(trust=public_key).load(signed) as model:
        assert model.private_copy
        maps = Path("/proc/self/maps").read_text()
        assert "/memfd:mln:signed.mln (deleted)" in maps
        assert str(signed) not in maps  # the file itself is not mapped at all


def test_a_closed_model_gives_no_new_session(mlp_mln):
    model = myelin.Instance().load(mlp_mln)
    model.close()
    with pytest.raises(ModelClosed, match="the model is closed; load it again"):
        model.session()
