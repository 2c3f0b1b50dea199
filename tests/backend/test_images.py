"""Image bytes to encoder pixels: a JPEG is decoded at a reduced DCT scale when the encoder downscales anyway."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageDraw

from thinkserve_backend.images import ImagePreprocessing, decode_image, normalise, pixels_of, preprocess, rgb_pixels_of


def page(format: str, size=(1000, 1300)) -> bytes:
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    for y in range(40, size[1] - 40, 30):  # lines of "text" and a dark block, like a rendered page
        draw.rectangle((60, y, size[0] - 60, y + 8), fill=(40, 40, 40))
    draw.rectangle((100, 400, 500, 700), fill=(200, 30, 30))
    out = io.BytesIO()
    image.save(out, format=format, **({"quality": 85} if format == "JPEG" else {}))
    return out.getvalue()


def test_a_jpeg_is_decoded_at_the_smallest_dct_scale_still_large_enough():
    jpeg = page("JPEG")
    assert decode_image(jpeg).size == (1000, 1300)
    assert decode_image(jpeg, (96, 96)).size == (125, 163)  # 1/8: still at least 96 each way
    assert decode_image(jpeg, (384, 384)).size == (500, 650)  # 1/2: 1/4 would be 250 wide
    assert decode_image(page("PNG"), (96, 96)).size == (1000, 1300)  # other formats decode whole


def test_encoder_pixels_from_a_reduced_decode_stay_close_to_a_full_one():
    jpeg = page("JPEG")
    for mode in ("crop", "resize"):
        spec = ImagePreprocessing(96, 96, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), mode)
        fast, full = pixels_of(jpeg, spec), preprocess(decode_image(jpeg), spec)
        assert fast.shape == full.shape == (3, 96, 96)
        # on a [-1, 1] scale; these stripes are a stress case (18 dev PDF pages: 0.056 mean at 96 px, 0.016 at 224)
        assert np.abs(fast - full).mean() < 0.2


def test_the_preprocess_step_sends_uint8_pixels_that_normalise_to_the_float_ones():
    png = page("PNG", (300, 200))
    clip = ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))
    for mode in ("crop", "resize"):
        spec = ImagePreprocessing(96, 96, *clip, mode)
        sent = rgb_pixels_of(png, spec)
        assert sent.dtype == np.uint8 and sent.shape == (3, 96, 96) and sent.nbytes == 96 * 96 * 3
        floats = pixels_of(png, spec)
        assert floats.dtype == np.float32 and floats.nbytes == 4 * sent.nbytes
        assert np.array_equal(normalise(sent, spec), floats)
    # the float pixels are what the former preprocess made: PIL's resize, then HWC / 255, minus mean, over std
    resized = decode_image(png).resize((96, 96), Image.BICUBIC)
    former = (np.asarray(resized, dtype=np.float32) / 255.0 - np.asarray(clip[0], dtype=np.float32)) / np.asarray(clip[1], dtype=np.float32)
    assert np.array_equal(pixels_of(png, ImagePreprocessing(96, 96, *clip, "resize")), former.transpose(2, 0, 1))
