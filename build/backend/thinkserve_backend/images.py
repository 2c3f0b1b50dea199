"""Encoded image bytes -> normalised pixel arrays, the way each vision encoder family was trained."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass

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


def decode_image(data: bytes) -> Image.Image:
    """Decode PNG/JPEG/... bytes into RGB, with an error that says what was wrong."""
    if not data:
        raise ImageDecodeError("empty image")
    try:
        image = Image.open(io.BytesIO(data))
        if image.width * image.height > MAX_PIXELS:
            raise ImageDecodeError(f"image of {image.width}x{image.height} pixels exceeds the {MAX_PIXELS} pixel limit")
        return image.convert("RGB")
    except ImageDecodeError:
        raise
    except Exception as error:  # PIL raises several unrelated types for corrupt data
        raise ImageDecodeError(f"cannot decode image ({len(data)} bytes): {error}") from None


def preprocess(image: Image.Image, spec: ImagePreprocessing) -> np.ndarray:
    """RGB image -> float32 [3, height, width], rescaled to [0, 1] then normalised with mean/std."""
    if spec.mode == "crop":
        scale = max(spec.height / image.height, spec.width / image.width)
        resized = image.resize(
            (max(spec.width, round(image.width * scale)), max(spec.height, round(image.height * scale))),
            Image.BICUBIC,
        )
        left = (resized.width - spec.width) // 2
        top = (resized.height - spec.height) // 2
        image = resized.crop((left, top, left + spec.width, top + spec.height))
    else:
        image = image.resize((spec.width, spec.height), Image.BICUBIC)
    pixels = np.asarray(image, dtype=np.float32) / 255.0
    pixels = (pixels - np.asarray(spec.mean, dtype=np.float32)) / np.asarray(spec.std, dtype=np.float32)
    return np.ascontiguousarray(pixels.transpose(2, 0, 1))
