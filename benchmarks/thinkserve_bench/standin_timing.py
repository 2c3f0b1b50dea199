"""Realistic-size stand-ins of the deployed models, timed in PyTorch: the cost model where engines cannot be built.

Each stand-in has the published architecture of the checkpoint the `hf` build profile serves for that role
(thinkserve_build.profiles.hf), built from its transformers config class with random weights: compute per
call is that of the real model, the answers are noise. They run eagerly in PyTorch (SDPA attention, bf16 on
a GPU, fp32 on a CPU), not as the TensorRT / ONNX Runtime engines Triton would serve, so their times are an
upper bound of what a tuned engine takes; reports label them as stand-ins.

`preset="test"` builds the same classes with toy dimensions, so the whole path runs in the test suite. The
tables are the compiler's (thinkserve_build.standins), which builds the same models into a repository.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Optional

from thinkserve_build.standins import image_positions, standins

from .call_shapes import ENCODER, GENERATOR, IMAGE_ENCODER, PREFILL, RELEVANCE, CallShape, call_kind

class TorchTimer:
    """Builds each role's stand-in once (on first use) and times calls of a shape: median of `repeats` after a
    warm-up call. Generated tokens are timed as `decode_probe` decoding steps, scaled to the count asked."""

    def __init__(self, preset: str = "hf", device: str = "auto", repeats: int = 3, decode_probe: int = 8,
                 progress: Callable[[str], None] = lambda _: None):
        import torch

        self.torch = torch
        self.standins = standins(preset)
        self.device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
        self.dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        self.repeats, self.decode_probe = repeats, decode_probe
        self.progress = progress
        self.preset = preset
        self._built: dict[str, Any] = {}
        self._cache: dict[CallShape, float] = {}
        self.parameters: dict[str, int] = {}

    # ------------------------------------------------------------------ building

    def _build(self, role: str):
        if role in self._built:
            return self._built[role]
        import transformers

        torch, spec = self.torch, self.standins[role]
        self.progress(f"building the {role} stand-in ({spec.mirrors} dimensions, random weights)")
        torch.manual_seed(0)
        config = getattr(transformers, spec.config_class)(**spec.config)
        with torch.device(self.device):
            model = _instantiate(getattr(transformers, spec.model_class), config)
            parts = {"model": model.to(self.dtype).eval()}
            if spec.vision:
                vision = _instantiate(transformers.SiglipVisionModel, transformers.SiglipVisionConfig(**spec.vision))
                width = config.hidden_size
                projector = torch.nn.Sequential(torch.nn.Linear(spec.vision["hidden_size"], width), torch.nn.GELU(),
                                                torch.nn.Linear(width, width))
                parts.update(vision=vision.to(self.dtype).eval(), projector=projector.to(self.dtype).eval())
        self.parameters[role] = sum(p.numel() for part in parts.values() for p in part.parameters())
        self._built[role] = parts
        return parts

    def release(self, role: str) -> None:
        """Free a stand-in's memory once its shapes are timed."""
        self._built.pop(role, None)
        if self.device.startswith("cuda"):
            self.torch.cuda.empty_cache()

    # ------------------------------------------------------------------ timing

    def __call__(self, shape: CallShape) -> float:
        if shape not in self._cache:
            run = self._runner(shape)
            run()  # warm-up: kernels chosen, caches filled
            samples = []
            for _ in range(self.repeats):
                self._sync()
                start = time.perf_counter()
                extra = run()
                self._sync()
                samples.append(time.perf_counter() - start + (extra or 0.0))
            self._cache[shape] = statistics.median(samples)
        return self._cache[shape]

    def timings(self) -> list[dict]:
        return [{**shape.as_dict(), "seconds": seconds} for shape, seconds in sorted(self._cache.items())]

    def _sync(self) -> None:
        if self.device.startswith("cuda"):
            self.torch.cuda.synchronize()

    def _ids(self, batch: int, length: int, vocab: int):
        return self.torch.randint(3, vocab, (batch, max(1, length)), device=self.device)

    def _pixels(self, count: int, size: int):
        return self.torch.randn(count, 3, size, size, device=self.device, dtype=self.dtype)

    def _runner(self, shape: CallShape) -> Callable[[], Optional[float]]:
        torch, spec = self.torch, self.standins[shape.model]
        parts = self._build(shape.model)
        model = parts["model"]
        kind = call_kind(shape.model)
        if kind == IMAGE_ENCODER:
            pixels = self._pixels(shape.batch, spec.image_size)
            return lambda: _inference(torch, lambda: model(pixel_values=pixels))
        if kind == ENCODER:
            length = spec.max_length if spec.pad_to_max_length else min(shape.tokens, spec.max_length or shape.tokens)
            ids = self._ids(shape.batch, length, spec.config["vocab_size"])
            mask = torch.ones_like(ids)
            inputs = {"input_ids": ids} if spec.pad_to_max_length else {"input_ids": ids, "attention_mask": mask}
            return lambda: _inference(torch, lambda: model(**inputs))
        positions = image_positions(spec)
        pixels = self._pixels(shape.batch * shape.images, spec.image_size) if shape.images else None
        ids = self._ids(shape.batch, shape.tokens + spec.prefix_tokens, spec.config["vocab_size"])

        def prefill():
            embeds = model.get_input_embeddings()(ids)
            if pixels is not None:
                features = parts["projector"](parts["vision"](pixel_values=pixels).last_hidden_state)
                images = features.reshape(shape.batch, shape.images * positions, -1)
                embeds = torch.cat([images, embeds], dim=1)
            return model(inputs_embeds=embeds, use_cache=kind == GENERATOR, logits_to_keep=1)

        if kind in (RELEVANCE, PREFILL):
            return lambda: _inference(torch, prefill)
        probe = min(shape.new_tokens, self.decode_probe)

        def generate() -> float:
            with torch.inference_mode():
                out = prefill()
                past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
                self._sync()
                start = time.perf_counter()
                for _ in range(probe):
                    out = model(input_ids=token, past_key_values=past, use_cache=True)
                    past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
                self._sync()
                # the probe's steps stand for all generated tokens: add the steps not run
                return (time.perf_counter() - start) / probe * (shape.new_tokens - probe)

        return generate


def _inference(torch, fn) -> None:
    with torch.inference_mode():
        fn()


def _instantiate(cls, config):
    """Random weights with SDPA attention where the class has it (DeBERTa has not: eager)."""
    try:
        return cls._from_config(config, attn_implementation="sdpa")
    except (ValueError, ImportError):
        return cls._from_config(config, attn_implementation="eager")

