"""Text generation over a causal LM `.mln` (frontend = "causal-lm"): prompts in, a stream of
tokens and text out.

    model = myelin.Instance().load("lm.mln")
    generator = Generator(model)
    for step in generator.stream("Once upon a time", max_new_tokens=64):
        print(step.text, end="", flush=True)

The artifact carries what generation needs: `prefill` and `decode` entrypoints whose KV cache is
module state (one cache per session, on the device, updated in place), and in `prefill`'s
reflection the model's record (max_seq, max_batch, end-of-sequence ids) and its tokenizer.json,
read with the `tokenizers` library. Per step only the new token ids go in and the last
position's logits come back; sampling runs here, on the host, in numpy.

An artifact built with `prefill_lengths` also has `prefill_<n>` entrypoints, static prompt
lengths whose attention a backend's static-shape kernels take: a batch whose longest prompt
fits one (without shortening the generation) is padded on the right to the smallest such n and
goes there; any other is padded on the left and goes to the dynamic `prefill`.

A generator owns one session, so one generation runs at a time on it; for concurrent
generations open one generator per thread. Each holds its own cache, which memory admission
counts for as long as the generator is open.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from myelin.errors import (
    Cancelled,
    DeadlineExceeded,
    InputError,
    MemoryBudgetExceeded,
    MyelinError,
)
from myelin.runtime.admission import CallNeed, format_bytes
from myelin.runtime.deadline import Deadline
from myelin.runtime.session import CallError

# Names shared with the frontend (myelin.frontends.causal_lm), which the runtime must not import.
PREFILL = "prefill"
DECODE = "decode"
RECORD_KEY = "myelin.causal_lm"
TOKENIZER_KEY = "myelin.tokenizer"


class NotACausalLM(MyelinError):
    """The artifact was not built from a causal-lm graph."""


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen, in the order transformers applies these: repetition
    penalty, temperature, top-k, top-p. `temperature=0` is greedy (argmax)."""

    temperature: float = 0.0
    top_k: int = 0  # 0: no limit
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise InputError(f"temperature must be >= 0 (0: greedy), got {self.temperature}")
        if self.top_k < 0:
            raise InputError(f"top_k must be >= 0 (0: no limit), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise InputError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.repetition_penalty <= 0:
            raise InputError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")


@dataclass
class Step:
    """One generated token of one sequence, and the text it completes (may be empty while a
    multi-byte character is still incomplete)."""

    sequence: int
    token: int
    text: str


@dataclass
class Generation:
    """A finished generation: per sequence its new tokens and text, why it stopped, and timing."""

    tokens: list[list[int]]
    texts: list[str]
    stop_reasons: list[str]  # "eos", "stop_string", "max_new_tokens", "max_seq", "cancelled"
    prompt_tokens: int  # the prompts' tokens (padding not counted)
    time_to_first_token_s: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    decode_steps: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    prefill_entrypoint: str = PREFILL  # the prefill that ran: "prefill" or "prefill_<n>"


class Generator:
    """Generation over one session of a loaded causal-LM model."""

    def __init__(
        self,
        model: Any,
        *,
        spin_us: float = 0.0,
        wait_for_memory: float = 0.0,
        static_prefill: bool = True,
        device_picks: bool = True,
    ) -> None:
        """`wait_for_memory`: seconds to wait, under a memory budget, for other generators or
        calls to give back the bytes this generator's KV cache needs (0: fail at once).
        `static_prefill=False` always calls the dynamic `prefill`, even where the artifact has
        a static-length one that fits (to compare the two). `device_picks=False` makes greedy
        picks on the host from the logits, one call at a time, as sampling does, even where
        the artifact picks on the device (to compare the two)."""
        self.model = model
        try:
            reflection = model.reflection(PREFILL)
        except MyelinError as e:
            raise NotACausalLM(
                f"{model.path.name} has no '{PREFILL}' entrypoint: build it from a Hugging Face "
                'folder with frontend = "causal-lm" (docs/llm.md)'
            ) from e
        if RECORD_KEY not in reflection:
            raise NotACausalLM(
                f"{model.path.name}: '{PREFILL}' was not built by the causal-lm frontend; build "
                'the model with frontend = "causal-lm" (docs/llm.md)'
            )
        record = json.loads(reflection[RECORD_KEY])
        self.max_seq: int = record["max_seq"]
        self.max_batch: int = record["max_batch"]
        self.vocab: int = record["vocab"]
        self.cache_bytes: int = record["cache_bytes"]
        # the model's compute dtype (the manifest's `dtype`); artifacts built before it was
        # recorded always had a float32 cache
        self.cache_dtype: str = record.get("cache_dtype", "float32")
        self.eos_token_ids: tuple[int, ...] = tuple(record["eos_token_ids"])
        # static prefill lengths (`prefill_<n>`); artifacts built before them have none
        lengths = record.get("prefill_lengths", []) if static_prefill else []
        self.prefill_lengths: tuple[int, ...] = tuple(sorted(lengths))
        # `prefill*` and `decode` return each row's greedy token too (artifacts built before
        # return logits only)
        self.greedy_tokens: bool = device_picks and record.get("greedy_tokens", False)
        self.tokenizer = _tokenizer(reflection.get(TOKENIZER_KEY), model.path.name)
        # The cache is allocated when the session's VM context starts: count it first.
        self._reservation = None
        if model.budget is not None:
            self._reservation = self._reserve_cache(model, wait_for_memory)
        try:
            self.session = model.session(spin_us=spin_us)
        except BaseException:
            self._release()
            raise
        self._prefill = self.session.resolve(PREFILL)
        self._decode = self.session.resolve(DECODE)
        self._static_prefills = {n: self.session.resolve(f"{PREFILL}_{n}") for n in lengths}
        self._cancelled = threading.Event()
        self._busy = threading.Lock()

    def _reserve_cache(self, model: Any, wait_s: float) -> Any:
        what = f"{model.path.name}: the KV cache of a generator session"
        try:
            return model.budget.reserve(
                CallNeed(0, self.cache_bytes, 0), what, Deadline(what, wait_s)
            )
        except DeadlineExceeded:
            raise MemoryBudgetExceeded(
                f"{what} needs {format_bytes(self.cache_bytes)}, more than the memory "
                "budget has free while other generators and calls hold theirs; "
                "close a generator, wait longer (wait_for_memory=), raise [runtime] "
                "memory or rebuild with a smaller max_seq / max_batch"
            ) from None

    # -- lifetime --------------------------------------------------------------------------------

    def close(self) -> None:
        self.session.close()
        self._release()

    def _release(self) -> None:
        if self._reservation is not None:
            self._reservation.release()
            self._reservation = None

    def __enter__(self) -> Generator:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def cancel(self) -> None:
        """Stop the running generation (any thread): its stream ends after the current step,
        whose call is cancelled too; the generator stays usable."""
        self._cancelled.set()
        self.session.cancel()

    # -- text ------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=True)

    # -- generation ------------------------------------------------------------------------------

    def generate(
        self, prompts: str | Sequence[int] | Sequence[str | Sequence[int]], **options: Any
    ) -> Generation:
        """Run `stream` to the end; returns every sequence's tokens, text and timing."""
        stream = self.stream(prompts, **options)
        for _ in stream:
            pass
        assert stream.result is not None
        return stream.result

    def stream(
        self,
        prompts: str | Sequence[int] | Sequence[str | Sequence[int]],
        *,
        max_new_tokens: int = 64,
        sampling: Sampling | None = None,
        stop_tokens: Sequence[int] = (),
        stop_strings: Sequence[str] = (),
        use_eos: bool = True,
        timeout: float | None = None,
    ) -> GenerationStream:
        """An iterator of `Step`s, token by token, in sequence order within a step.

        `prompts`: one text, one list of token ids, or a list of either (at most max_batch;
        prompts of different lengths are padded, see the module's docstring). A sequence stops
        at an end-of-sequence id of the model (`use_eos`), at any of `stop_tokens`, when its
        text contains one of `stop_strings` (the text is cut before it), after
        `max_new_tokens`, or when it fills max_seq. `timeout` bounds each device call
        (DeadlineExceeded).
        """
        batch = self._prompts(prompts)
        if max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        return GenerationStream(
            self,
            batch,
            max_new_tokens=max_new_tokens,
            sampling=sampling or Sampling(),
            stop_tokens=frozenset(stop_tokens)
            | (frozenset(self.eos_token_ids) if use_eos else frozenset()),
            stop_strings=tuple(s for s in stop_strings if s),
            timeout=timeout,
        )

    def _prompts(self, prompts: Any) -> list[list[int]]:
        single = isinstance(prompts, str) or (
            isinstance(prompts, Sequence) and prompts and isinstance(prompts[0], int | np.integer)
        )
        items = [prompts] if single else list(prompts)
        if not items:
            raise InputError("no prompt given")
        if len(items) > self.max_batch:
            raise InputError(
                f"{len(items)} prompts but the model was built for max_batch = {self.max_batch}; "
                "pass fewer prompts or rebuild with a larger max_batch"
            )
        batch = []
        for item in items:
            tokens = self.encode(item) if isinstance(item, str) else [int(t) for t in item]
            if not tokens:
                raise InputError("a prompt has no tokens")
            bad = [t for t in tokens if not 0 <= t < self.vocab]
            if bad:
                raise InputError(
                    f"token id {bad[0]} is outside the vocabulary (0..{self.vocab - 1})"
                )
            if len(tokens) >= self.max_seq:
                raise InputError(
                    f"a prompt of {len(tokens)} tokens leaves no room in max_seq = {self.max_seq}; "
                    "shorten it or rebuild with a larger max_seq"
                )
            batch.append(tokens)
        return batch


class GenerationStream:
    """The iterator `Generator.stream` returns; `result` is set when it ends."""

    def __init__(
        self,
        generator: Generator,
        prompts: list[list[int]],
        *,
        max_new_tokens: int,
        sampling: Sampling,
        stop_tokens: frozenset[int],
        stop_strings: tuple[str, ...],
        timeout: float | None,
    ) -> None:
        self.generator = generator
        self.prompts = prompts
        self.max_new_tokens = max_new_tokens
        self.sampling = sampling
        self.stop_tokens = stop_tokens
        self.stop_strings = stop_strings
        self.timeout = timeout
        self.result: Generation | None = None
        self._steps = self._run()

    def __iter__(self) -> Iterator[Step]:
        return self

    def __next__(self) -> Step:
        return next(self._steps)

    def _run(self) -> Iterator[Step]:
        g = self.generator
        if not g._busy.acquire(blocking=False):
            raise InputError(
                "this generator is already generating; open one Generator per concurrent generation"
            )
        try:
            g._cancelled.clear()
            yield from self._generate()
        finally:
            g._busy.release()

    def _generate(self) -> Iterator[Step]:
        g, s = self.generator, self.sampling
        rows = len(self.prompts)
        longest = max(len(p) for p in self.prompts)
        bucket = self._bucket(longest)
        width = bucket or longest
        # Rows past the prompts given run a one-token dummy (the batch size is compiled in).
        ids = np.zeros((g.max_batch, width), dtype=np.int64)
        mask = np.zeros((g.max_batch, width), dtype=np.int64)
        for r in range(g.max_batch):
            tokens = self.prompts[r] if r < rows else [0]
            if bucket:  # right padding: the static prefill's causal mask hides it (frontend)
                ids[r, : len(tokens)] = tokens
                mask[r, : len(tokens)] = 1
            else:  # left padding: every row's last prompt token sits in the same slot
                ids[r, width - len(tokens) :] = tokens
                mask[r, width - len(tokens) :] = 1
        # Positions count real tokens, as transformers' generate computes them (right padding
        # goes on counting: its slots are never seen by a real token).
        if bucket:
            positions = np.broadcast_to(np.arange(width, dtype=np.int64), mask.shape).copy()
        else:
            positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int64)
        next_position = mask.sum(axis=1).astype(np.int64)
        prefill = g._static_prefills[bucket] if bucket else g._prefill
        rng = np.random.default_rng(s.seed)
        seen = [set(p) for p in self.prompts]  # for the repetition penalty
        tokens: list[list[int]] = [[] for _ in range(rows)]
        texts = [""] * rows
        emitted = [""] * rows  # text already streamed, per row
        reasons: list[str | None] = [None] * rows
        room = g.max_seq - width  # decode calls that fit after the prompt

        greedy = s.temperature == 0 and s.repetition_penalty == 1.0
        # Greedy picks made on the device: each step reads b token ids, not b x vocab logits,
        # and the next decode is queued on them before the host reads them (`_Picks`).
        picks_on_device = greedy and g.greedy_tokens
        # Timing is wall clock as the stream's reader sees it: the first token is out once the
        # prefill ran and it was chosen; decode time runs from there to the last token's choice
        # (calls, sampling, text), as a streamer stamping tokens measures any runtime.
        start = time.perf_counter()
        if picks_on_device:
            steps = _Picks(g, prefill, ids, positions, mask, self.timeout)
            logits = None
        else:
            logits = self._call(prefill, ids, positions, mask)
        prefill_s = time.perf_counter() - start
        first = last = start
        decode_steps = 0
        calls_s = 0.0
        for step in range(self.max_new_tokens):
            more = step < self.max_new_tokens - 1 and step < room  # another decode follows
            if picks_on_device:
                t0 = time.perf_counter()
                if step == 0:  # the first token waits behind no submission
                    picks = steps.tokens()
                    prefill_s = time.perf_counter() - start
                if more:  # the next decode is queued before this step's tokens are read
                    mask = np.concatenate([mask, np.ones((g.max_batch, 1), np.int64)], axis=1)
                    steps.queue(next_position[:, None].copy(), mask)
                    next_position = next_position + 1
                if step > 0:
                    picks = steps.tokens()
                    calls_s += time.perf_counter() - t0
            else:
                picks = argmax_rows(logits[:rows]) if greedy else None
            chosen = np.zeros(g.max_batch, dtype=np.int64)
            for r in range(rows):
                if reasons[r] is not None:
                    continue
                token = int(picks[r]) if picks is not None else _choose(logits[r], s, seen[r], rng)
                chosen[r] = token
                tokens[r].append(token)
                seen[r].add(token)
                text, stop = self._text(r, tokens[r])
                texts[r] = text
                new, emitted[r] = text[len(emitted[r]) :], text
                if token in self.stop_tokens:
                    reasons[r] = "eos"
                elif stop:
                    reasons[r] = "stop_string"
                yield Step(r, token, new)
            last = time.perf_counter()
            if step == 0:
                first = last
            if g._cancelled.is_set():
                reasons = [x or "cancelled" for x in reasons]
            if all(x is not None for x in reasons):
                break
            if step == self.max_new_tokens - 1:
                break
            if step >= room:  # the next decode would hold max_seq + 1 tokens
                reasons = [x or "max_seq" for x in reasons]
                break
            if picks_on_device:
                decode_steps += 1  # queued above
                continue
            # One more slot per row; finished rows keep running (their tokens are ignored).
            mask = np.concatenate([mask, np.ones((g.max_batch, 1), dtype=np.int64)], axis=1)
            t0 = time.perf_counter()
            try:
                logits = self._call(g._decode, chosen[:, None], next_position[:, None].copy(), mask)
            except Cancelled:
                reasons = [x or "cancelled" for x in reasons]
                break
            calls_s += time.perf_counter() - t0
            decode_steps += 1
            next_position = next_position + 1
        reasons = [x or "max_new_tokens" for x in reasons]
        prompt_tokens = sum(len(p) for p in self.prompts)  # the real ones, not padding
        decode_s = last - first if decode_steps else 0.0
        self.result = Generation(
            tokens=tokens,
            texts=texts,
            stop_reasons=[str(x) for x in reasons],
            prompt_tokens=prompt_tokens,
            time_to_first_token_s=first - start,
            prefill_tokens_per_s=prompt_tokens / max(prefill_s, 1e-9),
            decode_tokens_per_s=decode_steps * rows / decode_s if decode_s > 0 else 0.0,
            decode_steps=decode_steps,
            timings={"prefill_s": prefill_s, "decode_s": decode_s, "decode_calls_s": calls_s},
            prefill_entrypoint=f"{PREFILL}_{bucket}" if bucket else PREFILL,
        )

    def _bucket(self, longest: int) -> int:
        """The smallest static prefill length that holds the longest prompt without shortening
        the generation (its padding takes cache slots: max_seq - n decode steps fit after it);
        0: none, the dynamic prefill runs."""
        g = self.generator
        wanted = min(self.max_new_tokens - 1, g.max_seq - longest)
        for n in g.prefill_lengths:
            if n >= longest and g.max_seq - n >= wanted:
                return n
        return 0

    def _call(self, call: Any, ids: np.ndarray, positions: np.ndarray, mask: np.ndarray) -> Any:
        """The logits of a call (of an artifact built with greedy tokens, the first result)."""
        out = call(ids, positions, mask, output="numpy", timeout=self.timeout)
        return out[0] if isinstance(out, tuple) else out

    def _text(self, row: int, tokens: list[int]) -> tuple[str, bool]:
        """The row's text so far, cut before a stop string (and whether one was found). A
        trailing incomplete UTF-8 sequence is held back until its last byte arrives."""
        text = self.generator.decode(tokens)
        for stop in self.stop_strings:
            at = text.find(stop)
            if at >= 0:
                return text[:at], True
        text = text.rstrip("\ufffd")
        # Hold back an ending that may be the start of a stop string, so that a stream never
        # shows text the stop string will cut.
        held = max(
            (
                n
                for stop in self.stop_strings
                for n in range(1, len(stop))
                if text.endswith(stop[:n])
            ),
            default=0,
        )
        return text[: len(text) - held], False


class _Picks:
    """The calls of a greedy generation whose picks are made on the device (the artifact's
    `greedy_tokens` result), in submission order: `queue` submits the next decode on the
    latest call's tokens while they are still on the device, with a read of its own tokens
    queued right behind it; `tokens` waits for the oldest call's tokens. The generator queues
    step n + 1 before it reads step n (after the prefill's, which it reads first: the first
    token is not held behind a submission). Where the device runs a session's submissions in
    order with nothing waiting on the host between them (CUDA: myelin.runtime.pending), it
    runs step n + 1 while the host turns step n's tokens into text, instead of idling for a
    round trip each step. Elsewhere submissions wait as calls do, and the order is the same."""

    def __init__(
        self, g: Generator, prefill: Any, ids: Any, positions: Any, mask: Any, timeout: float | None
    ) -> None:
        self._decode = g._decode
        self._timeout = timeout
        self._vocab = g.vocab
        self._latest = prefill.submit(ids, positions, mask)
        self._calls = deque([(self._latest, self._latest.read(1))])

    def queue(self, positions: np.ndarray, mask: np.ndarray) -> None:
        pending = self._decode.submit(self._latest.ahead(1), positions, mask)
        self._calls.append((pending, pending.read(1)))
        self._latest = pending

    def tokens(self) -> np.ndarray:
        """The oldest unread call's tokens, one per row."""
        pending, read = self._calls.popleft()
        pending.result(self._timeout)  # a timeout or a failed call is reported here
        picks = read.result()[:, 0]
        if picks.min() < 0 or picks.max() >= self._vocab:
            raise CallError(
                f"{pending.name}: the device's greedy tokens {picks.tolist()} are outside "
                f"the vocabulary (0 .. {self._vocab - 1}); pick on the host with "
                "Generator(model, device_picks=False), and report the device"
            )
        return picks


def argmax_rows(logits: np.ndarray) -> np.ndarray:
    """Each row's greedy token. numpy compares float16 without SIMD (about 90 us for a 32000
    vocabulary, 23 us even through a float64 copy): float16 logits are compared as integers
    whose order is the floats' order (sign-magnitude bits, the magnitude flipped for negative
    values), about 4 us a row. Ties between -0 and +0 aside, the pick is np.argmax's."""
    if logits.dtype != np.float16:
        return np.argmax(logits, axis=-1)
    bits = logits.view(np.int16)
    return np.argmax(bits ^ ((bits >> 15) & np.int16(0x7FFF)), axis=-1)


def _choose(logits: np.ndarray, s: Sampling, seen: set[int], rng: np.random.Generator) -> int:
    """The next token from one row of logits (transformers' order of processors)."""
    scores = logits.astype(np.float64, copy=True)
    if s.repetition_penalty != 1.0 and seen:
        index = np.fromiter(seen, dtype=np.int64)
        values = scores[index]
        scores[index] = np.where(
            values < 0, values * s.repetition_penalty, values / s.repetition_penalty
        )
    if s.temperature == 0:
        return int(np.argmax(scores))
    scores /= s.temperature
    if 0 < s.top_k < scores.size:
        kth = np.partition(scores, -s.top_k)[-s.top_k]
        scores[scores < kth] = -np.inf
    if s.top_p < 1.0:
        order = np.argsort(scores)  # ascending, as transformers' TopPLogitsWarper
        probs = _softmax(scores[order])
        cumulative = np.cumsum(probs)
        remove = cumulative <= 1 - s.top_p
        remove[-1] = False  # always keep the most likely token
        scores[order[remove]] = -np.inf
    probs = _softmax(scores)
    return int(rng.choice(scores.size, p=probs))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - np.max(x))
    return e / e.sum()


def _tokenizer(text: str | None, name: str) -> Any:
    try:
        from tokenizers import Tokenizer
    except ModuleNotFoundError as e:
        raise MyelinError(
            "generation needs the 'tokenizers' package to read the model's tokenizer: "
            "pip install tokenizers"
        ) from e
    if not text:
        raise NotACausalLM(f"{name} carries no tokenizer; rebuild it with plex build")
    return Tokenizer.from_str(text)
