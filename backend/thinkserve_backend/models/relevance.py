"""The VLM's page relevance filter (V-RAG) as a batchable model: (question, image) -> P(yes).

It serves the VLM's own files (vision tower, token embeddings, decoder; hard links in the repository). All
pairs of one `execute` share one vision-tower call, and pairs whose prompts have the same length (the pages
of one question always do) share one decoder prefill.
"""

from __future__ import annotations

import numpy as np
import triton_python_backend_utils as pb_utils

from ..decoding import splice_image_features
from ..images import ImagePreprocessing, pixels_of
from ..relevance import (
    NO_SPELLINGS,
    YES_SPELLINGS,
    first_token_ids,
    group_by_length,
    relevance_prompt,
    yes_probability,
)
from .common import (
    error_response,
    input_array,
    input_strings,
    responses_by_request,
    served_generator,
    whole_text_tokenizer,
)
from .parameters import ModelParameters


class ImageRelevanceModel:
    def initialize(self, args):
        params = ModelParameters(args)
        self.model_name = params.model_name
        self.tokenizer = whole_text_tokenizer(params.file("tokenizer_file"))
        self.load(params, args)
        self.preprocessing = ImagePreprocessing.from_json(params.string("preprocessing"))
        self.image_token = params.string("image_token")
        self.image_token_id = self.tokenizer.token_to_id(self.image_token)
        if self.image_token_id is None:
            raise ValueError(f"model {self.model_name}: image token {self.image_token!r} is not in the tokenizer")
        self.template = params.string("relevance_prompt")  # the VLM's chat format, rendered by the build
        self.max_context = params.integer("max_context")  # contracts.CONTEXT_PARAMETER
        self.image_tokens = params.integer("image_tokens_per_image")  # contracts.IMAGE_TOKENS_PARAMETER

        def encode(text: str) -> list[int]:
            return self.tokenizer.encode(text, add_special_tokens=False).ids

        self.encode = encode
        self.yes_ids = first_token_ids(encode, YES_SPELLINGS)
        self.no_ids = first_token_ids(encode, NO_SPELLINGS)
        if not self.yes_ids or not self.no_ids:
            raise ValueError(f"model {self.model_name}: the tokenizer cannot encode 'yes' and 'no'")
        overhead = len(encode(relevance_prompt(self.template, "", self.image_token))) + self.image_tokens
        self.max_question_tokens = self.max_context - overhead - 1
        if self.max_question_tokens < 8:
            raise ValueError(f"model {self.model_name}: a context of {self.max_context} tokens leaves no room for a question")

    def load(self, params: ModelParameters, args: dict) -> None:
        """What scores: the VLM in the runtime the target chose (a subclass serves another engine)."""
        self.runtime = served_generator(params, args, vision=True)

    def execute(self, requests):
        pairs, owners, failed = [], [], {}
        for number, request in enumerate(requests):
            try:
                questions = input_strings(request, "question")
                images = [bytes(v) for v in input_array(request, "image").reshape(-1)]
                if len(questions) != len(images):
                    raise ValueError(f"{len(questions)} questions for {len(images)} images")
                pixels = [pixels_of(image, self.preprocessing) for image in images]
            except Exception as error:
                failed[number] = error
                continue
            for question, pixel in zip(questions, pixels):
                pairs.append((self._prompt_ids(question), pixel))
                owners.append(number)
        scores = np.zeros(len(pairs), dtype=np.float32)
        if pairs:
            try:
                scores = self._score(pairs)
            except Exception as error:
                return [error_response(f"{self.model_name}: {error}", error) for _ in requests]
        return responses_by_request(
            self.model_name, len(requests), owners, failed, lambda rows: pb_utils.Tensor("relevance", scores[rows].reshape(-1, 1))
        )

    def _prompt_ids(self, question: str) -> np.ndarray:
        """The prompt's token ids; a question too long for the context keeps its first tokens."""
        question_ids = self.encode(question)
        if len(question_ids) > self.max_question_tokens:
            question = self.tokenizer.decode(question_ids[: self.max_question_tokens])
        return np.array(self.encode(relevance_prompt(self.template, question, self.image_token)), dtype=np.int64)

    def _score(self, pairs) -> np.ndarray:
        features = self.runtime.image_features(np.stack([pixel for _, pixel in pairs]))
        prompts = []
        for (ids, _), image_features in zip(pairs, features):
            embeddings = self.runtime.embed(ids[None])[0]
            prompts.append(splice_image_features(ids, embeddings, image_features[None], self.image_token_id))
        scores = np.zeros(len(pairs), dtype=np.float32)
        for _, rows in group_by_length([len(p) for p in prompts]).items():
            logits = self.runtime.decoder.prefill_logits(np.stack([prompts[row] for row in rows]).astype(np.float32, copy=False))
            scores[rows] = yes_probability(logits, self.yes_ids, self.no_ids)
        return scores
