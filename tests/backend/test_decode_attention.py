"""The batched decoder's grouped decode attention (thinkserve_backend.torch_decode_attention): a decode step with the
query heads folded onto their key/value head gives the logits transformers' sdpa path gives, whole generations keep
their tokens, and models it does not fit keep sdpa, saying why. A transformers whose sdpa path folds the heads itself
(5.23's `pack_gqa`) keeps its own path; the tests that exercise this module's fold say the installed one lacks it
(as 5.17, the GPU machine's, does: there the sdpa path copies each key/value head, and these tests passed against it
with PYTHONPATH pointing at a 5.17 install)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from thinkserve_backend import torch_decode_attention  # noqa: E402
from thinkserve_backend.torch_batch_decoding import BatchDecoder  # noqa: E402
from thinkserve_backend.torch_modules import generator_modules  # noqa: E402

CONTEXT = 128


@pytest.fixture(autouse=True)
def transformers_without_the_fold(monkeypatch):
    """This module's fold serves, whatever the installed transformers' sdpa path does (a test below says otherwise)."""
    monkeypatch.setattr(torch_decode_attention, "transformers_folds_grouped_heads", lambda: False)


def qwen2_modules(heads: int = 6, kv_heads: int = 2, seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(
        vocab_size=300, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=heads,
        num_key_value_heads=kv_heads, max_position_embeddings=CONTEXT, initializer_range=0.2,
    )
    return generator_modules(transformers.Qwen2ForCausalLM(config).eval(), vision=False)


def step_logits(decoder: BatchDecoder, prompts: list[list[int]], following: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill rows of different lengths together, then one decode step each: (prefill logits, decode logits)."""
    first = decoder.prefill(0, [np.array([p]) for p in prompts])
    then = decoder.decode(following, [len(p) for p in prompts])
    return first, then


def test_a_folded_decode_step_gives_the_logits_of_the_copying_sdpa_path():
    modules = qwen2_modules()
    decoder = BatchDecoder(modules, 4, CONTEXT, torch.device("cpu"), torch.float32)
    assert decoder.no_grouped_attention_reason == ""
    assert modules.text_config._attn_implementation == torch_decode_attention.NAME
    prompts, following = [[5, 9, 14], [3, 8, 21, 34, 55, 89], [7], [40, 41]], [17, 23, 31, 2]

    calls = []
    original = torch_decode_attention.scaled_dot_product_attention

    def counted(query, *args, **kwargs):
        calls.append(tuple(query.shape))
        return original(query, *args, **kwargs)

    torch_decode_attention.scaled_dot_product_attention = counted
    try:
        folded_prefill, folded = step_logits(decoder, prompts, following)
    finally:
        torch_decode_attention.scaled_dot_product_attention = original
    # per layer, the decode step only (the prefill goes to transformers' sdpa path): 2 key/value heads, each with
    # its 3 query heads in the place of positions
    assert calls == [(4, 2, 3, 8)] * 2
    modules.text_config._attn_implementation = "sdpa"  # the same cache, rows and mask through transformers' copy
    copied_prefill, copied = step_logits(decoder, prompts, following)
    torch.testing.assert_close(folded_prefill, copied_prefill, rtol=0, atol=0)  # prefill: sdpa either way
    torch.testing.assert_close(folded, copied, rtol=1e-5, atol=1e-5)
    assert not torch.equal(folded[0], folded[1])  # rows at different positions stay apart


def test_generations_keep_their_tokens_and_the_load_check_passes():
    """Twelve greedy steps of three rows through the folded attention, against the same rows through sdpa."""
    def greedy(attention: str) -> list[list[int]]:
        modules = qwen2_modules(seed=1)
        decoder = BatchDecoder(modules, 3, CONTEXT, torch.device("cpu"), torch.float32)
        modules.text_config._attn_implementation = attention
        decoder.self_check()
        prompts = [[11, 12, 13, 14], [20, 21], [30, 31, 32, 33, 34, 35, 36]]
        logits = decoder.prefill(0, [np.array([p]) for p in prompts])
        tokens, positions = [[int(t)] for t in logits.argmax(-1)], [len(p) for p in prompts]
        for _ in range(12):
            logits = decoder.decode([row[-1] for row in tokens], positions)
            for row, token in zip(tokens, logits.argmax(-1)):
                row.append(int(token))
            positions = [p + 1 for p in positions]
        return tokens

    assert greedy(torch_decode_attention.NAME) == greedy("sdpa")


def test_models_it_does_not_fit_keep_sdpa_and_say_why():
    without_groups = qwen2_modules(heads=4, kv_heads=4)
    decoder = BatchDecoder(without_groups, 2, CONTEXT, torch.device("cpu"), torch.float32)
    assert decoder.no_grouped_attention_reason == "the model has no grouped key/value heads"
    assert without_groups.text_config._attn_implementation == "sdpa"
    turned_off = qwen2_modules()  # the served model's grouped_decode_attention parameter, off
    decoder = BatchDecoder(turned_off, 2, CONTEXT, torch.device("cpu"), torch.float32, grouped_attention=False)
    assert decoder.no_grouped_attention_reason == "the grouped_decode_attention parameter is off"
    assert turned_off.text_config._attn_implementation == "sdpa"
    eager = qwen2_modules()
    eager.text_config._attn_implementation = "eager"
    assert torch_decode_attention.use_grouped_decode_attention(eager.text_config) == "the model's attention is 'eager', not sdpa"


def test_the_one_at_a_time_decoder_sharing_the_modules_keeps_its_tokens():
    """The per-thread decoder (a static cache, no mask handed: transformers builds it) runs on the same modules once
    a batch decoder set the grouped attention: its greedy tokens are the ones it had under sdpa."""
    from thinkserve_backend.decoding import GenerationParams, generate
    from thinkserve_backend.torch_decoding import TorchKVCacheDecoder

    def tokens(modules) -> list[int]:
        decoder = TorchKVCacheDecoder(modules, CONTEXT, torch.device("cpu"), torch.float32)
        steps = generate(decoder, np.array([[4, 8, 15, 16, 23, 42]]), GenerationParams(16), decode=lambda ids: "",
                         eos_token_ids=[], max_context=CONTEXT)
        return [t for step in steps for t in step.token_ids]

    modules = qwen2_modules(seed=2)
    before = tokens(modules)
    BatchDecoder(modules, 2, CONTEXT, torch.device("cpu"), torch.float32)
    assert modules.text_config._attn_implementation == torch_decode_attention.NAME
    assert tokens(modules) == before


def test_a_grouped_attention_that_fails_the_load_check_leaves_sdpa_and_batching(monkeypatch):
    """Should the folded attention disagree with whole sequences (another transformers, another kernel), the load
    check falls back to sdpa, says why, and passes: the model keeps in-flight batching."""
    modules = qwen2_modules(seed=3)
    decoder = BatchDecoder(modules, 2, CONTEXT, torch.device("cpu"), torch.float32)
    original = torch_decode_attention.scaled_dot_product_attention
    monkeypatch.setattr(torch_decode_attention, "scaled_dot_product_attention",
                        lambda *args, **kwargs: original(*args, **kwargs) + 1.0)  # the fold's call, wrong
    decoder.self_check()
    assert decoder.no_grouped_attention_reason.startswith("the grouped decode attention failed the check at load")
    assert modules.text_config._attn_implementation == "sdpa"
    monkeypatch.setattr(torch_decode_attention, "scaled_dot_product_attention", original)
    cache_ignored = BatchDecoder(qwen2_modules(seed=4), 2, CONTEXT, torch.device("cpu"), torch.float32)
    monkeypatch.setattr(cache_ignored.cache, "update", lambda key, value, layer, kwargs=None: (key, value))
    with pytest.raises(RuntimeError, match="check at load failed"):  # a fault sdpa shares still fails the check
        cache_ignored.self_check()
    assert cache_ignored.no_grouped_attention_reason.startswith("the grouped decode attention failed")


def test_a_transformers_that_folds_grouped_heads_itself_keeps_its_own_path(monkeypatch):
    monkeypatch.setattr(torch_decode_attention, "transformers_folds_grouped_heads", lambda: True)
    modules = qwen2_modules(seed=5)
    decoder = BatchDecoder(modules, 2, CONTEXT, torch.device("cpu"), torch.float32)
    assert decoder.no_grouped_attention_reason == "transformers' sdpa path folds grouped query heads itself"
    assert modules.text_config._attn_implementation == "sdpa"
    decoder.self_check()
