"""A classifier read off the LLM: the question in the `prompt` parameter, one prefill, and each label's share
of the next-token probability (AutoThinkRAG's small-LM router, served as the ROUTER contract: text ->
probabilities). No classification head is trained; the LLM's own files are served (hard links).

Questions of one length in an `execute` share one prefill, without padding, so every row is exact.
"""

from __future__ import annotations

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from ..relevance import first_token_ids, group_by_length, label_probabilities, spellings
from .common import error_response, input_strings, responses_by_request, served_generator, whole_text_tokenizer
from .parameters import ModelParameters


class PromptClassifierModel:
    def initialize(self, args):
        params = ModelParameters(args)
        self.model_name = params.model_name
        self.tokenizer = whole_text_tokenizer(params.file("tokenizer_file"))
        self.decoder = self.load_decoder(params, args)
        self.prompt = params.string("prompt")  # in the LLM's chat format, rendered by the build; {question} inside
        self.output = params.string("output_name", "probabilities")
        self.max_question_tokens = params.integer("max_question_tokens", 256)

        def encode(text: str) -> list[int]:
            return self.tokenizer.encode(text, add_special_tokens=False).ids

        self.encode = encode
        self.label_ids = [first_token_ids(encode, spellings(label)) for label in json.loads(params.string("labels"))]
        if not all(self.label_ids):
            raise ValueError(f"model {self.model_name}: the tokenizer cannot encode every label")
        firsts = [ids[0] for ids in self.label_ids]
        if len(set(firsts)) < len(firsts):
            raise ValueError(f"model {self.model_name}: two labels start with the same token; their probabilities cannot be told apart")

    def load_decoder(self, params: ModelParameters, args: dict):
        """What gives next-token logits (prefill_logits): the LLM in the runtime the target chose."""
        return served_generator(params, args, vision=False).decoder

    def execute(self, requests):
        prompts, owners, failed = [], [], {}
        for number, request in enumerate(requests):
            try:
                for question in input_strings(request, "text"):
                    prompts.append(self._prompt_ids(question))
                    owners.append(number)
            except Exception as error:
                failed[number] = error
        probabilities = np.zeros((len(prompts), len(self.label_ids)), dtype=np.float32)
        try:
            for _, rows in group_by_length([len(ids) for ids in prompts]).items():
                logits = self.decoder.prefill_logits(np.stack([prompts[row] for row in rows]))
                probabilities[rows] = label_probabilities(logits, self.label_ids)
        except Exception as error:
            return [error_response(f"{self.model_name}: {error}", error) for _ in requests]
        return responses_by_request(
            self.model_name, len(requests), owners, failed, lambda rows: pb_utils.Tensor(self.output, probabilities[rows])
        )

    def _prompt_ids(self, question: str) -> np.ndarray:
        """The prompt's token ids; a question longer than max_question_tokens keeps its first tokens."""
        ids = self.encode(question)
        if len(ids) > self.max_question_tokens:
            question = self.tokenizer.decode(ids[: self.max_question_tokens])
        return np.array(self.encode(self.prompt.replace("{question}", question)), dtype=np.int64)
