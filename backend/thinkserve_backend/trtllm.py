"""Triton's TensorRT-LLM backend behind our generation contract: its request tensors built from our inputs, and its
streamed responses turned into our steps (text deltas, log-probabilities, entropies, finish reasons, counts).

Pure logic over numpy; models/trtllm_adapter.py makes the BLS calls. What it relies on, and where that is written:

- Request tensors, their types and shapes (one request, batch dimension 1): the `tensorrt_llm` model's config in
  NVIDIA/TensorRT-LLM `triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt` (formerly
  triton-inference-server/tensorrtllm_backend `all_models/...`): input_ids INT32 [-1], input_lengths INT32 [1],
  request_output_len INT32 [1] (required; 0 is refused, tensorrtllm_backend#634), end_id/pad_id INT32 [1],
  stop_words_list INT32 [2, -1], temperature FP32, runtime_top_k INT32, runtime_top_p FP32, seed UINT64 (older
  releases: random_seed), return_log_probs/return_generation_logits/exclude_input_in_output/streaming BOOL [1],
  prompt_embedding_table [-1, -1] of the engine's dtype, prompt_vocab_size INT32 [1]. The names are the C++
  backend's `InputFieldsNames` (triton_backend/inflight_batcher_llm/src/utils.h); utils.cc reads them: a
  runtime_top_p <= 0 is ignored, stop words are [ids..., end offsets...] padded with -1, the prompt table is
  squeezed to [rows, hidden].
- Sampling: executor.h `SamplingConfig`: top_k 0 means all logits, top_k 1 is greedy, temperature must be > 0.
- What a response carries (model_instance_state.cc `fillTritonResponse`): output_ids [1, beams, n],
  sequence_length [1, beams], output_log_probs [1, beams, n], generation_logits [1, a, b, vocab_padded], and with
  a batch of several, batch_index [1, 1]. In streaming mode only the tokens generated since the last response
  ("initial tokens sent by the executor are the input tokens IF NOT Streaming"; executor.h
  `returnAllGeneratedTokens` defaults to false), and each streamed response's logits are those of its last step
  (executor.h `Result::generationLogits`: [1, beam, vocab] when streaming). The backend returns no finish reason.
- The end token is not returned (NVIDIA/TensorRT-LLM#2190: "The generation will stop at the endId, but not include
  it in the output"), so a stream that ends short of request_output_len ended at an end id.
- output_log_probs are those of the distribution the token was sampled from: under greedy decoding they are 0
  (tensorrtllm_backend#276), so they are the model's own (temperature 1) log-probabilities only when sampling at
  temperature 1 without top-p. The contract's numbers come from generation_logits instead (the engine must be
  built with `trtllm-build --gather_generation_logits`); their vocabulary is padded, so only the first `vocab_size`
  columns are the model's.
- Cancelling: the BLS response iterator's `cancel()` (python_backend README, "Cancelling decoupled BLS requests";
  the backend checks every `cancellation_check_period_ms`, docs/model_config.md), or a request with the same
  request id and `stop` true (model_instance_state.cc `handleStopRequest`; tensorrt_llm_bls/1/lib/triton_decoder.py
  `send_cancellation_request`).
- LLaVA-style images (inflight_batcher_llm/preprocessing/1/model.py `_setup_fake_prompts`): the k-th image's
  features are rows of the prompt table, referenced from the prompt by ids counting up from the engine's
  vocabulary size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Mapping, Optional, Sequence

import numpy as np

from .decoding import ContextOverflowError, GenerationParams, GenerationStep
from .sampling import token_measures
from .text_stream import Decode, TextStream

Outputs = Mapping[str, np.ndarray]  # one response of the tensorrt_llm model: tensor name -> array

# What a streamed generation and a one-step scoring ask the tensorrt_llm model for.
STREAM_OUTPUTS = ("output_ids", "sequence_length", "output_log_probs")
SCORING_OUTPUTS = ("output_ids", "sequence_length", "generation_logits", "batch_index")
# The vision model's contract (the VLM's vision tower + projector): preprocessed pixels in, one row per image token out.
VISION_INPUT = "pixel_values"  # FP32 [n, 3, height, width], as images.pixels_of makes them
VISION_OUTPUT = "image_features"  # [n, image_tokens_per_image, hidden]


@dataclass(frozen=True)
class EngineOptions:
    """How this deployment's tensorrt_llm model is asked (the adapter model's config parameters)."""

    end_id: Optional[int] = None  # the engine stops at it and withholds it
    pad_id: Optional[int] = None
    stop_token_ids: tuple[int, ...] = ()  # further end-of-sequence ids, sent as the engine's stop words
    # Every streamed step's logits (engine built to gather them): exact log-probabilities and entropies, at the cost
    # of the whole vocabulary per token (0.6 MB for Qwen's, copied to the host and log-softmaxed here). Off, a stream
    # asks for them only when its request wants entropies (the judger's probes: GenerationParams.entropies), and
    # otherwise for the engine's output_log_probs alone (4 bytes a token; the model's own when sampling at
    # temperature 1).
    generation_logits: bool = False
    seed_input: str = "seed"  # "random_seed" in backends before the rename


def generation_budget(prompt_tokens: int, max_tokens: int, max_context: int) -> int:
    """Tokens the engine may generate: max_tokens, clipped to what the context leaves (as decoding.generate does)."""
    if prompt_tokens >= max_context:
        raise ContextOverflowError(f"prompt has {prompt_tokens} tokens; the model's context is {max_context} tokens")
    return min(max_tokens, max_context - prompt_tokens)


def _one(value, dtype) -> np.ndarray:
    """A per-request scalar: dims [1] plus the batch dimension."""
    return np.array([[value]], dtype=dtype)


def wants_logits(params: GenerationParams, options: EngineOptions) -> bool:
    """Whether a stream asks the engine for each step's logits: the deployment always wants them, or this request
    wants entropies."""
    return options.generation_logits or params.entropies


def stream_outputs(params: GenerationParams, options: EngineOptions) -> tuple[str, ...]:
    """What a streamed generation asks the tensorrt_llm model for: logits only when wanted (wants_logits)."""
    return STREAM_OUTPUTS + (("generation_logits",) if wants_logits(params, options) else ())


def greedy(params: GenerationParams) -> bool:
    return params.temperature <= 0


def engine_log_probs_exact(params: GenerationParams) -> bool:
    """Whether output_log_probs are the model's own: sampling the whole distribution at temperature 1."""
    return params.temperature == 1.0 and params.top_p >= 1.0


def generation_inputs(
    prompt_ids: Sequence[int],
    params: GenerationParams,
    budget: int,
    options: EngineOptions,
    table: Optional[np.ndarray] = None,
) -> dict[str, np.ndarray]:
    """The streamed request: prompt ids [1, n] (a VLM's with fake ids, `table` its prompt table [1, rows, hidden])."""
    if budget < 1:
        raise ValueError(f"the engine must be asked for at least one token, got {budget}")
    inputs = {
        "input_ids": np.array([list(prompt_ids)], dtype=np.int32),
        "input_lengths": _one(len(prompt_ids), np.int32),
        "request_output_len": _one(budget, np.int32),
        "streaming": _one(True, np.bool_),
        "exclude_input_in_output": _one(True, np.bool_),
        "return_generation_logits": _one(wants_logits(params, options), np.bool_),
        "return_log_probs": _one(not wants_logits(params, options), np.bool_),
    }
    if greedy(params):
        inputs["runtime_top_k"] = _one(1, np.int32)
    else:
        inputs["temperature"] = _one(params.temperature, np.float32)
        inputs["runtime_top_k"] = _one(0, np.int32)  # 0: no top-k cut, top-p alone decides
        inputs["runtime_top_p"] = _one(params.top_p, np.float32)
    if params.seed is not None:
        inputs[options.seed_input] = _one(params.seed, np.uint64)
    if options.end_id is not None:
        inputs["end_id"] = _one(options.end_id, np.int32)
    if options.pad_id is not None:
        inputs["pad_id"] = _one(options.pad_id, np.int32)
    if options.stop_token_ids:
        inputs["stop_words_list"] = stop_words_list(options.stop_token_ids)
    if table is not None:
        inputs.update(prompt_table_inputs(table))
    return inputs


def stop_words_list(token_ids: Sequence[int]) -> np.ndarray:
    """Single-token stop words in the engine's format [1, 2, n]: the ids, then each word's end offset."""
    ids = list(token_ids)
    return np.array([[ids, list(range(1, len(ids) + 1))]], dtype=np.int32)


def prompt_table_inputs(table: np.ndarray) -> dict[str, np.ndarray]:
    """The p-tuning inputs of one request: the table [1, rows, hidden] and its row count."""
    if table.ndim != 3 or table.shape[0] != 1:
        raise ValueError(f"a prompt table must be [1, rows, hidden], got {list(table.shape)}")
    return {"prompt_embedding_table": table, "prompt_vocab_size": _one(table.shape[1], np.int32)}


def stop_inputs() -> dict[str, np.ndarray]:
    """The request that stops a running one with the same request id (for backends whose BLS iterator cannot cancel)."""
    return {
        "input_ids": np.zeros((1, 1), dtype=np.int32),
        "input_lengths": np.zeros((1, 1), dtype=np.int32),
        "request_output_len": np.zeros((1, 1), dtype=np.int32),
        "stop": _one(True, np.bool_),
    }


def vision_prompt(ids: Sequence[int], image_token_id: int, tokens_per_image: int, vocab_size: int) -> list[int]:
    """Each image placeholder replaced by its own prompt-table rows' fake ids: the k-th image's
    vocab_size + k * tokens_per_image, ... (the engine looks ids >= vocab_size up in the request's table)."""
    out: list[int] = []
    image = 0
    for token in ids:
        if token == image_token_id:
            start = vocab_size + image * tokens_per_image
            out.extend(range(start, start + tokens_per_image))
            image += 1
        else:
            out.append(int(token))
    return out


def prompt_table(features: np.ndarray, tokens_per_image: int, dtype=np.float16) -> np.ndarray:
    """Image features [images, tokens, hidden] -> the request's prompt table [1, images * tokens, hidden], in the
    order vision_prompt numbers them."""
    if features.ndim != 3 or features.shape[1] != tokens_per_image:
        raise ValueError(
            f"the vision model returned features {list(features.shape)}; expected [images, {tokens_per_image}, hidden] "
            f"(image_tokens_per_image = {tokens_per_image})"
        )
    return np.ascontiguousarray(features.reshape(1, -1, features.shape[-1]), dtype=dtype)


def new_tokens(outputs: Outputs) -> list[int]:
    """The first beam's tokens of one response (none in an empty final response)."""
    ids = outputs.get("output_ids")
    if ids is None or ids.size == 0:
        return []
    row = ids.reshape(-1, ids.shape[-1])[0]
    lengths = outputs.get("sequence_length")
    length = len(row) if lengths is None or lengths.size == 0 else int(lengths.reshape(-1)[0])
    return [int(t) for t in row[:length]]


def _rows(array: Optional[np.ndarray]) -> np.ndarray:
    if array is None or array.size == 0:
        return np.empty((0, 0))
    return array.reshape(-1, array.shape[-1])


def _aligned(rows: int, tokens: int) -> list[Optional[int]]:
    """Which row belongs to each token. Fewer rows than tokens: the rows are the last steps' (a streamed response
    keeps its last step's logits); more: the first ones are, the rest are steps whose token the engine withheld (its
    end id)."""
    if rows >= tokens:
        return list(range(tokens))
    return [None] * (tokens - rows) + list(range(rows))


class TrtllmStream:
    """One streamed generation: the engine's responses in (`feed`), our contract's steps out.

    Log-probabilities and entropies come from generation_logits when the engine returns them. Where it does not
    (not asked for: wants_logits), entropies are NaN and `entropy_measured` turns False;
    log-probabilities are the engine's own when they are the model's (engine_log_probs_exact), else NaN. Nothing is
    estimated here.
    """

    def __init__(
        self,
        decode: Decode,
        params: GenerationParams,
        budget: int,
        eos_token_ids: Sequence[int],
        vocab_size: int,
    ):
        self._text = TextStream(decode, params.stop)
        self._budget = budget
        self._eos = set(eos_token_ids)
        self._vocab = vocab_size
        self._engine_log_probs = engine_log_probs_exact(params)
        self.completion_tokens = 0
        self.finish_reason = ""
        self.cancel_upstream = False  # ended here (stop string) while the engine goes on
        self.entropy_measured = True  # False once a token came without its step's logits

    @property
    def finished(self) -> bool:
        return bool(self.finish_reason)

    def feed(self, outputs: Outputs) -> Optional[GenerationStep]:
        """One engine response -> the step to send (None when it brings nothing: an empty final response, or one
        after the generation ended here)."""
        if self.finished:
            return None
        tokens = new_tokens(outputs)
        log_probs, entropies = self._measures(outputs, tokens)
        step = GenerationStep(text="")
        for token, log_prob, entropy in zip(tokens, log_probs, entropies):
            self.completion_tokens += 1
            step.token_ids.append(token)
            step.log_probs.append(log_prob)
            step.normalized_entropy.append(entropy)
            if token in self._eos:  # an end id sent as a stop word comes back; the end_id itself never does
                step.text += self._text.finish()
                self.finish_reason = "eos"
                break
            step.text += self._text.push(token)
            if self._text.stopped:
                self.finish_reason, self.cancel_upstream = "stop", True
                break
            if self.completion_tokens >= self._budget:
                step.text += self._text.finish()
                self.finish_reason = "length"
                break
        step.completion_tokens, step.finish_reason = self.completion_tokens, self.finish_reason
        return step if step.token_ids or step.text or step.finish_reason else None

    def close(self) -> GenerationStep:
        """The engine's stream ended before the budget: at its end id (withheld, so the step has no token)."""
        self.finish_reason = "eos"
        return GenerationStep(self._text.finish(), completion_tokens=self.completion_tokens, finish_reason="eos")

    def cancelled(self) -> GenerationStep:
        self.finish_reason = "cancelled"
        return GenerationStep(self._text.finish(), completion_tokens=self.completion_tokens, finish_reason="cancelled")

    def _measures(self, outputs: Outputs, tokens: list[int]) -> tuple[list[float], list[float]]:
        log_probs = [math.nan] * len(tokens)
        entropies = [math.nan] * len(tokens)
        logits = _rows(outputs.get("generation_logits"))
        if len(logits):
            if logits.shape[1] < self._vocab:
                raise ValueError(f"generation_logits have {logits.shape[1]} columns for a vocabulary of {self._vocab}")
            for i, row in enumerate(_aligned(len(logits), len(tokens))):
                if row is not None:
                    log_probs[i], entropies[i] = token_measures(logits[row, : self._vocab], tokens[i])
        elif self._engine_log_probs:
            engine = _rows(outputs.get("output_log_probs"))
            if len(engine):
                for i, row in enumerate(_aligned(engine.shape[1], len(tokens))):
                    if row is not None:
                        log_probs[i] = float(engine[0, row])
        if any(math.isnan(e) for e in entropies):
            self.entropy_measured = False
        return log_probs, entropies


def relay(
    responses: Iterable[Outputs],
    stream: TrtllmStream,
    cancel: Callable[[], None],
    client_gone: Callable[[], bool],
) -> Iterator[GenerationStep]:
    """The steps of one generation, asking `cancel()` for the engine's request the moment it is no longer wanted:
    the client left (checked before each response is used) or a stop string ended the text here. Stops reading
    `responses` as soon as the generation has ended."""
    for outputs in responses:
        if client_gone():
            cancel()
            yield stream.cancelled()
            return
        step = stream.feed(outputs)
        if step is not None:
            yield step
        if stream.finished:
            if stream.cancel_upstream:
                cancel()
            return
    yield stream.close()


def scoring_inputs(prompts: Sequence[Sequence[int]], tables: Optional[np.ndarray] = None) -> dict[str, np.ndarray]:
    """One batched request for the first step's logits of each prompt (relevance filter, LLM router): greedy, one
    token, not streamed. Rows are padded to the longest (the engine reads input_lengths); a VLM's rows each have
    their own table, `tables` [rows, tokens, hidden], referenced by fake ids from vision_prompt."""
    batch = len(prompts)
    if batch == 0:
        raise ValueError("nothing to score")
    width = max(len(p) for p in prompts)
    ids = np.zeros((batch, width), dtype=np.int32)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)] = prompt
    column = np.ones((batch, 1))
    inputs = {
        "input_ids": ids,
        "input_lengths": np.array([[len(p)] for p in prompts], dtype=np.int32),
        "request_output_len": column.astype(np.int32),
        "runtime_top_k": column.astype(np.int32),
        "streaming": np.zeros((batch, 1), dtype=np.bool_),
        "exclude_input_in_output": column.astype(np.bool_),
        "return_generation_logits": column.astype(np.bool_),
    }
    if tables is not None:
        if tables.ndim != 3 or tables.shape[0] != batch:
            raise ValueError(f"{batch} prompts need tables [{batch}, tokens, hidden], got {list(tables.shape)}")
        inputs["prompt_embedding_table"] = tables
        inputs["prompt_vocab_size"] = np.full((batch, 1), tables.shape[1], dtype=np.int32)
    return inputs


def first_step_logits(responses: Iterable[Outputs], batch: int, vocab_size: int) -> np.ndarray:
    """Each row's next-token logits [batch, vocab_size] from the responses to scoring_inputs (one per row, in any
    order, each naming its row in batch_index when the batch has several)."""
    logits = np.full((batch, vocab_size), np.nan, dtype=np.float32)
    seen = set()
    for outputs in responses:
        rows = _rows(outputs.get("generation_logits"))
        if not len(rows):
            continue
        index = outputs.get("batch_index")
        if index is None and batch > 1:
            raise ValueError("a response of a batched request has no batch_index")
        row = 0 if index is None else int(index.reshape(-1)[0])
        if rows.shape[1] < vocab_size:
            raise ValueError(f"generation_logits have {rows.shape[1]} columns for a vocabulary of {vocab_size}")
        logits[row] = rows[0, :vocab_size]
        seen.add(row)
    missing = sorted(set(range(batch)) - seen)
    if missing:
        raise ValueError(
            f"the engine returned no generation_logits for rows {missing} of {batch}: "
            "is it built with --gather_generation_logits?"
        )
    return logits
