"""The entrypoint name of a one-function source, the same rule in every frontend."""

from __future__ import annotations

from pathlib import Path

import pytest

from myelin.errors import CompileError
from myelin.frontends import DEFAULT_ENTRYPOINT, FrontendRequest

REFUSAL = "m{1}.onnx: one graph; got {names} (list one name)"


def request(*entrypoints: str) -> FrontendRequest:
    return FrontendRequest(Path("m{1}.onnx"), None, "m", "m", entrypoints or None)


def test_no_entrypoints_named_means_forward():
    assert request().single_entrypoint(REFUSAL) == DEFAULT_ENTRYPOINT == "forward"


def test_one_entrypoint_named_is_used():
    assert request("embed").single_entrypoint(REFUSAL) == "embed"


def test_several_are_refused_naming_them_and_braces_in_the_file_name_stay():
    with pytest.raises(CompileError) as caught:
        request("a", "b").single_entrypoint(REFUSAL)
    assert str(caught.value) == "m{1}.onnx: one graph; got a, b (list one name)"
