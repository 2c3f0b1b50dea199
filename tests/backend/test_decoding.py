"""The generation loop: how it ends (eos, length, stop string, cancel) and what each step reports; and the
KV cache kept inside onnxruntime between steps, against the plain session.run loop, on a small exported decoder.

Most tests use a scripted stand-in for the ONNX graph (whose parity with PyTorch the model compiler checks on
every build) to test the loop around it.
"""

import threading

import numpy as np
import pytest

from thinkserve_backend.decoding import (
    ContextOverflowError,
    GenerationParams,
    KVCacheDecoder,
    generate,
    splice_image_features,
)

VOCAB = ["<eos>", "Hello", " world", " again", "<|im_end|>", "!"]
EOS = 0


class ScriptedDecoder:
    """Always makes the next scripted token the most likely one; records the positions it was called at."""

    def __init__(self, script):
        self.script = script
        self.positions = []

    def sequence(self):
        return ScriptedSequence(self)


class ScriptedSequence:
    def __init__(self, decoder):
        self.decoder, self.position, self.steps = decoder, 0, 0

    def step(self, inputs):
        self.decoder.positions.append(self.position)
        self.position += inputs.shape[1]
        script = self.decoder.script
        logits = np.zeros(len(VOCAB), dtype=np.float32)
        logits[script[min(self.steps, len(script) - 1)]] = 10.0
        self.steps += 1
        return logits


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


# ---------------------------------------------------------------- a real exported decoder


def _concat_graph(model, takes_embeddings: bool, path):
    """The decoder graph as exported before issue 16 (the cache grown by concatenation), the reference the
    in-place buffer is held to."""
    from thinkserve_build import decoder_graph, onnx_tools

    graph = decoder_graph.export_concatenating(model.model, model.lm_head, model.config, takes_embeddings, path)
    return onnx_tools.session(graph)


def _export_small_decoder(folder, takes_embeddings: bool):
    """A small random Qwen2 exported twice: as served now, and as the concatenating graph of before."""
    import torch
    from thinkserve_build import decoder_graph, onnx_tools
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(3)
    config = Qwen2Config(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.2, tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(config).eval()
    graph = decoder_graph.export(model.model, model.lm_head, config, takes_embeddings, folder / "decoder.onnx")
    decoder = KVCacheDecoder(onnx_tools.session(graph))
    table = model.get_input_embeddings().weight.detach().numpy()
    return decoder, _concat_graph(model, takes_embeddings, folder / "concat.onnx"), table


@pytest.fixture(scope="module")
def small_llm(tmp_path_factory):
    return _export_small_decoder(tmp_path_factory.mktemp("llm"), takes_embeddings=False)


@pytest.fixture(scope="module")
def small_vlm(tmp_path_factory):
    return _export_small_decoder(tmp_path_factory.mktemp("vlm"), takes_embeddings=True)


def greedy(logits: np.ndarray) -> np.ndarray:
    return np.array([[int(np.argmax(logits))]], dtype=np.int64)


def session_run_loop(session, prompt: np.ndarray, steps: int, embed=None) -> list[np.ndarray]:
    """The loop before issue 16 on the concatenating graph: session.run with the whole cache as numpy, each
    step. Greedy; each step's last-position logits."""
    past = [i for i in session.get_inputs() if i.name.startswith("past_key_values.")]
    cache = {i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), dtype=np.float32) for i in past}
    primary = session.get_inputs()[0].name
    position, inputs, out = 0, prompt, []
    for _ in range(steps):
        total = position + inputs.shape[1]
        feeds = {
            primary: inputs,
            "attention_mask": np.ones((1, total), dtype=np.int64),
            "position_ids": np.arange(position, total, dtype=np.int64)[None, :],
            **cache,
        }
        names = [o.name for o in session.get_outputs()]
        outputs = dict(zip(names, session.run(names, feeds)))
        cache = {name: outputs["present." + name[len("past_key_values.") :]] for name in cache}
        out.append(outputs["logits"][0, -1])
        position = total
        inputs = greedy(out[-1]) if embed is None else embed(greedy(out[-1]))
    return out


def sequence_loop(decoder: KVCacheDecoder, prompt: np.ndarray, steps: int, embed=None) -> list[np.ndarray]:
    sequence, inputs, out = decoder.sequence(), prompt, []
    for _ in range(steps):
        out.append(sequence.step(inputs))
        inputs = greedy(out[-1]) if embed is None else embed(greedy(out[-1]))
    return out


def assert_same_logits(expected: list[np.ndarray], actual: list[np.ndarray]) -> None:
    assert len(expected) == len(actual)
    for step, (a, b) in enumerate(zip(expected, actual)):
        assert a.shape == b.shape
        assert int(np.argmax(a)) == int(np.argmax(b)), f"greedy token differs at step {step}"
        np.testing.assert_allclose(b, a, atol=1e-4, rtol=0, err_msg=f"step {step}")


def test_in_place_buffer_gives_the_session_run_loops_logits_and_tokens(small_llm):
    decoder, concat, _ = small_llm
    prompt = np.array([[5, 17, 42, 8, 90, 3, 11]], dtype=np.int64)
    # 300 steps: past the first buffer (prompt + 256 positions), so its doubling is covered too
    assert_same_logits(session_run_loop(concat, prompt, 300), sequence_loop(decoder, prompt, 300))


def test_in_place_buffer_with_embeddings_as_input_gives_the_same_logits(small_vlm):
    decoder, concat, table = small_vlm
    assert decoder.takes_embeddings

    def embed(ids):
        return table[ids].astype(np.float32)

    prompt = embed(np.array([[4, 9, 61, 2, 33]], dtype=np.int64))
    assert_same_logits(session_run_loop(concat, prompt, 24, embed), sequence_loop(decoder, prompt, 24, embed))


def test_generate_matches_the_session_run_loop_token_for_token(small_llm):
    decoder, concat, _ = small_llm
    prompt = np.array([[7, 7, 30, 1]], dtype=np.int64)
    expected = [int(np.argmax(logits)) for logits in session_run_loop(concat, prompt, 30)]
    steps = generate(decoder, prompt, GenerationParams(max_tokens=30), lambda ids: "", [], max_context=512)
    assert [t for step in steps for t in step.token_ids] == expected


def test_interleaved_sequences_on_one_decoder_keep_their_own_caches(small_llm):
    decoder = small_llm[0]
    prompts = [np.array([[5, 17, 42, 8]], dtype=np.int64), np.array([[60, 2, 2, 9, 71, 40, 13]], dtype=np.int64)]
    alone = [sequence_loop(decoder, prompt, 20) for prompt in prompts]
    sequences = [decoder.sequence() for _ in prompts]
    inputs = list(prompts)
    together = [[], []]
    for _ in range(20):
        for i, sequence in enumerate(sequences):  # one step of each in turn, on the same session
            together[i].append(sequence.step(inputs[i]))
            inputs[i] = greedy(together[i][-1])
    for expected, actual in zip(alone, together):
        np.testing.assert_array_equal(np.stack(actual), np.stack(expected))


def test_concurrent_generations_in_threads_produce_what_each_produces_alone(small_llm):
    decoder = small_llm[0]
    prompts = [np.array([[i + 1, 2 * i + 3, 50 - i]], dtype=np.int64) for i in range(4)]

    def tokens(prompt):
        steps = generate(decoder, prompt, GenerationParams(max_tokens=25), lambda ids: "", [], max_context=512)
        return [t for step in steps for t in step.token_ids]

    alone = [tokens(prompt) for prompt in prompts]
    results = [None] * len(prompts)

    def work(i):
        results[i] = tokens(prompts[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == alone


def test_batched_prefill_rows_equal_the_first_step_of_each_prompt(small_llm):
    decoder, concat, _ = small_llm
    prompts = np.array([[5, 17, 42, 8], [60, 2, 2, 9], [1, 1, 1, 1]], dtype=np.int64)
    batched = decoder.prefill_logits(prompts)
    for row, prompt in zip(batched, prompts):
        np.testing.assert_allclose(row, session_run_loop(concat, prompt[None], 1)[0], atol=1e-4, rtol=0)
        np.testing.assert_allclose(row, decoder.sequence().step(prompt[None]), atol=1e-4, rtol=0)


def test_a_graph_exported_before_the_in_place_buffer_is_refused_with_the_reason(small_llm):
    with pytest.raises(ValueError, match="predates the KV buffer"):
        KVCacheDecoder(small_llm[1])
