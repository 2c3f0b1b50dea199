"""Tokenizer step of the encoder ensembles: strings in, ids / masks out (ragged: each request its own length)."""

from __future__ import annotations

import triton_python_backend_utils as pb_utils

from ..tokenization import encode, load_tokenizer
from .common import error_response, input_strings
from .parameters import ModelParameters

_OUTPUTS = ("input_ids", "attention_mask", "token_type_ids")


class TokenizerModel:
    def initialize(self, args):
        params = ModelParameters(args)
        self.max_length = params.integer("max_length")
        self.tokenizer = load_tokenizer(params.file("tokenizer_file"), self.max_length)
        self.pad_to_max_length = params.flag("pad_to_max_length")
        self.pad_id = params.integer("pad_id", 0)
        self.buckets = params.json("pad_to_buckets", [])  # widths a native backend's engine profiles expect
        self.pair = "text_pair" in params.input_names()
        self.outputs = [name for name in params.output_names() if name in _OUTPUTS]

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                pairs = input_strings(request, "text_pair") if self.pair else None
                arrays = encode(
                    self.tokenizer,
                    input_strings(request, "text"),
                    pairs,
                    self.pad_id,
                    self.max_length if self.pad_to_max_length else None,
                    self.buckets,
                )
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(n, arrays[n]) for n in self.outputs]))
            except Exception as error:
                responses.append(error_response(f"tokenizer: {error}", error))
        return responses
