"""Autoregressive generation over an ONNX decoder with an explicit KV cache (LLM and VLM alike).

The decoder graph (thinkserve_build.decoder_graph) takes `input_ids` or `inputs_embeds`, `position_ids`,
`past_sequence_length` and per layer a KV buffer `past_key_values.{i}.{key,value}` [b, kv_heads, capacity,
head_dim] whose first `past_sequence_length` positions are the cache; it returns `logits` and the step's new keys
and values `new_key_values.{i}.{key,value}` [b, kv_heads, n, head_dim]. A generation owns its buffers: they are
bound as the graph's inputs where they lie, and the new keys and values are written into them after each step,
so the cache is never copied (before issue 16 each step fed the whole cache in as numpy and got a grown copy
back, and the graph concatenated and repeated it per head).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional, Sequence

import numpy as np
import onnxruntime as ort

from .sampling import TokenChoice, choose_token
from .text_stream import TextStream

PAST_PREFIX = "past_key_values."
NEW_PREFIX = "new_key_values."

_ORT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
# A sequence's buffers hold this many positions past what it needs and grow by as many when full: attention
# reads the whole buffer (the unused part masked out), and each growth copies the cache once.
_ROOM = 128


@dataclass(frozen=True)
class _Layer:
    past: str
    new: str
    heads: int
    head_dim: int
    dtype: type


class KVCacheDecoder:
    """One decoder graph; holds no per-request state (that is each DecodeSequence's), so concurrent generations
    can share it."""

    def __init__(self, session):
        self.session = session
        names = [i.name for i in session.get_inputs()]
        self.takes_embeddings = "inputs_embeds" in names
        self.primary_input = "inputs_embeds" if self.takes_embeddings else "input_ids"
        if self.primary_input not in names:
            raise ValueError(f"decoder graph has neither input_ids nor inputs_embeds (inputs: {names})")
        past = [i for i in session.get_inputs() if i.name.startswith(PAST_PREFIX)]
        if not past:
            raise ValueError("decoder graph has no past_key_values.* inputs: it was exported without a KV cache")
        if "past_sequence_length" not in names:
            raise ValueError("decoder graph lacks past_sequence_length: it predates the KV buffer; rebuild the model")
        self._layers = [
            _Layer(
                spec.name,
                NEW_PREFIX + spec.name[len(PAST_PREFIX) :],
                spec.shape[1],
                spec.shape[3],
                _ORT_TYPES.get(spec.type, np.float32),
            )
            for spec in past
        ]
        self.vocab_size = session.get_outputs()[0].shape[-1]
        if not isinstance(self.vocab_size, int):
            raise ValueError(f"decoder graph's logits have no fixed vocabulary size ({session.get_outputs()[0].shape})")

    def prefill_logits(self, inputs: np.ndarray) -> np.ndarray:
        """Next-token logits [b, vocab] after each of `b` prompts of one length (ids [b, n] or embeddings
        [b, n, d]), in one run: equal lengths need no padding, so every row is exact."""
        batch, length = inputs.shape[:2]
        feeds = {
            self.primary_input: inputs,
            "position_ids": np.tile(np.arange(length, dtype=np.int64), (batch, 1)),
            "past_sequence_length": np.array(0, dtype=np.int64),
            # an empty cache: one masked-out position (a zero-length buffer would need zero-sized products)
            **{layer.past: np.zeros((batch, layer.heads, 1, layer.head_dim), dtype=layer.dtype) for layer in self._layers},
        }
        return self.session.run(["logits"], feeds)[0][:, -1]

    def sequence(self) -> "DecodeSequence":
        """A new request's KV cache, empty."""
        return DecodeSequence(self)


class DecodeSequence:
    """One request's KV buffers and position over a shared KVCacheDecoder. Not thread-safe: one sequence
    belongs to one generation."""

    def __init__(self, decoder: KVCacheDecoder):
        self._decoder = decoder
        self._buffers: list[np.ndarray] = []
        self._binding = None
        self._outputs: list[np.ndarray] = []  # logits, then each layer's new keys and values, bound in place
        self.capacity = 0
        self.position = 0

    def step(self, inputs: np.ndarray) -> np.ndarray:
        """Run `inputs` (ids [1, n] or embeddings [1, n, d]) after the cached tokens; the last position's logits."""
        decoder = self._decoder
        length = inputs.shape[1]
        total = self.position + length
        if total > self.capacity:
            self._grow(total + _ROOM)
        binding = self._binding
        # onnxruntime reads bound numpy inputs where they lie without holding them: keep them alive until the run.
        feeds = {
            decoder.primary_input: np.ascontiguousarray(inputs),
            "position_ids": np.arange(self.position, total, dtype=np.int64)[None, :],
            "past_sequence_length": np.array(self.position, dtype=np.int64),
        }
        for name, value in feeds.items():
            binding.bind_cpu_input(name, value)
        if not self._outputs or self._outputs[0].shape[1] != length:
            self._bind_outputs(length)
        decoder.session.run_with_iobinding(binding)
        for buffer, new in zip(self._buffers, self._outputs[1:]):
            buffer[:, :, self.position : total] = new
        self.position = total
        return self._outputs[0][0, -1].copy()  # the array is the next step's output

    def _bind_outputs(self, length: int) -> None:
        decoder = self._decoder
        outputs = [np.empty((1, length, decoder.vocab_size), dtype=np.float32)]
        outputs += [np.empty((1, layer.heads, length, layer.head_dim), dtype=layer.dtype) for layer in decoder._layers]
        names = ["logits"] + [layer.new for layer in decoder._layers]
        for name, array in zip(names, outputs):
            self._binding.bind_output(name, "cpu", 0, array.dtype, list(array.shape), array.ctypes.data)
        self._outputs = outputs

    def _grow(self, capacity: int) -> None:
        """New buffers of `capacity` positions holding the cached ones, bound as the graph's past."""
        decoder = self._decoder
        buffers = []
        for index, layer in enumerate(decoder._layers):
            buffer = np.zeros((1, layer.heads, capacity, layer.head_dim), dtype=layer.dtype)
            if self._buffers:
                buffer[:, :, : self.position] = self._buffers[index][:, :, : self.position]
            buffers.append(buffer)
        binding = decoder.session.io_binding()
        for layer, buffer in zip(decoder._layers, buffers):
            binding.bind_ortvalue_input(layer.past, ort.OrtValue.ortvalue_from_numpy(buffer))
        self._buffers, self._binding, self.capacity = buffers, binding, capacity
        self._outputs = []  # bound afresh on the new binding


@dataclass(frozen=True)
class GenerationParams:
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: Optional[int] = None
    # each token's entropy asked for: generate computes them anyway, where the logits are; an engine for which
    # they cost the vocabulary's logits per token (trtllm) fetches those only when asked
    entropies: bool = False


@dataclass
class GenerationStep:
    """What one response carries: the text that became final plus the tokens generated since the last one."""

    text: str
    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    normalized_entropy: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    finish_reason: str = ""  # set on the last step: eos | length | stop | cancelled


class ContextOverflowError(ValueError):
    pass


def splice_image_features(
    ids: np.ndarray, embeddings: np.ndarray, features: np.ndarray, image_token_id: int
) -> np.ndarray:
    """LLaVA-style prompt: replace the k-th image token's embedding [d] by the k-th image's features [n, d]."""
    positions = np.flatnonzero(ids == image_token_id)
    if len(positions) != len(features):
        raise ValueError(f"prompt has {len(positions)} image tokens for {len(features)} images")
    parts, start = [], 0
    for position, image_features in zip(positions, features):
        parts += [embeddings[start:position], image_features]
        start = position + 1
    parts.append(embeddings[start:])
    return np.concatenate(parts, axis=0)


class SequenceProgress:
    """One generation's bookkeeping from token to token: its budget (max_tokens clipped to what the context
    leaves), end-of-sequence ids, stop strings, the text released so far and its sampling generator. What
    `generate` and the in-flight batcher (inflight_batching.py) share, so both stream the same steps."""

    def __init__(
        self,
        params: GenerationParams,
        prompt_length: int,
        max_context: int,
        decode: Callable[[Sequence[int]], str],
        eos_token_ids: Sequence[int],
    ):
        if prompt_length >= max_context:
            raise ContextOverflowError(f"prompt has {prompt_length} tokens; the model's context is {max_context} tokens")
        self.params = params
        self.prompt_length = prompt_length
        self.budget = min(params.max_tokens, max_context - prompt_length)
        self.rng = np.random.default_rng(params.seed)
        self._stream = TextStream(decode, params.stop)
        self._eos = set(eos_token_ids)
        self.produced = 0

    def uniform(self) -> float:
        """The draw a sampled token takes from this generation's generator (none for greedy decoding)."""
        return self.rng.random() if self.params.temperature > 0 else 0.0

    def after(self, choice: TokenChoice) -> GenerationStep:
        """The step a chosen token makes; its finish_reason is set when the generation ends with it."""
        self.produced += 1
        step = GenerationStep(
            text="",
            token_ids=[choice.token_id],
            log_probs=[choice.log_prob],
            normalized_entropy=[choice.normalized_entropy],
            completion_tokens=self.produced,
        )
        if choice.token_id in self._eos:
            step.text, step.finish_reason = self._stream.finish(), "eos"
        else:
            step.text = self._stream.push(choice.token_id)
            if self._stream.stopped:
                step.finish_reason = "stop"
            elif self.produced == self.budget:
                step.text += self._stream.finish()
                step.finish_reason = "length"
        return step

    def cancelled(self) -> GenerationStep:
        return GenerationStep(self._stream.finish(), completion_tokens=self.produced, finish_reason="cancelled")

    def exhausted(self) -> GenerationStep:
        """The only step of a generation allowed no tokens (max_tokens 0)."""
        return GenerationStep(self._stream.finish(), finish_reason="length")


def generate(
    decoder: KVCacheDecoder,
    prompt: np.ndarray,
    params: GenerationParams,
    decode: Callable[[Sequence[int]], str],
    eos_token_ids: Sequence[int],
    max_context: int,
    embed: Optional[Callable[[np.ndarray], np.ndarray]] = None,
    is_cancelled: Callable[[], bool] = lambda: False,
) -> Iterator[GenerationStep]:
    """Yield one step per generated token; the last step has `finish_reason` set.

    `prompt` is what the decoder's primary input takes: ids [1, n], or embeddings [1, n, d] for a decoder that
    takes embeddings (then `embed` turns each new token id into its embedding).
    """
    progress = SequenceProgress(params, prompt.shape[1], max_context, decode, eos_token_ids)
    if progress.budget == 0:
        yield progress.exhausted()
        return
    sequence = decoder.sequence()
    logits = sequence.step(prompt)
    while True:
        if is_cancelled():
            yield progress.cancelled()
            return
        step = progress.after(choose_token(logits, params.temperature, params.top_p, progress.rng))
        yield step
        if step.finish_reason:
            return
        next_input = np.array([step.token_ids], dtype=np.int64)
        if embed is not None:
            next_input = embed(next_input)
        logits = sequence.step(next_input)
