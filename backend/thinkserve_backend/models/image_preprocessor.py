"""Preprocessing step of the page-image encoder ensembles: encoded images in, resized uint8 pixels out.

Decoding and resizing stay on the CPU (PIL); the tower normalises on its own device (torch_modules.VisionTower),
so the tensor between the steps is a quarter of float32's size: 150,528 bytes an image at 224 pixels, not 602,112.
"""

from __future__ import annotations

import numpy as np
import triton_python_backend_utils as pb_utils

from ..images import ImagePreprocessing, rgb_pixels_of
from .common import error_response, input_array
from .parameters import ModelParameters


class ImagePreprocessorModel:
    def initialize(self, args):
        params = ModelParameters(args)
        self.spec = ImagePreprocessing.from_json(params.string("preprocessing"))

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                images = input_array(request, "image").reshape(-1)
                pixels = np.stack([rgb_pixels_of(bytes(data), self.spec) for data in images])
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("pixels", pixels)]))
            except Exception as error:
                responses.append(error_response(f"image preprocessing: {error}", error))
        return responses
