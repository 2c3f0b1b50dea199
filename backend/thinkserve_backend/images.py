"""Encoded image bytes -> resized uint8 pixels, and those normalised, the way each vision encoder family was trained."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Optional

import numpy as np
from PIL import Image

# Refuse images that would decode to more pixels than this (a decompression bomb or a mistake).
MAX_PIXELS = 64_000_000


class ImageDecodeError(ValueError):
    pass


@dataclass(frozen=True)
class ImagePreprocessing:
    """Resize policy and normalisation of one vision encoder (read from its image-processor config)."""

    height: int
    width: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    # "crop": resize the shortest edge to the target then centre-crop (CLIP);
    # "resize": resize straight to height x width (SigLIP).
    mode: str = "resize"

    @classmethod
    def from_json(cls, text: str) -> "ImagePreprocessing":
        spec = json.loads(text)
        return cls(
            height=int(spec["height"]),
            width=int(spec["width"]),
            mean=tuple(spec["mean"]),
            std=tuple(spec["std"]),
            mode=spec.get("mode", "resize"),
        )

    def to_json(self) -> str:
        return json.dumps(
            {"height": self.height, "width": self.width, "mean": self.mean, "std": self.std, "mode": self.mode}
        )


def decode_image(data: bytes, at_least: Optional[tuple[int, int]] = None) -> Image.Image:
    """Decode PNG/JPEG/... bytes into RGB, with an error that says what was wrong. With `at_least` (width,
    height), a JPEG is decoded at the smallest of its DCT scales (1/2, 1/4, 1/8) still at least that large: an
    encoder that downscales anyway need not decode every pixel (a 100-dpi page for a 96-pixel encoder: 2.3 ms
    instead of 14 ms; for 384 pixels 15 ms instead of 26). The pixels differ a little from a full decode's (the
    DCT scale averages blocks before the bicubic resize): on 18 dev PDF pages by 0.056 on average on the
    normalised [-1, 1] scale at 96 pixels, 0.016 at 224 and 0.026 at 384."""
    if not data:
        raise ImageDecodeError("empty image")
    try:
        image = Image.open(io.BytesIO(data))
        if image.width * image.height > MAX_PIXELS:
            raise ImageDecodeError(f"image of {image.width}x{image.height} pixels exceeds the {MAX_PIXELS} pixel limit")
        if at_least is not None:
            image.draft("RGB", at_least)  # a no-op for formats other than JPEG
        return image.convert("RGB")
    except ImageDecodeError:
        raise
    except Exception as error:  # PIL raises several unrelated types for corrupt data
        raise ImageDecodeError(f"cannot decode image ({len(data)} bytes): {error}") from None


def resized(image: Image.Image, spec: ImagePreprocessing) -> np.ndarray:
    """RGB image -> uint8 [3, height, width], resized (or resized and centre-cropped) as the encoder was trained.
    What a page-image ensemble sends to its tower: a quarter of float32's bytes; the tower normalises on its own
    device (torch_modules.PixelNormalisation)."""
    if spec.mode == "crop":
        scale = max(spec.height / image.height, spec.width / image.width)
        scaled = image.resize(
            (max(spec.width, round(image.width * scale)), max(spec.height, round(image.height * scale))),
            Image.BICUBIC,
        )
        left = (scaled.width - spec.width) // 2
        top = (scaled.height - spec.height) // 2
        image = scaled.crop((left, top, left + spec.width, top + spec.height))
    else:
        image = image.resize((spec.width, spec.height), Image.BICUBIC)
    return np.ascontiguousarray(np.asarray(image, dtype=np.uint8).transpose(2, 0, 1))


def normalise(pixels: np.ndarray, spec: ImagePreprocessing) -> np.ndarray:
    """uint8 [3, height, width] -> float32, rescaled to [0, 1] then normalised with mean/std (channels first)."""
    mean = np.asarray(spec.mean, dtype=np.float32).reshape(3, 1, 1)
    std = np.asarray(spec.std, dtype=np.float32).reshape(3, 1, 1)
    return (pixels.astype(np.float32) / np.float32(255.0) - mean) / std


def preprocess(image: Image.Image, spec: ImagePreprocessing) -> np.ndarray:
    """RGB image -> float32 [3, height, width], rescaled to [0, 1] then normalised with mean/std."""
    return normalise(resized(image, spec), spec)


def rgb_pixels_of(data: bytes, spec: ImagePreprocessing) -> np.ndarray:
    """Encoded image bytes -> the encoder's resized uint8 pixels [3, height, width], not yet normalised."""
    return resized(decode_image(data, (spec.width, spec.height)), spec)


def pixels_of(data: bytes, spec: ImagePreprocessing) -> np.ndarray:
    """Encoded image bytes -> the encoder's normalised pixels [3, height, width] (what a VLM's vision tower reads)."""
    return normalise(rgb_pixels_of(data, spec), spec)


def place_images(text: str, images: int, image_token: str) -> str:
    """A VLM prompt with one placeholder per image: prepended when the text has none."""
    placeholders = text.count(image_token)
    if images and placeholders == 0:
        return image_token * images + "\n" + text
    if placeholders != images:
        raise ValueError(f"prompt has {placeholders} {image_token} placeholders but {images} images")
    return text
