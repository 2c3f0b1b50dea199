"""Page-image towers take uint8 pixels and normalise them on their device: the same embeddings as the float pixels
the preprocess step used to send, on the CPU in fp32 and at the GPU's bf16."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import CLIPConfig, CLIPModel

from thinkserve_backend.images import ImagePreprocessing, normalise
from thinkserve_backend.torch_modules import NetworkKind, PixelNormalisation, pooled

CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
SIZE = 32


def tiny_clip() -> CLIPModel:
    torch.manual_seed(0)
    layers = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    text = dict(vocab_size=100, max_position_embeddings=16, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    config = CLIPConfig(text_config=dict(**text, **layers),
                        vision_config=dict(image_size=SIZE, patch_size=16, **layers), projection_dim=32)
    return CLIPModel(config).eval()


def uint8_pixels(rows: int = 3, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(rows, 3, SIZE, SIZE), dtype=np.uint8)


def float_pixels(pixels: np.ndarray, mean, std) -> np.ndarray:
    """What the preprocess step sent before: HWC float32 / 255, minus mean, over std, channels first."""
    hwc = pixels.transpose(0, 2, 3, 1).astype(np.float32) / 255.0
    hwc = (hwc - np.asarray(mean, dtype=np.float32)) / np.asarray(std, dtype=np.float32)
    return np.ascontiguousarray(hwc.transpose(0, 3, 1, 2))


def float_path(model: CLIPModel, pixels: np.ndarray, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Today's float path: normalised float32 pixels, cast to the model's dtype as the runner did, into the tower."""
    values = torch.from_numpy(pixels).to(dtype)
    return torch.nn.functional.normalize(pooled(model.get_image_features(pixel_values=values)), dim=-1)


@pytest.mark.parametrize("mean, std", [(CLIP_MEAN, CLIP_STD), ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))])
def test_normalising_uint8_pixels_on_the_device_gives_the_float_pixels_bit_for_bit(mean, std):
    pixels = uint8_pixels()
    expected = float_pixels(pixels, mean, std)
    on_device = PixelNormalisation(mean, std)(torch.from_numpy(pixels))
    assert on_device.dtype == torch.float32
    assert np.array_equal(on_device.numpy(), expected)
    # and the numpy twin (the VLM's path) computes the same
    spec = ImagePreprocessing(SIZE, SIZE, mean, std)
    assert np.array_equal(np.stack([normalise(p, spec) for p in pixels]), expected)


def test_the_vision_tower_takes_uint8_and_embeds_as_the_float_path_did():
    model = tiny_clip()
    kind = NetworkKind("vision_tower", mean=CLIP_MEAN, std=CLIP_STD)
    tower = kind.wrap(model).eval()
    pixels = uint8_pixels()
    with torch.no_grad():
        served = tower(torch.from_numpy(pixels))
        expected = float_path(model, float_pixels(pixels, CLIP_MEAN, CLIP_STD))
        unnormalised = float_path(model, pixels.astype(np.float32))
    assert served.shape == (3, 32) and torch.equal(served, expected)
    assert (served - unnormalised).abs().max() > 1e-2  # the normalisation does matter to the embedding


def test_in_bf16_the_tower_sees_the_float_paths_bf16_pixels():
    """On a GPU the tower runs in bf16: normalised in float32 first, then cast, as the runner cast float pixels."""
    model = tiny_clip().to(torch.bfloat16)
    tower = NetworkKind("vision_tower", mean=CLIP_MEAN, std=CLIP_STD).wrap(model).eval()
    pixels = uint8_pixels(seed=2)
    with torch.no_grad():
        served = tower(torch.from_numpy(pixels))
        expected = float_path(model, float_pixels(pixels, CLIP_MEAN, CLIP_STD), torch.bfloat16)
    assert served.dtype == torch.bfloat16 and torch.equal(served, expected)


def test_a_vision_towers_normalisation_travels_in_its_facts():
    kind = NetworkKind("vision_tower", mean=CLIP_MEAN, std=CLIP_STD)
    assert NetworkKind.from_facts(kind.to_facts()) == kind
    assert NetworkKind.from_facts(NetworkKind("text_tower", use_mask=False).to_facts()) == NetworkKind("text_tower", False)
    with pytest.raises(ValueError, match="mean and std"):  # a repository built when towers took float pixels
        NetworkKind.from_facts({"name": "vision_tower", "use_mask": True}).wrap(tiny_clip())
