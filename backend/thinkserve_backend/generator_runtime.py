"""A generator as one runtime serves it: its decoder, and for a VLM its token embeddings and image features.

The served models (generator, relevance filter, LLM router) and the model compiler's parity checks build their
generators here, so the build checks exactly what Triton will run: onnxruntime sessions over the exported
graphs (the cpu target) or the checkpoint loaded into PyTorch (the torch target).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from .decoding import KVCacheDecoder


@dataclass
class GeneratorRuntime:
    runtime: str  # onnx | torch
    decoder: object  # decoding.KVCacheDecoder or torch_decoding.TorchKVCacheDecoder: what decoding.generate drives
    embed: Optional[Callable[[np.ndarray], np.ndarray]] = None  # VLM: ids [1, n] -> embeddings [1, n, d]
    image_features: Optional[Callable[[np.ndarray], np.ndarray]] = None  # VLM: pixels [n, 3, h, w] -> [n, t, d]


def onnx_generator(decoder_session, vision_session=None, embed_session=None) -> GeneratorRuntime:
    """Sessions over the exported decoder graph (and a VLM's vision tower and token embeddings)."""
    runtime = GeneratorRuntime("onnx", KVCacheDecoder(decoder_session))
    if vision_session is not None:
        runtime.image_features = lambda pixels: vision_session.run(["image_features"], {"pixel_values": pixels})[0]
        runtime.embed = lambda ids: embed_session.run(["inputs_embeds"], {"input_ids": ids})[0]
    return runtime


def torch_generator(folder: Path, vision: bool, max_context: int, device, dtype) -> GeneratorRuntime:
    """The checkpoint in `folder` loaded into PyTorch, its KV cache preallocated at `max_context`."""
    from .torch_decoding import TorchKVCacheDecoder
    from .torch_modules import load_generator

    decoder = TorchKVCacheDecoder(load_generator(folder, vision, device, dtype), max_context, device, dtype)
    if not vision:
        return GeneratorRuntime("torch", decoder)
    return GeneratorRuntime("torch", decoder, decoder.embed, decoder.image_features)
