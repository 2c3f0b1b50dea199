"""The TensorRT-LLM adapter against recorded responses of the tensorrt_llm model's documented contract: the request
tensors it builds (names, types, shapes of the model's config.pbtxt), and the steps it makes of streamed responses
(texts, ids, log-probabilities, entropies, finish reasons, counts, when the engine is cancelled).

The fixtures in trtllm_recorded/ name the documents their shapes follow; thinkserve_backend.trtllm cites the rest.
"""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from thinkserve_backend import trtllm
from thinkserve_backend.decoding import ContextOverflowError, GenerationParams
from thinkserve_backend.relevance import label_probabilities, yes_probability
from thinkserve_backend.images import place_images
from thinkserve_backend.sampling import choose_token, token_measures

RECORDED = Path(__file__).parent / "trtllm_recorded"
CONFIG = json.loads((RECORDED / "tensorrt_llm_config.json").read_text())
TRITON_TYPES = {
    "TYPE_INT32": np.int32, "TYPE_UINT64": np.uint64, "TYPE_FP32": np.float32, "TYPE_FP16": np.float16, "TYPE_BOOL": np.bool_
}

# The recordings' toy tokenizer: 0 is the end id, 1 a second end-of-sequence token (sent as a stop word), 12 the
# image placeholder; the engine's vocabulary is 13 (its logits padded to 16).
VOCAB = [
    "<|endoftext|>", "<|im_end|>", "Hello", " world", "!", " Us", "er", ":", " The", " answer", " is", " 42", "<image>"
]
SPECIAL = {0, 1, 12}
EOS = [0, 1]
VOCAB_SIZE = 13


def decode(ids):
    return "".join(VOCAB[i] for i in ids if i not in SPECIAL)


def array(spec) -> np.ndarray:
    return np.array(spec["data"], dtype=spec["dtype"]).reshape(spec["shape"])


def load(name: str) -> dict:
    return json.loads((RECORDED / f"{name}.json").read_text())


def params_of(request: dict) -> GenerationParams:
    return GenerationParams(
        request["max_tokens"], request["temperature"], request["top_p"], tuple(request["stop"]), request["seed"]
    )


class Recording:
    """Replays a recording's responses as the BLS iterator would, counting what the adapter reads and cancels."""

    def __init__(self, recording: dict):
        self.responses = [{name: array(spec) for name, spec in r.items()} for r in recording["responses"]]
        self.leaves_before = recording.get("client_leaves_before_response")
        self.read = 0
        self.cancels: list[int] = []  # the number of responses read when each cancel was asked

    def __iter__(self):
        for outputs in self.responses:
            self.read += 1
            yield outputs

    def cancel(self):
        self.cancels.append(self.read)

    def client_gone(self) -> bool:
        return self.leaves_before is not None and self.read >= self.leaves_before


def replay(name: str):
    recording = load(name)
    request = recording["request"]
    params = params_of(request)
    budget = trtllm.generation_budget(len(request["prompt_ids"]), params.max_tokens, request["max_context"])
    stream = trtllm.TrtllmStream(decode, params, budget, EOS, VOCAB_SIZE)
    engine = Recording(recording)
    steps = list(trtllm.relay(engine, stream, engine.cancel, engine.client_gone))
    return recording, steps, stream, engine


def same_numbers(actual, expected):
    """Recorded numbers to 1e-5; None in a recording is NaN (not measured)."""
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        if e is None:
            assert math.isnan(a)
        else:
            assert a == pytest.approx(e, abs=1e-5)


RECORDINGS = ["greedy_end_id", "length_sampled", "stop_string", "entropy", "cancelled", "vlm_two_images"]


@pytest.mark.parametrize("name", RECORDINGS)
def test_recorded_stream_becomes_exactly_the_contracts_steps(name):
    recording, steps, stream, engine = replay(name)
    expected = recording["expected_steps"]
    assert [s.text for s in steps] == [e["text"] for e in expected]
    assert [s.token_ids for s in steps] == [e["token_ids"] for e in expected]
    assert [s.completion_tokens for s in steps] == [e["completion_tokens"] for e in expected]
    assert [s.finish_reason for s in steps] == [e["finish_reason"] for e in expected]
    for step, want in zip(steps, expected):
        same_numbers(step.log_probs, want["log_probs"])
        same_numbers(step.normalized_entropy, want["normalized_entropy"])
    assert engine.read == recording["expected_responses_read"]
    assert len(engine.cancels) == recording["expected_cancels"]
    assert stream.entropy_measured is recording["expected_entropy_measured"]


def test_only_the_last_step_carries_a_finish_reason():
    for name in RECORDINGS:
        _, steps, _, _ = replay(name)
        assert [bool(s.finish_reason) for s in steps] == [False] * (len(steps) - 1) + [True]


def test_entropies_are_those_of_the_unpadded_vocabulary():
    """Uniform over 13 tokens is 1.0 whatever the 3 padding columns hold; two equal tokens is ln 2 / ln 13."""
    _, steps, _, _ = replay("entropy")
    assert steps[0].normalized_entropy == pytest.approx([1.0])
    assert steps[0].log_probs == pytest.approx([-math.log(13)])
    assert steps[1].normalized_entropy == pytest.approx([math.log(2) / math.log(13)])
    assert steps[1].log_probs == pytest.approx([math.log(0.5)])


def test_entropy_and_log_prob_match_the_cpu_generators_measure():
    logits = np.array([0.3, -1.2, 2.5, 0.0, 1.1], dtype=np.float32)
    choice = choose_token(logits, 0.0, 1.0, np.random.default_rng(0))
    log_prob, entropy = token_measures(logits, choice.token_id)
    assert log_prob == pytest.approx(choice.log_prob)
    assert entropy == pytest.approx(choice.normalized_entropy)


def test_greedy_log_probs_from_the_engine_are_not_reported_as_the_models():
    """Greedy: the engine's output_log_probs are 0 (the sampled distribution has one token); without logits the
    adapter reports NaN, and the stream says the entropies were not measured."""
    _, steps, stream, _ = replay("stop_string")
    assert all(math.isnan(v) for s in steps for v in s.log_probs)
    assert not stream.entropy_measured


def test_a_stop_string_split_over_tokens_cancels_the_engine_at_the_token_that_completes_it():
    recording, steps, _, engine = replay("stop_string")
    assert engine.cancels == [5]  # asked right after the fifth response (":"), before " The" is read
    assert "".join(s.text for s in steps) == "Hello world "
    assert steps[-1].finish_reason == "stop"


def test_a_client_that_leaves_cancels_the_engine_before_the_next_response_is_used():
    _, steps, _, engine = replay("cancelled")
    assert engine.cancels == [3]
    assert steps[-1].finish_reason == "cancelled" and steps[-1].completion_tokens == 2


def test_streams_the_engine_finishes_are_not_cancelled():
    for name in ("greedy_end_id", "length_sampled", "entropy", "vlm_two_images"):
        assert replay(name)[3].cancels == []


def test_a_second_end_of_sequence_token_ends_the_stream_as_eos():
    """Sent as a stop word, the engine returns it: the step carries it, as the CPU generator's eos step does."""
    params = GenerationParams(max_tokens=8)
    stream = trtllm.TrtllmStream(decode, params, 8, EOS, VOCAB_SIZE)
    responses = [{"output_ids": np.array([[[2]]], np.int32)}, {"output_ids": np.array([[[1]]], np.int32)}]
    steps = list(trtllm.relay(responses, stream, lambda: pytest.fail("nothing to cancel"), lambda: False))
    assert [(s.text, s.token_ids, s.finish_reason) for s in steps] == [("Hello", [2], ""), ("", [1], "eos")]


def test_length_ends_within_a_response_of_several_tokens():
    params = GenerationParams(max_tokens=2)
    stream = trtllm.TrtllmStream(decode, params, 2, EOS, VOCAB_SIZE)
    step = stream.feed({"output_ids": np.array([[[8, 9, 10]]], np.int32), "sequence_length": np.array([[3]], np.int32)})
    assert (step.text, step.token_ids, step.completion_tokens) == (" The answer", [8, 9], 2)
    assert step.finish_reason == "length"
    assert stream.feed({"output_ids": np.array([[[11]]], np.int32)}) is None


# Request tensors: the documented names, types and shapes.


def assert_documented(inputs: dict, batch: int = 1):
    for name, value in inputs.items():
        declared = CONFIG["inputs"].get(name)
        assert declared is not None, f"{name} is not an input of the tensorrt_llm model"
        assert value.dtype == TRITON_TYPES[declared["data_type"]], name
        dims = [batch] + declared["dims"]
        assert value.ndim == len(dims), f"{name}: {value.shape} against {dims}"
        assert all(d == -1 or d == s for d, s in zip(dims, value.shape)), f"{name}: {value.shape} against {dims}"


def test_greedy_request_tensors():
    params = GenerationParams(max_tokens=5, temperature=0.0, seed=3)
    options = trtllm.EngineOptions(end_id=0, pad_id=0, stop_token_ids=(1,), generation_logits=True)
    inputs = trtllm.generation_inputs([8, 9, 10], params, 5, options)
    assert_documented(inputs)
    assert inputs["input_ids"].tolist() == [[8, 9, 10]]
    assert inputs["input_lengths"].tolist() == [[3]]
    assert inputs["request_output_len"].tolist() == [[5]]
    assert inputs["runtime_top_k"].tolist() == [[1]]  # greedy
    assert "temperature" not in inputs and "runtime_top_p" not in inputs
    assert inputs["streaming"].tolist() == [[True]]
    assert inputs["return_generation_logits"].tolist() == [[True]]
    assert inputs["return_log_probs"].tolist() == [[False]]  # the logits give the model's own
    assert inputs["end_id"].tolist() == [[0]] and inputs["pad_id"].tolist() == [[0]]
    assert inputs["stop_words_list"].tolist() == [[[1], [1]]]  # token 1, ending at offset 1
    assert inputs["seed"].tolist() == [[3]]


def test_only_a_request_that_wants_entropies_asks_the_engine_for_the_vocabularys_logits():
    """The deployment's default: answers stream the engine's log-probs alone (4 bytes a token); the judger's probes
    (entropies wanted) get each step's logits, from which the stream computes exact entropies."""
    options = trtllm.EngineOptions(end_id=0)
    answer = GenerationParams(max_tokens=5)
    probe = GenerationParams(max_tokens=5, entropies=True)
    assert trtllm.generation_inputs([8], answer, 5, options)["return_generation_logits"].tolist() == [[False]]
    assert trtllm.generation_inputs([8], answer, 5, options)["return_log_probs"].tolist() == [[True]]
    assert "generation_logits" not in trtllm.stream_outputs(answer, options)
    assert trtllm.generation_inputs([8], probe, 5, options)["return_generation_logits"].tolist() == [[True]]
    assert "generation_logits" in trtllm.stream_outputs(probe, options)
    assert "generation_logits" in trtllm.stream_outputs(answer, trtllm.EngineOptions(generation_logits=True))


def test_sampling_request_tensors():
    params = GenerationParams(max_tokens=5, temperature=0.7, top_p=0.9, seed=2**63 + 5)
    options = trtllm.EngineOptions(generation_logits=False, seed_input="random_seed")
    inputs = trtllm.generation_inputs([2], params, 4, options)
    assert inputs["temperature"].tolist() == [[pytest.approx(0.7)]]
    assert inputs["runtime_top_k"].tolist() == [[0]]  # top-p alone
    assert inputs["runtime_top_p"].tolist() == [[pytest.approx(0.9)]]
    assert inputs["random_seed"].dtype == np.uint64 and int(inputs["random_seed"][0, 0]) == 2**63 + 5
    assert inputs["return_log_probs"].tolist() == [[True]]
    assert "end_id" not in inputs and "stop_words_list" not in inputs
    del inputs["random_seed"]  # the older backends' name; the documented config calls it seed
    assert_documented(inputs)


def test_stop_words_list_has_the_backends_layout():
    """[ids..., end offsets...]: two single-token words -> [[a, b], [1, 2]] (utils.cc convertWordList)."""
    assert trtllm.stop_words_list([151645, 151643]).tolist() == [[[151645, 151643], [1, 2]]]


def test_the_engine_is_never_asked_for_no_tokens():
    with pytest.raises(ValueError, match="at least one token"):
        trtllm.generation_inputs([2], GenerationParams(max_tokens=0), 0, trtllm.EngineOptions())


def test_stop_request_is_the_backends_documented_one():
    inputs = trtllm.stop_inputs()
    assert_documented(inputs)
    assert inputs["stop"].tolist() == [[True]] and inputs["request_output_len"].tolist() == [[0]]


def test_a_prompt_over_the_context_is_refused_with_the_numbers():
    with pytest.raises(ContextOverflowError, match=r"^prompt has 64 tokens; the model's context is 64 tokens$"):
        trtllm.generation_budget(64, 16, 64)
    assert trtllm.generation_budget(60, 16, 64) == 4  # clipped to what the context leaves
    assert trtllm.generation_budget(10, 16, 64) == 16


# The VLM: fake ids and the prompt table.


def test_vlm_request_with_two_images():
    recording = load("vlm_two_images")
    request = recording["request"]
    tokens_per_image = request["image_tokens_per_image"]
    ids = trtllm.vision_prompt(request["prompt_ids"], request["image_token_id"], tokens_per_image, request["vocab_size"])
    table = trtllm.prompt_table(array(request["features"]), tokens_per_image)
    params = params_of(request)
    budget = trtllm.generation_budget(len(ids), params.max_tokens, request["max_context"])
    inputs = trtllm.generation_inputs(ids, params, budget, trtllm.EngineOptions(end_id=0), table)
    assert_documented(inputs)
    for name, spec in recording["expected_inputs"].items():
        want = array(spec)
        assert inputs[name].dtype == want.dtype, name
        np.testing.assert_array_equal(inputs[name], want, err_msg=name)


def test_vlm_prompt_over_the_context_counts_the_images_rows():
    ids = trtllm.vision_prompt([12, 2, 12, 3], 12, 3, VOCAB_SIZE)
    with pytest.raises(ContextOverflowError, match="prompt has 8 tokens; the model's context is 8 tokens"):
        trtllm.generation_budget(len(ids), 8, 8)


def test_vision_features_of_another_length_are_refused():
    with pytest.raises(ValueError, match=r"expected \[images, 3, hidden\]"):
        trtllm.prompt_table(np.zeros((2, 4, 4), np.float32), 3)


def test_images_are_placed_as_the_cpu_vlm_places_them():
    assert place_images("Describe.", 2, "<image>") == "<image><image>\nDescribe."
    assert place_images("<image> and <image>", 2, "<image>") == "<image> and <image>"
    with pytest.raises(ValueError, match="1 <image> placeholders but 2 images"):
        place_images("<image> only", 2, "<image>")


# One-step scoring: the relevance filter and the LLM router.


def test_scoring_request_tensors_for_a_batch():
    tables = np.zeros((2, 3, 4), np.float16)
    inputs = trtllm.scoring_inputs([[2, 5], [8, 9, 10]], tables)
    assert_documented(inputs, batch=2)
    assert inputs["input_ids"].tolist() == [[2, 5, 0], [8, 9, 10]]
    assert inputs["input_lengths"].tolist() == [[2], [3]]
    assert inputs["request_output_len"].tolist() == [[1], [1]]
    assert inputs["runtime_top_k"].tolist() == [[1], [1]]
    assert inputs["streaming"].tolist() == [[False], [False]]
    assert inputs["return_generation_logits"].tolist() == [[True], [True]]
    assert inputs["prompt_vocab_size"].tolist() == [[3], [3]]


def test_recorded_scoring_responses_give_yes_probabilities_and_label_shares():
    recording = load("scoring_batch")
    responses = [{name: array(spec) for name, spec in r.items()} for r in recording["responses"]]
    logits = trtllm.first_step_logits(responses, 2, recording["request"]["vocab_size"])
    assert logits.shape == (2, VOCAB_SIZE)  # padding columns dropped
    np.testing.assert_allclose(yes_probability(logits, [2], [3]), recording["expected_relevance"], atol=1e-6)
    np.testing.assert_allclose(label_probabilities(logits, [[2], [3], [4]]), recording["expected_labels"], atol=1e-6)


def test_scoring_without_logits_is_an_error_that_says_how_to_build_the_engine():
    responses = [{"output_ids": np.array([[[2]]], np.int32)}]
    with pytest.raises(ValueError, match="gather_generation_logits"):
        trtllm.first_step_logits(responses, 1, VOCAB_SIZE)
