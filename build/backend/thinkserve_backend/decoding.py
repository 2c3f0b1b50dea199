"""Autoregressive generation over an ONNX decoder with an explicit KV cache (LLM and VLM alike).

The decoder graph (exported by thinkserve_build) takes `input_ids` or `inputs_embeds`, `attention_mask`,
`position_ids` and flat `past_key_values.{i}.{key,value}`, and returns `logits` and `present.{i}.{key,value}`.
A zero-length past makes the same graph do the prefill.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional, Sequence

import numpy as np

from .sampling import choose_token
from .text_stream import TextStream

PAST_PREFIX = "past_key_values."
PRESENT_PREFIX = "present."

_ORT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


class KVCacheDecoder:
    """One decoder graph; holds no per-request state, so concurrent generations can share it."""

    def __init__(self, session):
        self.session = session
        names = [i.name for i in session.get_inputs()]
        self.takes_embeddings = "inputs_embeds" in names
        self.primary_input = "inputs_embeds" if self.takes_embeddings else "input_ids"
        if self.primary_input not in names:
            raise ValueError(f"decoder graph has neither input_ids nor inputs_embeds (inputs: {names})")
        self._past = [i for i in session.get_inputs() if i.name.startswith(PAST_PREFIX)]
        if not self._past:
            raise ValueError("decoder graph has no past_key_values.* inputs: it was exported without a KV cache")
        self._present = [PRESENT_PREFIX + i.name[len(PAST_PREFIX) :] for i in self._past]
        self.vocab_size = session.get_outputs()[0].shape[-1]

    def empty_cache(self, batch: int = 1) -> dict[str, np.ndarray]:
        cache = {}
        for spec in self._past:
            _, heads, _, head_dim = spec.shape
            cache[spec.name] = np.zeros((batch, heads, 0, head_dim), dtype=_ORT_TYPES.get(spec.type, np.float32))
        return cache

    def prefill_logits(self, inputs: np.ndarray) -> np.ndarray:
        """Next-token logits [b, vocab] after each of `b` prompts of one length (ids [b, n] or embeddings
        [b, n, d]), in one run: equal lengths need no padding, so every row is exact."""
        batch, length = inputs.shape[:2]
        feeds = {
            self.primary_input: inputs,
            "attention_mask": np.ones((batch, length), dtype=np.int64),
            "position_ids": np.tile(np.arange(length, dtype=np.int64), (batch, 1)),
            **self.empty_cache(batch),
        }
        return self.session.run(["logits"], feeds)[0][:, -1]

    def forward(self, inputs: np.ndarray, cache: dict[str, np.ndarray], position: int):
        """Run `inputs` (ids [1, n] or embeddings [1, n, d]) after `position` cached tokens.

        Returns the logits of the last position and the grown cache.
        """
        length = inputs.shape[1]
        total = position + length
        feeds = {
            self.primary_input: inputs,
            "attention_mask": np.ones((1, total), dtype=np.int64),
            "position_ids": np.arange(position, total, dtype=np.int64)[None, :],
            **cache,
        }
        outputs = self.session.run(["logits", *self._present], feeds)
        new_cache = {spec.name: value for spec, value in zip(self._past, outputs[1:])}
        return outputs[0][0, -1], new_cache


@dataclass(frozen=True)
class GenerationParams:
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: Optional[int] = None


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
    prompt_length = prompt.shape[1]
    if prompt_length >= max_context:
        raise ContextOverflowError(f"prompt has {prompt_length} tokens; the model's context is {max_context} tokens")
    budget = min(params.max_tokens, max_context - prompt_length)
    rng = np.random.default_rng(params.seed)
    stream = TextStream(decode, params.stop)
    eos = set(eos_token_ids)
    cache = decoder.empty_cache()
    logits, cache = decoder.forward(prompt, cache, 0)
    position = prompt_length
    for produced in range(1, budget + 1):
        if is_cancelled():
            yield GenerationStep(stream.finish(), completion_tokens=produced - 1, finish_reason="cancelled")
            return
        choice = choose_token(logits, params.temperature, params.top_p, rng)
        step = GenerationStep(
            text="",
            token_ids=[choice.token_id],
            log_probs=[choice.log_prob],
            normalized_entropy=[choice.normalized_entropy],
            completion_tokens=produced,
        )
        if choice.token_id in eos:
            step.text, step.finish_reason = stream.finish(), "eos"
        else:
            step.text = stream.push(choice.token_id)
            if stream.stopped:
                step.finish_reason = "stop"
            elif produced == budget:
                step.text += stream.finish()
                step.finish_reason = "length"
        yield step
        if step.finish_reason:
            return
        next_input = np.array([[choice.token_id]], dtype=np.int64)
        if embed is not None:
            next_input = embed(next_input)
        logits, cache = decoder.forward(next_input, cache, position)
        position += 1
    # budget == 0: nothing may be generated
    yield GenerationStep(stream.finish(), finish_reason="length")
