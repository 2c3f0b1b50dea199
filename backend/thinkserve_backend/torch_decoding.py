"""The KV-cache decoder of the `torch` target: the interface decoding.generate drives, run by PyTorch.

Same contract as decoding.KVCacheDecoder (sequence().step, prefill_logits), so generation, sampling, stop
strings and cancellation are one code path for both targets. The cache is preallocated at the model's
context length (transformers' StaticCache): each step writes its keys and values in place instead of
concatenating a grown copy. Every generation thread keeps its own cache and reuses it (reset, not
reallocated) for its next request; a served model runs a fixed pool of such threads.

A step's logits stay where the model computed them (DeviceLogits): the token is chosen and its log-probability
and entropy taken there, and three numbers reach the host instead of the vocabulary's logits (4 bytes each, 0.6 MB
a token for Qwen's 151,936).
"""

from __future__ import annotations

import math
import threading

import numpy as np
import torch

from .sampling import TokenChoice
from .torch_modules import GeneratorModules

# The measures of one step that cross to the host: token id, its log-probability, the normalised entropy.
MEASURES_PER_TOKEN = 3


class DeviceLogits:
    """One step's logits [vocab] where the model left them. `choose_token` is sampling.choose_token's, computed on
    their device: the same token for the same generator state (one uniform drawn by inverse CDF), the same
    log-probability and entropy of the model's own distribution (temperature 1), in float64."""

    def __init__(self, logits: torch.Tensor):
        self.logits = logits
        self.host_bytes = 0  # what crossed to the host: the measures, never the logits

    @torch.inference_mode()
    def choose_token(self, temperature: float, top_p: float, rng: np.random.Generator) -> TokenChoice:
        logits = self.logits.double()
        log_probs = torch.log_softmax(logits, dim=-1)
        if temperature <= 0:
            token = torch.argmax(logits)
        else:
            token = self._sample(torch.softmax(logits / temperature, dim=-1), top_p, rng.random())
        entropy = -(log_probs.exp() * log_probs).sum() / math.log(logits.shape[-1])
        measures = torch.stack([token.double(), log_probs[token], entropy.clamp(0.0, 1.0)]).cpu().numpy()
        self.host_bytes += measures.nbytes
        return TokenChoice(int(measures[0]), float(measures[1]), float(measures[2]))

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """All the logits on the host (the build's checks against PyTorch read them; generation never does)."""
        logits = self.logits.cpu().numpy()
        self.host_bytes += logits.nbytes
        return logits if dtype is None else logits.astype(dtype)

    @staticmethod
    def _sample(probs: torch.Tensor, top_p: float, uniform: float) -> torch.Tensor:
        """sampling._sample on the device: the nucleus of the most likely tokens holding top_p of the mass (all of
        them at top_p 1), and the token the uniform falls on in its cumulative weights."""
        if top_p >= 1.0:
            order = None
            weights = probs
        else:
            weights, order = torch.sort(probs, descending=True, stable=True)
            keep = int(torch.searchsorted(torch.cumsum(weights, 0), torch.tensor(top_p, dtype=weights.dtype, device=weights.device))) + 1
            weights, order = weights[:keep], order[:keep]
        cdf = torch.cumsum(weights, 0)
        target = torch.tensor(uniform, dtype=cdf.dtype, device=cdf.device)
        index = torch.searchsorted(cdf / cdf[-1], target, right=True).clamp(max=len(weights) - 1)
        return index if order is None else order[index]


class TorchKVCacheDecoder:
    """One causal LM on one device; holds no per-request state beyond each thread's cache."""

    def __init__(self, modules: GeneratorModules, max_context: int, device: torch.device, dtype: torch.dtype):
        self.modules = modules
        self.max_context = max_context
        self.device, self.dtype = device, dtype
        self.takes_embeddings = modules.embeddings is not None
        self.vocab_size = int(modules.lm_head.out_features)
        self._caches = threading.local()

    def empty_cache(self, batch: int = 1):
        """This thread's preallocated cache, emptied. One generation per thread at a time (decoding.generate)."""
        from transformers import StaticCache

        if batch != 1:
            raise ValueError("a generation runs one sequence; batched prompts go through prefill_logits")
        cache = getattr(self._caches, "cache", None)
        if cache is None:
            cache = StaticCache(config=self.modules.text_config, max_cache_len=self.max_context)
            self._caches.cache = cache
        elif cache.is_initialized:
            with torch.inference_mode():  # its tensors were made under inference mode
                cache.reset()
        return cache

    def sequence(self) -> "TorchDecodeSequence":
        """A new request's KV cache (this thread's, emptied) and position."""
        return TorchDecodeSequence(self, self.empty_cache())

    def _primary(self, inputs: np.ndarray) -> dict[str, torch.Tensor]:
        tensor = torch.from_numpy(np.ascontiguousarray(inputs)).to(self.device)
        if self.takes_embeddings:
            return {"inputs_embeds": tensor.to(self.dtype)}
        return {"input_ids": tensor}

    @torch.inference_mode()
    def forward(self, inputs: np.ndarray, cache, position: int):
        """Run `inputs` (ids [1, n] or embeddings [1, n, d]) after `position` cached tokens: the logits of the
        last position [vocab] (float32, on the model's device) and the cache, grown in place."""
        length = inputs.shape[1]
        if position + length > self.max_context:
            raise ValueError(f"{position + length} positions exceed the preallocated context of {self.max_context}")
        positions = torch.arange(position, position + length, device=self.device)
        output = self.modules.backbone(
            **self._primary(inputs),
            position_ids=positions[None],
            cache_position=positions,
            past_key_values=cache,
            use_cache=True,
        )
        logits = self.modules.lm_head(output.last_hidden_state[:, -1])
        return logits[0].float(), cache

    @torch.inference_mode()
    def prefill_logits(self, inputs: np.ndarray) -> np.ndarray:
        """Next-token logits [b, vocab] after each of `b` prompts of one length, in one run without a cache."""
        batch, length = inputs.shape[:2]
        positions = torch.arange(length, device=self.device)[None].expand(batch, length)
        output = self.modules.backbone(**self._primary(inputs), position_ids=positions, use_cache=False)
        return self.modules.lm_head(output.last_hidden_state[:, -1]).float().cpu().numpy()

    @torch.inference_mode()
    def embed(self, ids: np.ndarray) -> np.ndarray:
        """A VLM's token embeddings [1, n, d] (float32), for splicing image features into the prompt."""
        return self.modules.embeddings(torch.from_numpy(ids).to(self.device)).float().cpu().numpy()

    @torch.inference_mode()
    def image_features(self, pixels: np.ndarray) -> np.ndarray:
        """A VLM's projected image features [n, tokens per image, d] (float32)."""
        tensor = torch.from_numpy(np.ascontiguousarray(pixels)).to(self.device, self.dtype)
        return self.modules.image_features(tensor).float().cpu().numpy()


class TorchDecodeSequence:
    """One request's place in its thread's preallocated cache: what decoding.generate steps through."""

    def __init__(self, decoder: TorchKVCacheDecoder, cache):
        self._decoder, self._cache = decoder, cache
        self.position = 0

    def step(self, inputs: np.ndarray) -> DeviceLogits:
        """Run `inputs` (ids [1, n] or embeddings [1, n, d]) after the cached tokens; the last position's logits,
        left on the model's device."""
        logits, _ = self._decoder.forward(inputs, self._cache, self.position)
        self.position += inputs.shape[1]
        return DeviceLogits(logits)
