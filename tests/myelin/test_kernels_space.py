"""Triton matmul configs as tuning candidates (myelin.kernels._space): the space per shape, the
constraints checked before compiling, and the tuning-database round trip the build reads."""

from __future__ import annotations

import json

import pytest

from myelin.kernels import choose_matmul_config
from myelin.kernels._space import (
    KERNEL_ENTRY_KIND,
    SHARED_MEMORY_LIMIT,
    config_to_json,
    kernel_entry,
    matmul_space,
    shared_bytes,
    site_key,
    spread_sample,
    tuned_configs,
    violations,
    with_tuned,
)
from myelin.kernels._triton import MatmulConfig


def _config(**knobs) -> MatmulConfig:
    return MatmulConfig("f16", "f16", True, **knobs)


def test_the_library_defaults_pass_their_own_constraints():
    shapes = ((8192, 8192, 8192), (None, 4096, 4096), (8, 11008, 4096), (1, 28672, 8192))
    # and the small grids' tiles (ViT-B/16 and ResNet-50 at batch 8)
    shapes += ((1576, 768, 768), (25088, 64, 576), (392, 512, 4608), (6272, 128, 1152))
    for m, n, k in shapes:
        config = choose_matmul_config("f16", "f16", True, m, n, k)
        assert violations(config, m, n, k) == [], (m, n, k)
    # Triton 3.9 reported 147 456 B for the default tile: the estimate is that number.
    assert shared_bytes(_config()) == 147_456


@pytest.mark.parametrize(
    ("knobs", "shape", "why"),
    [
        ({"block_k": 128, "num_stages": 5}, (4096, 4096, 4096), "shared memory"),
        ({"block_k": 128}, (4096, 4096, 4160), "multiple of block_k"),
        ({"block_m": 256, "block_n": 256, "block_k": 32}, (4096, 4096, 4096), "accumulators"),
        ({"block_n": 256}, (4096, 96, 4096), "wider than N"),
        (
            {"block_m": 128, "block_n": 32, "block_k": 256, "group_m": 1, "num_warps": 4},
            (8, 4096, 4096),
            "taller than M",
        ),
        ({"block_m": 48}, (4096, 4096, 4096), "power of two"),
        ({"group_m": 1}, (4096, 4096, 4096), "group_m = 1"),
        ({"block_m": 16, "block_n": 16, "num_warps": 8, "group_m": 1}, (8, 4096, 4096), "idle"),
        # the CUDA-core GEMV (block_m 1): M = 1 only, not persistent, its per-lane accumulators
        ({"block_m": 1, "block_n": 128, "block_k": 128, "group_m": 1}, (8, 4096, 4096), "M = 1"),
        ({"block_m": 1, "group_m": 1, "persistent": True}, (1, 4096, 4096), "not persistent"),
        ({"block_m": 1, "block_n": 256, "block_k": 512, "group_m": 1}, (1, 4096, 4096), "accum"),
        ({"block_m": 1, "block_n": 24, "block_k": 128, "group_m": 1}, (1, 4096, 4096), "power"),
    ],
)
def test_each_constraint_rejects_what_would_fail_or_spill(knobs, shape, why):
    found = violations(_config(**knobs), *shape)
    assert any(why in reason for reason in found), found


def test_the_space_holds_only_valid_configs_with_distinct_kernel_names():
    for m, n, k in ((8192, 8192, 8192), (2048, 11008, 4096), (None, 4096, 11008)):
        space = matmul_space("f16", "f16", False, m, n, k)
        assert len(space) > 100
        assert all(not violations(c, m, n, k) for c in space)
        assert all(shared_bytes(c) <= SHARED_MEMORY_LIMIT for c in space)
        # one kernel per name: apply_kernels compiles kernels by name
        assert len({c.name for c in space}) == len(space)
        assert {c.block_m for c in space} == {64, 128, 256}


def test_a_skinny_m_gets_the_gemv_shaped_space():
    space = matmul_space("f16", "f16", True, 1, 28672, 8192)
    # M = 1 also gets the CUDA-core GEMV (block_m 1), first in a small budget's sample
    assert space and {c.block_m for c in space} == {1, 16}
    assert spread_sample(space, 1)[0].name == "plex_matmul_abt_f16_f16_1x128x128_w4s2"
    assert {c.block_m for c in matmul_space("f16", "f16", True, 8, 28672, 8192)} == {16}
    assert {c.group_m for c in space} == {1}
    assert max(c.block_k for c in space) == 512
    # K = 11008 is no multiple of 512: those tiles are left out, not compiled and failed
    assert max(c.block_k for c in matmul_space("f16", "f16", True, 8, 4096, 11008)) == 256


def test_the_sample_starts_at_the_hopper_configs_is_seeded_and_distinct():
    space = matmul_space("f16", "f16", False, 8192, 8192, 8192)
    first = spread_sample(space, 12, seed=3)
    assert first == spread_sample(space, 12, seed=3)
    assert len(set(first)) == 12
    # the persistent TMA kernel first, then the non-persistent one of the same tile
    assert (first[0].block_m, first[0].block_n, first[0].num_stages) == (128, 256, 3)
    assert first[0].persistent and not first[1].persistent
    assert spread_sample(space, 12, seed=4)[8:] != first[8:]  # the seeded part moves
    assert len({(c.block_m, c.block_n, c.block_k) for c in first[8:]}) == 4  # one per tile


def _database(*entries: dict) -> str:
    return json.dumps({"schema": 1, "entries": {f"e{i}": e for i, e in enumerate(entries)}})


def test_recorded_configs_round_trip_through_the_database():
    tuned = MatmulConfig("f16", "f16", True, 16, 64, 256, 1, 4, 4)
    entry = kernel_entry(
        "matmul_transpose_b", "f16", "f16", 1, 28672, 8192, tuned,
        arch="sm_90a", triton="3.9.0", iree="3.13.0", relative=0.8,
    )  # fmt: skip
    assert entry["kind"] == KERNEL_ENTRY_KIND and entry["layout"] == "abt"
    other_arch = {**entry, "arch": "sm_100a"}
    codegen = {"kind": "weight-layout", "arch": "sm_90a"}
    library_won = {**entry, "n": 4096, "kept": False}  # the library's config stays its own
    found = tuned_configs(_database(entry, other_arch, codegen, library_won), "sm_90a")
    key = site_key("matmul_transpose_b", "f16", "f16", 1, 28672, 8192)
    assert found == {key: tuned}
    choose = with_tuned(choose_matmul_config, found)
    assert choose("f16", "f16", True, 1, 28672, 8192) == tuned
    # another shape, or the same shape in the other layout, keeps the library's config
    assert choose("f16", "f16", False, 1, 28672, 8192) == choose_matmul_config(
        "f16", "f16", False, 1, 28672, 8192
    )
    assert config_to_json(tuned)["block_n"] == 64


def test_a_recorded_config_that_breaks_its_shape_is_an_error_naming_it():
    bad = kernel_entry(
        "matmul", "f16", "f16", 8192, 8192, 8192, _config(block_k=128, num_stages=5),
        arch="sm_90a", triton="3.9.0", iree="3.13.0",
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"e0: config plex_matmul_ab_.*shared memory"):
        tuned_configs(_database(bad), "sm_90a")
    typo = {**bad, "config": {**bad["config"], "blockm": 64}}
    with pytest.raises(ValueError, match="unknown kernel config fields"):
        tuned_configs(_database(typo), "sm_90a")
