"""The `ocr` contract: an encoded image in, its text lines out (text, corners, confidence) in reading order.

The image work (decoding, resizing, the detector's post-processing, line crops, CTC decoding) is
thinkserve_backend.ocr, run here; the three networks are models of their own (ocr_detect, ocr_classify,
ocr_recognize) called through BLS, so Triton's dynamic batcher merges the crops of every page in flight and each
network runs where its target put it (onnxruntime in a python model, or the native onnxruntime backend with
TensorRT on a GPU). The requests of one `execute` are read concurrently: while one page waits on the detector,
another's crops are recognised.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import triton_python_backend_utils as pb_utils

from ..ocr import Networks, OcrSettings, alphabet_of, as_arrays, decode_image, read_image
from .common import bytes_tensor, error_response, input_array
from .parameters import ModelParameters


class OcrPipelineModel:
    def initialize(self, args):
        params = ModelParameters(args)
        self.model_name = params.model_name
        reading = params.json("reading")
        self.settings = OcrSettings(**{k: tuple(v) if isinstance(v, list) else v for k, v in reading.items()})
        self.alphabet = alphabet_of(json.loads(params.file("alphabet_file").read_text(encoding="utf-8")))
        self.detector = params.string("detector_model")
        self.classifier = params.string("classifier_model")
        self.recognizer = params.string("recognizer_model")
        self.networks = Networks(self._detect, self._classify, self._recognize, params.integer("network_batch"))

    async def execute(self, requests):
        results = await asyncio.gather(*(self._read(request) for request in requests), return_exceptions=True)
        responses = []
        for result in results:
            if isinstance(result, BaseException):
                responses.append(error_response(f"{self.model_name}: {result}", result))
            else:
                responses.append(result)
        return responses

    async def _read(self, request) -> "pb_utils.InferenceResponse":
        data = input_array(request, "image")
        if data is None or data.size != 1:
            raise ValueError("input image must hold exactly one encoded image per request")
        image = decode_image(bytes(data.reshape(-1)[0]), self.settings.max_image_pixels, self.settings.max_side)
        lines = await read_image(image, self.networks, self.alphabet, self.settings)
        texts, boxes, confidence = as_arrays(lines, image.shape[1], image.shape[0])
        return pb_utils.InferenceResponse([
            bytes_tensor("text", texts, (1, len(texts))),
            pb_utils.Tensor("boxes", boxes[None]),
            pb_utils.Tensor("confidence", confidence[None]),
        ])

    async def _call(self, model: str, batch: np.ndarray, outputs: list[str]) -> list[np.ndarray]:
        request = pb_utils.InferenceRequest(
            model_name=model, requested_output_names=outputs, inputs=[pb_utils.Tensor("image", np.ascontiguousarray(batch))],
            # the post-processing runs here on the CPU: a network on a GPU hands its outputs over in host memory
            preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0),
        )
        response = await request.async_exec()
        if response.has_error():
            raise RuntimeError(f"{model}: {response.error().message()}")
        return [pb_utils.get_output_tensor_by_name(response, name).as_numpy() for name in outputs]

    async def _detect(self, batch: np.ndarray) -> np.ndarray:
        return (await self._call(self.detector, batch, ["probability"]))[0]

    async def _classify(self, batch: np.ndarray) -> np.ndarray:
        return (await self._call(self.classifier, batch, ["probabilities"]))[0]

    async def _recognize(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        classes, probabilities, space = await self._call(self.recognizer, batch, ["classes", "probabilities", "space_probability"])
        return classes, probabilities, space

