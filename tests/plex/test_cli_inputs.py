"""Inputs and outputs of `plex run`, `bench` and `profile` as a user types them: a literal that
does not fit its type, a --dim that names nothing, a wrong shape, an unwritable output. Each is
one `error:` line (exit 1), never a wrapped value, a traceback or an internal error."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest

from tests.plex.test_cli import one_line_error, plex


@pytest.fixture(scope="module")
def read_only_folder(tmp_path_factory) -> Path:
    """A folder no file can be created in: permission bits where they bind, else (as root) a
    kernel filesystem that refuses new files."""
    folder = tmp_path_factory.mktemp("read-only")
    folder.chmod(0o555)
    for candidate in (folder, Path("/sys"), Path("/proc")):
        try:
            with tempfile.TemporaryFile(dir=candidate):
                pass
        except OSError:
            return candidate
    pytest.skip("no folder on this machine refuses new files")


@pytest.mark.parametrize(
    ("literal", "message"),
    [
        ("2xi8=300", "value 300 is out of range for i8 [-128, 127]"),
        ("2xui8=-1", "value -1 is out of range for ui8 [0, 255]"),
        (
            "2xi32=99999999999",
            "value 99999999999 is out of range for i32 [-2147483648, 2147483647]",
        ),
        (
            "1xi64=18446744073709551617",
            "value 18446744073709551617 is out of range for i64 [-9223372036854775808, 9223372036854775807]",
        ),
        ("2xf16=1e6", "value 1e6 overflows f16 (largest finite value 65504)"),
        ("2xi32=1.5", "i32 values must be integers, got '1.5'"),
        ("2xi1=2", "i1 values are 0/1 or true/false, got '2'"),
        ("2x3xf32=1,2", "shape 2x3 needs 6 values, got 2"),
        ("2xf32=one", "f32 values must be numbers, got 'one'"),
        ("2xq7=1", "unknown element type 'q7'"),
    ],
)
def test_a_literal_that_does_not_fit_its_type_is_one_error_line(mlp_mln, literal, message):
    line = one_line_error(plex("run", str(mlp_mln), "--input", literal))
    assert line.startswith(f"error: --input {literal!r}: {message}"), line


def test_a_tensor_larger_than_memory_is_refused_before_any_allocation(mlp_mln):
    line = one_line_error(plex("run", str(mlp_mln), "--input", "99999999999x99999999999xf32=1"))
    assert re.fullmatch(
        r"error: --input '99999999999x99999999999xf32=1': shape 99999999999x99999999999 is "
        r"9,999,999,999,800,000,000,001 f32 values \(.* PiB\), more than this machine's memory "
        r"\(.* GiB\)",
        line,
    ), line


def test_bf16_literals_parse_and_meet_the_signature_check(mlp_mln):
    # bf16 was a TypeError inside numpy; now it is a tensor, refused by the f32 signature.
    line = one_line_error(plex("run", str(mlp_mln), "--input", "2x16xbf16=1"))
    assert line == (
        "error: forward: argument 'x' has element type bf16, expected f32 (shape ?x16); give "
        "it as f32, e.g. --input 1x16xf32=1 (a .npy file: saved as float32)"
    )


def test_literals_at_the_edges_of_their_type_still_run(mlp_mln):
    result = plex("run", str(mlp_mln), "--input", "1x16xf32=-3.4e38")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("result 0: 1x8xf32=")


def test_run_output_into_a_read_only_folder_is_one_line(mlp_mln, read_only_folder):
    target = read_only_folder / "y.npy"
    line = one_line_error(plex("run", str(mlp_mln), "--input", "2x16xf32=1", "-o", str(target)))
    assert line.startswith(f"error: --output {target}: cannot write in {read_only_folder}: "), line
    line = one_line_error(
        plex("run", str(mlp_mln), "--input", "2x16xf32=1", "-o", "/nonexistent-folder/y.npy")
    )
    assert (
        line
        == "error: --output /nonexistent-folder/y.npy: folder /nonexistent-folder does not exist"
    )


def test_profile_output_into_a_read_only_folder_is_one_line(mlp_mln, read_only_folder):
    target = read_only_folder / "prof"
    line = one_line_error(plex("profile", str(mlp_mln), "-o", str(target)))
    assert line.startswith(f"error: --output-dir {target}: cannot "), line


def test_an_unknown_dim_name_is_refused_with_the_valid_ones(mlp_mln):
    for verb in (("bench",), ("profile", "-o", "unused")):
        line = one_line_error(plex(*verb, str(mlp_mln), "--dim", "batch=200000"))
        assert line == (
            "error: --dim batch=200000: forward has no dynamic dim named 'batch'; "
            "its dynamic dims are x.0 (or * for all)"
        )
    line = one_line_error(plex("bench", str(mlp_mln), "--dim", "x.0=2", "--input", "2x16xf32=1"))
    assert line == "error: --dim sizes the random inputs; it has no effect with --input"


def test_bench_and_profile_show_the_shapes_they_used(mlp_mln, tmp_path):
    result = plex("bench", str(mlp_mln), "--dim", "x.0=3", "-n", "5")
    assert result.returncode == 0, result.stderr
    assert "inputs x=3x16xf32" in result.stdout
    result = plex("profile", str(mlp_mln), "--dim", "*=8", "-o", str(tmp_path / "prof"))
    assert result.returncode == 0, result.stderr
    assert "inputs x=8x16xf32" in result.stdout


def test_profile_memory_lines_separate_parameters_from_the_call(mlp_mln, tmp_path):
    result = plex("profile", str(mlp_mln), "--dim", "x.0=1", "-o", str(tmp_path / "prof"))
    assert result.returncode == 0, result.stderr
    # MLP at batch 1: hidden 1x32 f32 (128 B) and the result 1x8 f32 (32 B); parameters
    # w1 16x32, b1 32, w2 32x8, b2 8 in f32 = 3,232 B.
    assert "transients + results of one call: 160 B (the build's memory plan)" in result.stdout
    peak = re.search(
        r"peak queue-ordered memory: ([\d,]+) B \(includes the 3,232 B of parameters the "
        r"profiling tool loads\)",
        result.stdout,
    )
    assert peak is not None, result.stdout
    assert int(peak.group(1).replace(",", "")) >= 3232 + 160


def test_profile_refuses_a_wrong_shape_as_run_does(mlp_mln, tmp_path):
    run = one_line_error(plex("run", str(mlp_mln), "--input", "2x15xf32=1"))
    prof = one_line_error(
        plex("profile", str(mlp_mln), "--input", "2x15xf32=1", "-o", str(tmp_path / "p"))
    )
    assert (
        prof
        == run
        == (
            "error: forward: argument 'x' has size 15 in dimension 1, expected 16 "
            "(shape ?x16, got 2x15)"
        )
    )
    assert not (tmp_path / "p").exists()  # refused before anything was written
