"""Grouped-query attention without `repeat_kv` (myelin.frontends.causal_lm), and the attention
IREE gets for it on llvm-cpu (myelin.compiler.cpu_attention).

transformers expands a GQA model's key and value heads to the query heads before attention;
the frontend's attention function folds each group's query heads into rows instead, so the
export reads the cache's heads as they are. What it computes is checked here against
transformers' own function (same dot products and softmax per row: equal to float rounding),
the exported programs are checked for the missing copy, and greedy tokens against
transformers' `generate` for Llama, Qwen2 and Mistral (all GQA) are in test_causal_lm.py.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("iree.turbine")

from myelin.compiler.targets import DATA_TILING_FLAGS, data_tiling_choice  # noqa: E402
from myelin.frontends import causal_lm  # noqa: E402
from plex.builder import build  # noqa: E402
from plex.builder.plan import CAUSAL_LM_TILING  # noqa: E402
from tests.llm.tiny_models import write_model  # noqa: E402


class GroupedLayer(torch.nn.Module):
    """What the attention function reads off a transformers attention layer."""

    num_key_value_groups = 4
    is_causal = True


@pytest.mark.parametrize("queries", [1, 5])
@pytest.mark.parametrize("per_head_mask", [False, True])
def test_grouped_attention_equals_transformers_sdpa(queries, per_head_mask):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(0)
    batch, kv_heads, groups, kv, head_dim = 2, 2, 4, 9, 16
    query = torch.randn(batch, kv_heads * groups, queries, head_dim)
    key, value = torch.randn(2, batch, kv_heads, kv, head_dim)
    mask = torch.zeros(batch, kv_heads * groups if per_head_mask else 1, queries, kv)
    mask[1, ..., :3] = torch.finfo(torch.float32).min  # left padding of row 1
    mask[0, 0, :, -1] = torch.finfo(torch.float32).min
    layer = GroupedLayer()

    want, _ = sdpa_attention_forward(layer, query, key, value, mask, scaling=0.25)
    got, _ = causal_lm.grouped_query_attention(layer, query, key, value, mask, scaling=0.25)
    assert got.shape == want.shape == (batch, queries, kv_heads * groups, head_dim)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_the_static_prefill_keeps_transformers_attention():
    """Inside `_heads_as_heads` the function is transformers' own (is_causal, expanded heads):
    the flash kernel's form for `prefill_<n>`."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(0)
    query, key, value = torch.randn(1, 8, 6, 16), torch.randn(1, 2, 6, 16), torch.randn(1, 2, 6, 16)
    layer = GroupedLayer()
    with causal_lm._heads_as_heads():
        got, _ = causal_lm.grouped_query_attention(layer, query, key, value, None)
    want, _ = sdpa_attention_forward(layer, query, key, value, None)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def _attention_inputs(program) -> list[tuple]:
    """(query shape, key shape) of every scaled_dot_product_attention of an exported program."""
    sdpa = torch.ops.aten.scaled_dot_product_attention.default
    return [
        (tuple(n.args[0].meta["val"].shape), tuple(n.args[1].meta["val"].shape))
        for n in program.graph_module.graph.nodes
        if n.target == sdpa
    ]


def test_the_export_reads_the_cache_heads_without_repeating_them(tmp_path):
    """Llama with 4 query heads on 2 KV heads: prefill and decode attend with 2 heads of 2
    rows per query token (no [b, 4, kv, d] copy of the keys and values); the static prefill
    keeps 4 heads and `is_causal`."""
    folder = write_model(tmp_path / "llama", "llama")
    options = causal_lm.CausalLMOptions(max_seq=32, prefill_lengths=(8,))
    model = causal_lm.load_model(folder, what="llama/")
    causal_lm.use_grouped_query_attention(model)
    programs = causal_lm._export(causal_lm.CausalLMModule(model, options), options, "llama/")

    for name in (causal_lm.PREFILL, causal_lm.DECODE):
        shapes = _attention_inputs(programs[name])
        assert len(shapes) == 2  # one per layer
        for query, key in shapes:
            assert query[1] == key[1] == 2  # the KV heads, not the 4 query heads
    static = _attention_inputs(programs[causal_lm.prefill_name(8)])
    assert [(q[1], k[1]) for q, k in static] == [(4, 4), (4, 4)]


APP = """\
[app]
name = "lm"
packages = ["lm"]

[devices.cpu]
target = "llvm-cpu"
{pinned}

[weights.codec]
"*" = "fp16"
"""


def _package(root: Path) -> Path:
    package = root / "lm"
    write_model(package / "model", "llama")
    (package / "plex.toml").write_text(
        textwrap.dedent(
            """\
            [package]
            name = "lm"

            [graph.lm]
            source = "model"
            frontend = "causal-lm"
            max_seq = 32
            """
        )
    )
    return package


HOST_TILES = data_tiling_choice("host", None).value  # an AVX-512 x86-64 host


@pytest.mark.parametrize("pinned", ["data_tiling = false", "data_tiling = true"])
def test_dynamic_attention_on_llvm_cpu_is_matmuls_and_a_softmax(tmp_path, pinned):
    """The prefill's and decode's attentions, of dynamic lengths, become two products and a
    softmax (myelin.compiler.cpu_attention; the products are generic contractions over the
    cache rows); under data tiling the products carry a preset compilation_info, which keeps
    IREE's data tiling (whose dynamic batch matmuls do not compile) away from them."""
    _package(tmp_path)
    app = tmp_path / "app.toml"
    app.write_text(APP.format(pinned=pinned))
    ir = tmp_path / "ir"
    build(app, ir, compile_to="abi")
    text = "\n".join(p.read_text() for p in Path(ir).rglob("*.mlir"))
    assert "iree_linalg_ext.attention" not in text
    matmuls = [line for line in text.splitlines() if "plex.attention_product" in line]
    assert len(matmuls) >= 4  # Q @ K^T and P @ V, prefill and decode
    preset = [line for line in matmuls if "compilation_info" in line]
    assert len(preset) == (len(matmuls) if pinned.endswith("true") else 0)


@pytest.mark.skipif(not HOST_TILES, reason="the host has no AVX-512 matmul kernels")
def test_a_causal_lm_with_encoded_weights_records_why_it_data_tiles(tmp_path):
    """The exception to "an app that encodes weights keeps them encoded" (plex.builder.plan):
    recorded with its reason, and the generated tokens are the untiled build's (the weights
    decoded at load, the attention's untiled matmuls: the same numbers)."""
    import myelin
    from myelin.runtime.generation import Generator

    _package(tmp_path)
    tokens = {}
    for name, pinned in (("default", ""), ("untiled", "data_tiling = false")):
        app = tmp_path / f"{name}.toml"
        app.write_text(APP.format(pinned=pinned))
        model = myelin.Instance().load(build(app, tmp_path / f"{name}.mln").output)
        with Generator(model) as generator:
            tokens[name] = generator.generate("the quick brown fox", max_new_tokens=16).tokens
        chosen = model.manifest["variants"][0]["devices"][0].get("host_chosen", {})
        flags = model.manifest["variants"][0]["flags"]
        model.close()
        assert (DATA_TILING_FLAGS[0] in flags) == (name == "default")
        if name == "default":
            assert chosen["data_tiling"] == {"value": True, "reason": CAUSAL_LM_TILING}
    assert tokens["default"] == tokens["untiled"]


def _functions(ir: Path) -> dict[str, str]:
    """The text of each util.func in the phase files under `ir`, by its "@name"."""
    text = "\n".join(p.read_text() for p in ir.rglob("*.mlir"))
    return {
        body.split("(", 1)[0].split()[-1]: body for body in re.split(r"\n\s*util\.func ", text)[1:]
    }


def test_the_attention_mask_keeps_the_step_one_queue_submission(tmp_path):
    """The decomposed attention keeps its mask's producer out of the softmax with IREE's
    compute barrier (myelin.compiler.backend_attention), which Stream never sees: the host
    awaits a decode step and a prefill once, for their results, however many layers (a
    `util.optimization_barrier` there made it await every layer's mask, one queue submission
    a layer)."""
    _package(tmp_path)
    app = tmp_path / "app.toml"
    app.write_text(APP.format(pinned=""))
    build(app, tmp_path / "ir", compile_to="stream")
    functions = _functions(tmp_path / "ir")
    for name in ("@prefill", "@decode"):
        assert functions[name].count("stream.timepoint.await") == 1, name


def test_decode_and_prefill_read_the_held_rows_in_the_caches_layout(tmp_path):
    """On llvm-cpu the decomposed attention's products index the cache rows [slot, heads,
    head_dim] in that layout (backend_attention.cache_rows_source): no dispatch copies the held keys
    or values into [heads, slot, head_dim] first (before: two such copies a layer and call,
    growing with the tokens held)."""
    _package(tmp_path)
    app = tmp_path / "app.toml"
    app.write_text(APP.format(pinned=""))
    build(app, tmp_path / "ir", compile_to="dispatch-creation")
    functions = _functions(tmp_path / "ir")
    # the tiny llama: 2 layers, 2 KV heads of 16; held rows [?, 2, 16], a copy's result [2, ?, 16]
    copy = re.compile(
        r"flow\.dispatch\.workgroups.*\(tensor<\?x2x16xf32>\{[^}]*\}, index\) -> "
        r"tensor<2x\?x16xf32>"
    )
    decode, prefill = functions["@decode"], functions["@prefill"]
    assert copy.findall(decode) == []
    # the prefill's one copy a layer is RoPE's, of the new keys (before: 3 a layer)
    assert len(copy.findall(prefill)) == 2
    products = [line for line in decode.splitlines() if "plex.attention_product" in line]
    assert len(products) == 2 * 2  # Q K^T and P V, 2 layers
    assert all("tensor<?x2x16xf32>" in line for line in products)
