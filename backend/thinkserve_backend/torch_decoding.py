"""The KV-cache decoder of the `torch` target: the interface decoding.generate drives, run by PyTorch.

Same contract as decoding.KVCacheDecoder (sequence().step, prefill_logits), so generation, sampling, stop
strings and cancellation are one code path for both targets. The cache is preallocated at the model's
context length (transformers' StaticCache): each step writes its keys and values in place instead of
concatenating a grown copy. Every generation thread keeps its own cache and reuses it (reset, not
reallocated) for its next request; a served model runs a fixed pool of such threads.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from .torch_modules import GeneratorModules


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
        last position [vocab] (float32) and the cache, grown in place."""
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
        return logits[0].float().cpu().numpy(), cache

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

    def step(self, inputs: np.ndarray) -> np.ndarray:
        """Run `inputs` (ids [1, n] or embeddings [1, n, d]) after the cached tokens; the last position's logits."""
        logits, _ = self._decoder.forward(inputs, self._cache, self.position)
        self.position += inputs.shape[1]
        return logits
