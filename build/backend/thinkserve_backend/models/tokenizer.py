"""Tokenizer step of the encoder ensembles: strings in, ids / masks out (ragged: each request its own length)."""

from __future__ import annotations

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer

from .common import ModelParameters, error_response, input_strings

_OUTPUTS = ("input_ids", "attention_mask", "token_type_ids")


class TokenizerModel:
    def initialize(self, args):
        params = ModelParameters(args)
        self.tokenizer = Tokenizer.from_file(str(params.file("tokenizer_file")))
        self.max_length = params.integer("max_length")
        # Padding and truncation baked into a tokenizer.json (MiniLM's pads to 128) are replaced by ours.
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(self.max_length)
        self.pad_to_max_length = params.flag("pad_to_max_length")
        self.pad_id = params.integer("pad_id", 0)
        self.pair = "text_pair" in params.input_names()
        self.outputs = [name for name in params.output_names() if name in _OUTPUTS]

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(pb_utils.InferenceResponse(self._tokenize(request)))
            except Exception as error:
                responses.append(error_response(f"tokenizer: {error}"))
        return responses

    def _tokenize(self, request):
        texts = input_strings(request, "text")
        if self.pair:
            encodings = self.tokenizer.encode_batch(list(zip(texts, input_strings(request, "text_pair"))))
        else:
            encodings = self.tokenizer.encode_batch(texts)
        width = self.max_length if self.pad_to_max_length else max(len(e.ids) for e in encodings)
        arrays = {
            "input_ids": np.full((len(encodings), width), self.pad_id, dtype=np.int64),
            "attention_mask": np.zeros((len(encodings), width), dtype=np.int64),
            "token_type_ids": np.zeros((len(encodings), width), dtype=np.int64),
        }
        for row, encoding in enumerate(encodings):
            n = len(encoding.ids)
            arrays["input_ids"][row, :n] = encoding.ids
            arrays["attention_mask"][row, :n] = 1
            arrays["token_type_ids"][row, :n] = encoding.type_ids
        return [pb_utils.Tensor(name, arrays[name]) for name in self.outputs]
