"""The generation loop: how it ends (eos, length, stop string, cancel) and what each step reports.

The decoder here is a scripted stand-in for the ONNX graph (whose parity with PyTorch the model compiler
checks on every build); this tests the loop around it.
"""

import numpy as np
import pytest

from thinkserve_backend.decoding import ContextOverflowError, GenerationParams, generate, splice_image_features

VOCAB = ["<eos>", "Hello", " world", " again", "<|im_end|>", "!"]
EOS = 0


class ScriptedDecoder:
    """Always makes the next scripted token the most likely one; records the positions it was called at."""

    def __init__(self, script):
        self.script = script
        self.positions = []

    def empty_cache(self):
        return {"past": 0}

    def forward(self, inputs, cache, position):
        self.positions.append(position)
        step = cache["past"]
        logits = np.zeros(len(VOCAB), dtype=np.float32)
        logits[self.script[min(step, len(self.script) - 1)]] = 10.0
        return logits, {"past": step + 1}


def decode(ids):
    return "".join(VOCAB[i] for i in ids if i != EOS)


def run(script, **params):
    decoder = ScriptedDecoder(script)
    prompt = np.array([[1, 2, 3]], dtype=np.int64)
    options = {"max_tokens": 10, **params}
    cancel_after = options.pop("cancel_after", None)
    produced = []

    def is_cancelled():
        return cancel_after is not None and len(produced) >= cancel_after

    steps = []
    for step in generate(decoder, prompt, GenerationParams(**options), decode, [EOS], 64, is_cancelled=is_cancelled):
        steps.append(step)
        produced.extend(step.token_ids)
    return steps, decoder


def test_eos_ends_generation_and_each_step_carries_one_token_with_its_figures():
    steps, decoder = run([1, 2, 3, EOS])
    assert [s.finish_reason for s in steps] == ["", "", "", "eos"]
    assert "".join(s.text for s in steps) == "Hello world again"
    assert all(len(s.token_ids) == len(s.log_probs) == len(s.normalized_entropy) == 1 for s in steps)
    assert steps[-1].completion_tokens == 4
    assert decoder.positions == [0, 3, 4, 5]  # prefill at 0, then one cached position per token


def test_max_tokens_ends_with_length():
    steps, _ = run([1, 2, 3, 2, 3, 2, 3], max_tokens=3)
    assert steps[-1].finish_reason == "length" and steps[-1].completion_tokens == 3
    assert "".join(s.text for s in steps) == "Hello world again"


def test_stop_string_ends_with_stop_and_is_not_in_the_text():
    steps, _ = run([1, 2, 4, 3], stop=("<|im_end|>",))
    assert steps[-1].finish_reason == "stop"
    assert "".join(s.text for s in steps) == "Hello world"


def test_cancellation_is_seen_at_the_next_token():
    steps, _ = run([1, 2, 3, 2, 3, 2, 3], cancel_after=2)
    assert steps[-1].finish_reason == "cancelled"
    assert steps[-1].completion_tokens == 2


def test_zero_max_tokens_generates_nothing():
    steps, _ = run([1, 2], max_tokens=0)
    assert len(steps) == 1 and steps[0].finish_reason == "length" and not steps[0].token_ids


def test_prompt_longer_than_the_context_is_refused():
    decoder = ScriptedDecoder([1])
    with pytest.raises(ContextOverflowError, match="context is 2 tokens"):
        list(generate(decoder, np.zeros((1, 5), np.int64), GenerationParams(4), decode, [EOS], 2))


def test_image_features_replace_their_placeholder_tokens():
    ids = np.array([5, 9, 6, 9, 7])
    embeddings = np.arange(5, dtype=np.float32)[:, None].repeat(2, axis=1)
    features = np.full((2, 3, 2), -1.0, dtype=np.float32)
    features[1] = -2.0
    spliced = splice_image_features(ids, embeddings, features, image_token_id=9)
    assert spliced[:, 0].tolist() == [0, -1, -1, -1, 2, -2, -2, -2, 4]
    with pytest.raises(ValueError, match="2 image tokens for 1 images"):
        splice_image_features(ids, embeddings, features[:1], image_token_id=9)
