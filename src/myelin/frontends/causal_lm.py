"""Hugging Face causal language models: a folder written by `save_pretrained` (config.json,
*.safetensors, tokenizer.json) becomes a module with two entrypoints that share the weights and a
KV cache kept in the module's own state (plus `prefill_<n>` per static prefill length):

    prefill(input_ids[b, s], position_ids[b, s], attention_mask[b, s])
        -> logits[b, vocab], greedy_tokens[b, 1]
    decode(input_ids[b, 1], position_ids[b, 1], attention_mask[b, kv])
        -> logits[b, vocab], greedy_tokens[b, 1]

`greedy_tokens` is each row's most likely next token, picked on the device (`greedy_tokens`):
a greedy generator reads b integers instead of b x vocab logits, and, where calls can be
submitted ahead (CUDA), passes them straight to the next `decode` without waiting for them
(myelin.runtime.generation).

The model runs through its own code (`AutoModelForCausalLM`, local files only), in the manifest's
`dtype` (float32 unless it says float16 or bfloat16). Only the cache is ours: `DeviceKVCache`
replaces the model's cache object with ONE buffer of rows (`cache_rows`: row
`(2 * layer + kind) * slots + slot` holds one slot of every sequence's keys or values), in the
model's dtype, registered as a buffer of the exported module. torch.export records its update
as a buffer mutation, which iree-turbine imports as a mutable `util.global`: IREE keeps it on the
device, one per VM context (one per MyeLiN session). Its initial value is `#util.uninitialized`,
so the `.mln` stores no cache bytes.

Each layer's write is one contiguous block of rows of the buffer itself, which IREE lowers to a
`flow.tensor.update` of the global and performs in place: a step's time and device traffic grow
with the tokens held, not with `max_seq` (benchmarks/llm_kv_cache.py, docs/llm.md). One buffer,
not one per layer: IREE 3.13 gives equal uninitialized globals one allocation (see `_finish`).

With the manifest's `prefill_lengths`, each length n adds `prefill_<n>`: the same prefill at a
static prompt length, so that a backend whose kernels need static shapes (the Triton attention
kernels on CUDA) takes its attention. Its prompts are padded on the RIGHT: row r's tokens fill
slots 0 .. len_r - 1, and the attention mask is torch's plain causal mask, no input reaches it,
which the export turns into `is_causal=True`, the form the flash-attention kernel takes (a
padding mask would be a general mask, which it does not). A real token never sees a later slot,
so padding after it changes nothing; `attention_mask[b, n]` (1 for real tokens) only says where
each row's last token is, whose logits the call returns, and the generator keeps passing it to
`decode`, where the padding slots are masked like left padding
(`CausalLMModule.prefill_static`).

The attention mask carries the cache length of a call: `attention_mask.shape[1]` is how many
slots the sequence occupies after the call (past + new tokens), so a call writes slots
`kv - q .. kv - 1` and attends over slots `0 .. kv - 1` only: a decode step reads what the
sequence holds, never the whole allocated cache. The mask is 1 for real tokens and 0 for left
padding (a batch of prompts of different lengths); position_ids count real tokens, as
transformers' `generate` does.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from myelin.errors import CompileError
from myelin.frontends import FrontendRequest, FrontendResult

# Entrypoint names the generator (myelin.runtime.generation) calls.
PREFILL = "prefill"
DECODE = "decode"


def prefill_name(length: int) -> str:
    """The entrypoint of the static-length prefill for prompts padded to `length` tokens."""
    return f"{PREFILL}_{length}"


# What the frontend records for the runtime, in the module's `myelin.causal_lm` attribute.
TOKENIZER_FILE = "tokenizer.json"
# The module's buffer that holds the KV cache.
CACHE_KEY = "kv_cache"
# Defaults when the manifest gives none.
DEFAULT_MAX_SEQ = 256
DEFAULT_MAX_BATCH = 1
DEFAULT_DTYPE = "float32"
# The manifest's `dtype` names -> torch dtypes: what the model computes in and the cache holds.
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class CausalLMOptions:
    """The manifest's `max_seq` (cache slots per sequence), `max_batch` (sequences per call) and
    `dtype` (what the model computes in; the KV cache holds the same dtype, so that attention
    reads it without a conversion and a float16 model's cache takes half the bytes)."""

    max_seq: int = DEFAULT_MAX_SEQ
    max_batch: int = DEFAULT_MAX_BATCH
    dtype: str = DEFAULT_DTYPE
    prefill_lengths: tuple[int, ...] = ()  # static prefill lengths (`prefill_<n>` each)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


def load_model(folder: Path, *, what: str, dtype: torch.dtype = torch.float32) -> Any:
    """The folder's model through transformers' own code, in `dtype`, no hub."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if not (folder / "config.json").is_file():
        raise CompileError(
            f"{what}: {folder} has no config.json; a causal-lm source is a folder written by "
            "save_pretrained (config.json, *.safetensors, tokenizer.json)"
        )
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            folder,
            config=config,
            local_files_only=True,
            dtype=dtype,
            attn_implementation="sdpa",
        )
    except Exception as e:  # transformers raises ValueError, OSError, KeyError, ...
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CompileError(f"{what}: transformers cannot load {folder}: {first}") from e
    return model.eval()


def cache_shape(config: Any, max_batch: int, max_seq: int) -> tuple[int, int, int, int, int]:
    """(layers, max_batch, kv_heads, slots, head_dim) of the model's KV cache.

    A sequence holds at most `max_seq` tokens, in `max_seq + 1` slots: with the spare slot every
    write and read is a strict part of the cache, which torch.export needs to keep the length
    dynamic (a slice as long as the whole tensor is specialized).
    """
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return (text.num_hidden_layers, max_batch, kv_heads, max_seq + 1, head_dim)


def cache_rows(shape: tuple[int, int, int, int, int]) -> tuple[int, int]:
    """The cache buffer's 2-D shape for `cache_shape` (layers, batch, kv_heads, slots, head_dim):
    row `(2 * layer + kind) * slots + slot` holds one slot's keys (kind 0) or values (kind 1) for
    every sequence of the batch, `batch * kv_heads * head_dim` elements.

    Why rows: a call's new tokens are then ONE contiguous block of ONE tensor, written with one
    slice of the buffer itself, which IREE turns into a `flow.tensor.update` of the global,
    done in place. With a [2 x layers, batch, kv_heads, slots, head_dim] buffer, torch's
    functionalization writes `kv[2i][:, :, s:e]` as "take layer i's slab, insert the tokens,
    put the slab back": two copies of the layer's whole allocation per write, so a decode step
    cost grew with `max_seq` (docs/llm.md).
    """
    layers, batch, kv_heads, slots, head_dim = shape
    return 2 * layers * slots, batch * kv_heads * head_dim


def _cache_classes() -> tuple[type, type]:
    """The cache layer and cache, defined on first use so that importing this module does not
    import transformers."""
    from transformers.cache_utils import Cache, StaticLayer

    class DeviceKVLayer(StaticLayer):
        """One layer's keys (or values) as `slots` consecutive rows of the owner's row buffer;
        `update` writes the call's tokens into rows `kv - q .. kv - 1` and returns rows
        `0 .. kv - 1` as [batch, kv_heads, kv, head_dim] (kv from the owning cache, per call)."""

        def __init__(self, owner: DeviceKVCache, index: int, shape: tuple[int, ...]):
            _, batch, kv_heads, slots, head_dim = shape
            super().__init__(max_cache_len=slots)
            self.owner = owner
            self.key_row = (2 * index) * slots
            self.value_row = (2 * index + 1) * slots
            self.batch_size, self.num_heads = batch, kv_heads
            self.k_head_dim = self.v_head_dim = head_dim
            self.is_initialized = True

        def _write_and_read(self, first_row: int, states: torch.Tensor) -> torch.Tensor:
            rows = self.owner.rows
            end = self.owner.kv_length
            q = states.shape[2]
            # [b, h, q, d] -> q rows of b * h * d: one contiguous block of the row buffer.
            block = states.to(rows.dtype).permute(2, 0, 1, 3).reshape(q, rows.shape[1])
            rows[first_row + end - q : first_row + end] = block
            held = rows[first_row : first_row + end]
            return held.view(end, self.batch_size, self.num_heads, -1).permute(1, 2, 0, 3)

        def update(self, key_states, value_states, *args, **kwargs):
            return (
                self._write_and_read(self.key_row, key_states),
                self._write_and_read(self.value_row, value_states),
            )

        def get_seq_length(self) -> int:
            return self.owner.kv_length

        def get_mask_sizes(self, query_length: int, *args, **kwargs) -> tuple[int, int]:
            return self.owner.kv_length, 0

    class DeviceKVCache(Cache):
        def __init__(self, shape: tuple[int, ...]):
            self.kv_length = 0
            self.rows: torch.Tensor | None = None  # the module's buffer, set per call
            super().__init__(layers=[DeviceKVLayer(self, i, shape) for i in range(shape[0])])

    return DeviceKVLayer, DeviceKVCache


# The attention function the frontend gives the model (transformers' AttentionInterface name).
GROUPED_ATTENTION = "myelin_grouped_sdpa"


def grouped_query_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention without `repeat_kv` for grouped-query attention.

    transformers' SDPA path expands the `kv_heads` key and value heads to the query heads
    (`repeat_kv`) under torch.export; the export keeps that as a copy of every held key and
    value per layer and step, `groups` times the cache read (7.9 ms of a 1.1B decode step at
    129 tokens held, docs/llm.md). Here the query heads of one group become rows instead:
    query [b, kv_heads * groups, q, d] -> [b, kv_heads, groups * q, d] (head h is group
    member h % groups of key head h // groups, as `repeat_kv` orders them), the mask is
    repeated over the groups' rows, and attention reads the cache's heads as they are. Each
    output row is the same dot products and softmax as before; only its place changes back.

    Without groups, without a mask, or inside `_heads_as_heads()` (the static prefill, whose
    constant causal mask must stay recognizable to become `is_causal=True` for the flash
    kernel) it is transformers' own function unchanged.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    plain = groups == 1 or attention_mask is None or not _GROUP_ROWS.get()
    if plain or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs
        )
    batch, heads, q, head_dim = query.shape
    kv_heads = key.shape[1]
    # contiguous() then view(), and the output's dims split before they are permuted: other
    # spellings (a reshape of the transposed query, a view of the attention's output) make
    # torch.export guard on the dynamic length, and the export refuses the guard.
    rows = query.contiguous().view(batch, kv_heads, groups * q, head_dim)
    if attention_mask.shape[1] == 1:  # [b, 1, q, kv]: the same rows for every group member
        mask = attention_mask.repeat(1, 1, groups, 1)
    else:  # [b, heads, q, kv]
        mask = attention_mask.contiguous().view(batch, kv_heads, groups * q, -1)
    out = torch.nn.functional.scaled_dot_product_attention(
        rows, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling
    )
    # [b, kv_heads, groups * q, d] -> [b, q, heads, d], what transformers' function returns
    out = out.unflatten(2, (groups, q)).permute(0, 3, 1, 2, 4).contiguous()
    out = out.view(batch, q, heads, value.shape[-1])
    return out, None


_GROUP_ROWS = contextvars.ContextVar("myelin_group_rows", default=True)


@contextlib.contextmanager
def _heads_as_heads() -> Iterator[None]:
    token = _GROUP_ROWS.set(False)
    try:
        yield
    finally:
        _GROUP_ROWS.reset(token)


def use_grouped_query_attention(model: Any) -> None:
    """Give `model` `grouped_query_attention` (registered once under GROUPED_ATTENTION)."""
    from transformers import AttentionInterface

    AttentionInterface.register(GROUPED_ATTENTION, grouped_query_attention)
    model.set_attn_implementation(GROUPED_ATTENTION)


class CausalLMModule(torch.nn.Module):
    """The model plus its KV cache as buffers; `prefill` and `decode` are what PLeX exports."""

    def __init__(self, model: Any, options: CausalLMOptions) -> None:
        super().__init__()
        self.model = model
        self.options = options
        shape = cache_shape(model.config, options.max_batch, options.max_seq)
        cache_dtype = options.torch_dtype
        # One buffer of rows for every layer's keys and values (see `cache_rows`).
        self.register_buffer(CACHE_KEY, torch.zeros(cache_rows(shape), dtype=cache_dtype))
        _, cache_class = _cache_classes()
        self.cache = cache_class(shape)

    def _step(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        kv = attention_mask.shape[1]
        q = input_ids.shape[1]
        self.cache.kv_length = kv
        # The layers read the buffer at each call: torch.export swaps a module's buffers for its
        # tracing tensors, and a cache holding the original would mutate a constant, not state.
        self.cache.rows = getattr(self, CACHE_KEY)
        # The 4-D additive mask: query i (slot kv - q + i) sees slot j <= its own, unless j is
        # padding. transformers returns a 4-D mask as it is, so every family gets the same one.
        slots = torch.arange(kv, device=input_ids.device)
        query_slots = slots[kv - q :]
        causal = slots[None, :] <= query_slots[:, None]  # [q, kv]
        visible = causal[None, None, :, :] & (attention_mask[:, None, None, :] > 0)
        # A padding query sees at least itself: a row with nothing visible gives NaN, which its
        # cache slot would carry into every later step (0 * NaN in the attention sum).
        visible = visible | (slots[None, :] == query_slots[:, None])[None, None, :, :]
        dtype = self.options.torch_dtype
        mask = torch.zeros(visible.shape, dtype=dtype)
        mask = mask.masked_fill(~visible, torch.finfo(dtype).min)
        out = self.model(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=mask,
            cache=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        # float32 whatever the compute dtype: the host samples from them (numpy has no bfloat16).
        logits = out.logits[:, -1, :].float()
        return logits, greedy_tokens(logits)

    def prefill(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self._step(input_ids, position_ids, attention_mask)

    def decode(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self._step(input_ids, position_ids, attention_mask)

    def prefill_static(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A first call at a static length n (`prefill_<n>`), prompts padded on the right.

        The mask given to the model depends on no input: torch's causal mask (0 on and below
        the diagonal, -inf above), which the export rewrites to `is_causal=True`, the form the
        flash-attention kernel takes. Right padding needs nothing more: a real token sees only
        earlier slots, all real. A padding slot sees the tokens before it (never an empty row,
        so no NaN); its keys and values land in the cache, where `decode`'s mask (0 there) hides
        them. Each row's logits are those of its last real token, `sum(attention_mask) - 1`:
        `logits_to_keep` takes those b indices for every row, and row r keeps its own (b x b
        rows of the LM head instead of b x n).
        """
        n = input_ids.shape[1]
        self.cache.kv_length = n
        self.cache.rows = getattr(self, CACHE_KEY)
        slots = torch.arange(n, device=input_ids.device)
        dtype = self.options.torch_dtype
        mask = torch.zeros((n, n), dtype=dtype).masked_fill(
            slots[None, :] > slots[:, None], -torch.inf
        )
        last = attention_mask.sum(dim=1) - 1  # [b]
        with _heads_as_heads():
            out = self.model(
                input_ids=input_ids,
                position_ids=position_ids,
                attention_mask=mask[None, None, :, :],
                cache=self.cache,
                use_cache=True,
                logits_to_keep=last,
            )
        rows = torch.arange(input_ids.shape[0], device=input_ids.device)
        logits = out.logits[rows, rows, :].float()
        return logits, greedy_tokens(logits)


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """Each row's greedy token, [b, 1] int64 (the shape of `decode`'s input_ids): the first
    index of the row's largest logit, as numpy's and torch's argmax pick it. Written as a max
    and a min of the indices where it is reached, two float32 reductions, rather than
    `torch.argmax`, whose value-and-index reduction is one IREE may not give a GPU's reduction
    strategy, or an integer min: IREE 3.13's CUDA code for that one returned -1 for every row
    (on an H100). Indices are exact in float32 below 2^24, far above any vocabulary. A row
    without a largest value (NaN) gives the last token: the result is clamped to the
    vocabulary, so that the next decode, which takes it without the host's index check,
    never reads outside its embedding table."""
    vocab = logits.shape[-1]
    best = logits.amax(dim=-1, keepdim=True)
    index = torch.arange(vocab, dtype=torch.float32, device=logits.device)
    first = torch.where(logits == best, index, float(vocab)).amin(dim=-1, keepdim=True)
    return first.clamp(0, vocab - 1).to(torch.int64)


def describe(model: Any, options: CausalLMOptions) -> dict[str, Any]:
    """What the generator needs to know about the model, recorded with the artifact."""
    layers, batch, kv_heads, slots, head_dim = cache_shape(
        model.config, options.max_batch, options.max_seq
    )
    itemsize = options.torch_dtype.itemsize
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None) if gen is not None else None
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    return {
        "max_seq": options.max_seq,
        "max_batch": batch,
        "vocab": int(model.config.get_text_config().vocab_size),
        "cache_bytes": 2 * layers * batch * kv_heads * slots * head_dim * itemsize,
        "cache_dtype": options.dtype,
        "eos_token_ids": sorted({eos} if isinstance(eos, int) else set(eos or ())),
        "model_type": model.config.model_type,
        # static prefill lengths: entrypoint `prefill_<n>` takes prompts right-padded to n
        "prefill_lengths": list(options.prefill_lengths),
        # every entrypoint's second result is `greedy_tokens` (artifacts built before have none)
        "greedy_tokens": True,
    }


def to_json(value: dict[str, Any]) -> str:
    return json.dumps(value, sort_keys=True)


# -- export ---------------------------------------------------------------------------------------


def options_of(request: FrontendRequest) -> CausalLMOptions:
    return CausalLMOptions(
        max_seq=request.max_seq or DEFAULT_MAX_SEQ,
        max_batch=request.max_batch or DEFAULT_MAX_BATCH,
        dtype=request.dtype or DEFAULT_DTYPE,
        prefill_lengths=tuple(sorted(set(request.prefill_lengths or ()))),
    )


def to_mlir(request: FrontendRequest) -> FrontendResult:
    from myelin.frontends import torch as torch_frontend

    folder = request.source.parent
    what = f"{folder.name}/"
    options = options_of(request)
    if request.entrypoints is not None and set(request.entrypoints) != {PREFILL, DECODE}:
        raise CompileError(
            f"{what}: a causal-lm graph exports exactly {PREFILL} and {DECODE}; remove "
            "`entrypoints` from the manifest"
        )
    too_long = [n for n in options.prefill_lengths if not 2 <= n <= options.max_seq]
    if too_long:
        raise CompileError(
            f"{what}: prefill_lengths {too_long} are not within 2 .. max_seq ({options.max_seq})"
        )
    tokenizer = folder / TOKENIZER_FILE
    if not tokenizer.is_file():
        raise CompileError(
            f"{what}: no {TOKENIZER_FILE} in {folder}; save the tokenizer beside the model "
            "(tokenizer.save_pretrained(folder)) so that the artifact can turn text into tokens"
        )
    with torch_frontend._EXPORT_LOCK, torch_frontend._quiet_export_warnings():
        model = load_model(folder, what=what, dtype=options.torch_dtype)
        use_grouped_query_attention(model)
        module = CausalLMModule(model, options)
        programs = _export(module, options, what)
        tensors = _externalize(programs, request.scope)
        torch_mlir = torch_frontend._import(programs)
        arg_names = {name: list(ARG_NAMES) for name in programs}
    mlir, keys = torch_frontend._lower(torch_mlir, programs, arg_names, request, what)
    record = describe(model, options)
    mlir = _finish(mlir, record, tokenizer.read_text(encoding="utf-8"), what)
    values = {}
    for scope, key in keys:
        if key == CACHE_KEY:
            continue  # module state, left uninitialized by _finish
        if scope != request.scope or key not in tensors:
            raise CompileError(f"{what}: the exported graph reads {scope}::{key}, not a weight")
        values[key] = torch_frontend._numpy(tensors[key])
    return FrontendResult(
        mlir=mlir, input_type=torch_frontend.LOWERED_INPUT_TYPE, parameters=values
    )


ARG_NAMES = ("input_ids", "position_ids", "attention_mask")
# The reflection keys of `prefill` that carry the model's record and its tokenizer.
RECORD_KEY = "myelin.causal_lm"
TOKENIZER_KEY = "myelin.tokenizer"


def _export(
    module: CausalLMModule, options: CausalLMOptions, what: str
) -> dict[str, torch.export.ExportedProgram]:
    from iree.turbine.aot.decompositions import extend_aot_decompositions
    from iree.turbine.aot.fx_programs import FxProgramsBuilder

    from myelin.frontends._torch_fixes import (
        constant_attention_masks,
        decomposition_table,
        float_scalar_comparisons,
    )

    # torch.export specializes sizes 0 and 1: the examples have 2 and more (a 1-token prompt
    # still runs, the compiled dim is dynamic).
    batch, seq = options.max_batch, options.max_seq
    prompt = torch.export.Dim("prompt", min=1, max=seq)
    cache = torch.export.Dim("cache", min=2, max=seq)

    # Separate tensors for every argument: torch.export reads aliased examples as one input.
    def example(width: int) -> tuple[torch.Tensor, ...]:
        ids = torch.zeros((batch, width), dtype=torch.int64)
        positions = torch.arange(width, dtype=torch.int64).repeat(batch, 1)
        return ids, positions, torch.ones((batch, 4), dtype=torch.int64)

    builder = FxProgramsBuilder(module)
    programs = {}
    plans = {
        PREFILL: (CausalLMModule.prefill, example(4), {1: prompt}, {1: prompt}),
        DECODE: (CausalLMModule.decode, example(1), None, {1: cache}),
    }
    for length in options.prefill_lengths:  # static: no dims, the mask as long as the prompt
        ids, positions, _ = example(length)
        args = (ids, positions, torch.ones((batch, length), dtype=torch.int64))
        plans[prefill_name(length)] = (CausalLMModule.prefill_static, args, None, None)
    for name, (method, args, token_dims, mask_dims) in plans.items():
        shapes = {"input_ids": token_dims, "position_ids": token_dims, "attention_mask": mask_dims}
        try:
            with extend_aot_decompositions(from_current=False):
                program = builder.export_program(
                    method, args=args, dynamic_shapes=shapes, strict=False, name=name
                )
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise CompileError(
                f"{what}: torch.export of {name} failed: {type(e).__name__}: {first}"
            ) from e
        program = program.run_decompositions(decomposition_table())
        float_scalar_comparisons(program)
        if name != PREFILL and name != DECODE:
            # the causal mask, built from no input, becomes is_causal=True (the kernel's form)
            rewritten = constant_attention_masks(program)
            layers = cache_shape(module.model.config, batch, seq)[0]
            if rewritten != layers:
                raise CompileError(
                    f"{what}: {name}: {rewritten} of {layers} attentions took the causal form; "
                    "this model family changes the mask it is given (drop prefill_lengths)"
                )
        programs[name] = program
    return programs


def _externalize(
    programs: dict[str, torch.export.ExportedProgram], scope: str
) -> dict[str, torch.Tensor]:
    """Bind every weight to a named parameter under its transformers name
    (`model.layers.0.self_attn.q_proj.weight`). The cache buffer gets a name too, CACHE_KEY,
    which no weight file provides: iree-turbine would otherwise copy its zeros into the IR
    (through numpy, which has no bfloat16), and `_finish` replaces it by `#util.uninitialized`."""
    from iree.turbine.aot.tensor_traits import ExternalTensorTrait

    by_key: dict[str, torch.Tensor] = {}
    for program in programs.values():
        for key, tensor in [*program.state_dict.items(), *program.constants.items()]:
            if not isinstance(tensor, torch.Tensor):
                continue
            if key.endswith(CACHE_KEY):
                if ExternalTensorTrait.get(tensor) is None:
                    ExternalTensorTrait(external_scope=scope, external_name=CACHE_KEY).set(tensor)
                continue
            name = key.removeprefix("root.").removeprefix("model.")
            if ExternalTensorTrait.get(tensor) is None:
                ExternalTensorTrait(external_scope=scope, external_name=name).set(tensor)
            by_key.setdefault(name, tensor)
    return by_key


def _finish(mlir: bytes, record: dict[str, Any], tokenizer: str, what: str) -> bytes:
    """Leave the cache global uninitialized (no cache bytes in the artifact) and record the
    model and its tokenizer in `prefill`'s reflection, where the runtime reads them.

    The global arrives bound to the parameter CACHE_KEY (`_externalize`), which no file
    provides; a zero initial value, even a splat, would be exported as a parameter of zeros.
    Uninitialized is safe: a call reads only slots 0 .. kv - 1, which the sequence's prefill
    and decode calls have written.

    There must be exactly one mutable global. IREE 3.13 turns each `#util.uninitialized` into a
    `stream.tensor.empty` in the global's initializer; `iree-util-combine-initializers` puts
    them in one initializer, where CSE merges equal (pure) empties into one allocation stored
    into every such global, after which `iree-util-fuse-globals` fuses the globals: several
    caches of one type would be the same memory (wrong logits, no error).
    """
    from iree.compiler import ir

    from myelin.compiler.session import CompilerSession
    from myelin.frontends.torch import _SESSION_FLAGS

    with CompilerSession(_SESSION_FLAGS) as session:
        module = session.parse(mlir, what=what)
        with session.context, ir.Location.unknown():
            states = 0
            for op in module.regions[0].blocks[0].operations:
                name = op.operation.name
                attrs = op.operation.attributes
                if name == "util.global" and "is_mutable" in attrs:
                    value_type = ir.TypeAttr(attrs["type"]).value
                    attrs["initial_value"] = ir.Attribute.parse(
                        f"#util.uninitialized : {value_type}"
                    )
                    states += 1
                elif name == "func.func" and ir.StringAttr(attrs["sym_name"]).value == PREFILL:
                    attrs["iree.reflection"] = ir.DictAttr.get(
                        {
                            RECORD_KEY: ir.StringAttr.get(to_json(record)),
                            TOKENIZER_KEY: ir.StringAttr.get(tokenizer),
                        }
                    )
            if states != 1:
                raise CompileError(
                    f"{what}: the export kept {states} mutable globals, not the one KV cache "
                    "buffer; a model that keeps other state is not supported by causal-lm"
                )
        buffer = io.BytesIO()
        module.write_bytecode(buffer)
    return buffer.getvalue()
