"""In-flight batching (thinkserve_backend.inflight_batching over torch_batch_decoding.BatchDecoder), in process on a
small random-weight Qwen2 built from a config: requests that join and leave a running batch get exactly the tokens
they get alone (greedy and seeded sampling), a cancelled request frees its row for a waiting one, the queue is
bounded, and a model failure ends only the requests it touched. The same code served by the real tritonserver:
tests/integration/test_inflight_batching.py."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from torch.utils._python_dispatch import TorchDispatchMode

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from thinkserve_backend.decoding import GenerationParams, SequenceProgress, generate  # noqa: E402
from thinkserve_backend.inflight_batching import (  # noqa: E402
    BUSY_MARKER,
    BatchedGeneration,
    GenerationQueueFull,
    InflightBatcher,
)
from thinkserve_backend.torch_batch_decoding import BatchDecoder, kv_bytes_per_token  # noqa: E402
from thinkserve_backend.torch_decode_graphs import bucket_of, power_buckets  # noqa: E402
from thinkserve_backend.torch_decoding import TorchKVCacheDecoder  # noqa: E402
from thinkserve_backend.torch_modules import GeneratorModules, TokenEmbeddings, generator_modules  # noqa: E402

CONTEXT = 256
VOCAB = 512
EOS = 2


@pytest.fixture(scope="module")
def modules() -> GeneratorModules:
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=CONTEXT, initializer_range=0.2, eos_token_id=EOS,
    )
    model = transformers.Qwen2ForCausalLM(config).eval()
    return generator_modules(model, vision=False)


def prompts(count: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB, size=(1, int(n))) for n in rng.integers(4, 60, size=count)]


def alone(modules: GeneratorModules, prompt, params: GenerationParams) -> list[int]:
    """One request at a time: decoding.generate over the per-thread decoder (the loop the batcher replaced)."""
    decoder = TorchKVCacheDecoder(modules, CONTEXT, torch.device("cpu"), torch.float32)
    steps = generate(decoder, prompt, params, decode=lambda ids: "", eos_token_ids=[EOS], max_context=CONTEXT)
    return [t for step in steps for t in step.token_ids]


class Collector:
    """What one request receives: its steps, its failure, and when it ended."""

    def __init__(self, cancel_after: int | None = None):
        self.steps, self.error, self.done = [], None, threading.Event()
        self.started = threading.Event()
        self.cancel_after = cancel_after

    def emit(self, step):
        self.steps.append(step)
        self.started.set()
        if step.finish_reason:
            self.done.set()

    def fail(self, error):
        self.error = error
        self.done.set()

    def is_cancelled(self) -> bool:
        return self.cancel_after is not None and len(self.steps) >= self.cancel_after

    @property
    def tokens(self) -> list[int]:
        return [t for step in self.steps for t in step.token_ids]


def submit(batcher, prompt, params, collector: Collector) -> None:
    progress = SequenceProgress(params, prompt.shape[1], CONTEXT, lambda ids: "", [EOS])
    batcher.submit(BatchedGeneration(prompt, progress, collector.emit, collector.fail, collector.is_cancelled))


def batcher_of(modules, rows: int, max_waiting: int = 64, max_prefill_tokens: int = 4096,
               bucketed: bool = False) -> InflightBatcher:
    decoder = BatchDecoder(modules, rows, CONTEXT, torch.device("cpu"), torch.float32)
    if bucketed:  # the shapes the CUDA graphs run at (rows and length rounded up), eagerly
        decoder.use_bucketed_steps(min_length=16)
    return InflightBatcher(
        decoder, max_waiting=max_waiting, max_prefill_tokens=max_prefill_tokens, name="test", cancel_check_interval_s=0.0,
    )


@pytest.mark.parametrize("bucketed", [False, True], ids=["exact shapes", "bucketed shapes"])
def test_requests_joining_a_running_batch_get_the_tokens_they_get_alone(modules, bucketed):
    """Ten requests, greedy and seeded sampling mixed, through four rows: they join as rows free up (mid-flight),
    and each one's tokens, log-probabilities and entropies are its own one-at-a-time run's. Bucketed: every decode
    step at the shapes a CUDA graph replays (1, 2 or 4 rows, padding rows at position 0 of free rows; 16 to 256
    attended positions), run eagerly since there is no GPU here: the same tokens."""
    cases = [
        (prompt, GenerationParams(24 + i, temperature=0.0 if i % 3 else 0.9, top_p=1.0 if i % 2 else 0.8, seed=i))
        for i, prompt in enumerate(prompts(10))
    ]
    expected = [alone(modules, prompt, params) for prompt, params in cases]
    batcher = batcher_of(modules, rows=4, max_prefill_tokens=128, bucketed=bucketed)  # prefill in small groups too
    assert batcher.decoder.decode_mode == ("bucketed" if bucketed else "eager")
    try:
        collectors = [Collector() for _ in cases]
        for (prompt, params), collector in zip(cases, collectors):
            submit(batcher, prompt, params, collector)
        assert all(c.done.wait(60) for c in collectors)
    finally:
        batcher.close()
    assert [c.tokens for c in collectors] == expected
    assert all(c.error is None for c in collectors)
    assert all(c.steps[-1].finish_reason in ("eos", "length") for c in collectors)
    assert batcher.state().running == 0 and batcher.state().waiting == 0


def test_measures_match_the_one_at_a_time_path(modules):
    prompt, params = prompts(1, seed=3)[0], GenerationParams(16, entropies=True)
    decoder = TorchKVCacheDecoder(modules, CONTEXT, torch.device("cpu"), torch.float32)
    reference = list(generate(decoder, prompt, params, decode=lambda ids: "", eos_token_ids=[EOS], max_context=CONTEXT))
    batcher = batcher_of(modules, rows=2)
    try:
        collector, other = Collector(), Collector()
        submit(batcher, prompts(1, seed=4)[0], GenerationParams(40), other)  # a neighbour in the batch
        submit(batcher, prompt, params, collector)
        assert collector.done.wait(60) and other.done.wait(60)
    finally:
        batcher.close()
    assert [s.token_ids for s in collector.steps] == [s.token_ids for s in reference]
    assert np.allclose([s.log_probs for s in collector.steps], [s.log_probs for s in reference], atol=1e-4)
    assert np.allclose([s.normalized_entropy for s in collector.steps], [s.normalized_entropy for s in reference], atol=1e-5)
    assert [s.completion_tokens for s in collector.steps] == list(range(1, len(reference) + 1))


def test_a_cancelled_request_frees_its_row_for_a_waiting_one(modules):
    batcher = batcher_of(modules, rows=1)
    try:
        long, waiting = Collector(cancel_after=3), Collector()
        submit(batcher, prompts(1)[0], GenerationParams(CONTEXT), long)
        submit(batcher, prompts(1, seed=1)[0], GenerationParams(5), waiting)
        assert long.done.wait(60) and waiting.done.wait(60)
    finally:
        batcher.close()
    # steps reach the request on the delivery thread, a little after they are made: it stops within a few tokens
    assert long.steps[-1].finish_reason == "cancelled" and 3 <= long.steps[-1].completion_tokens < 3 + 4 * 1 + 2
    assert waiting.steps[-1].finish_reason in ("length", "eos") and waiting.error is None


def test_past_its_rows_and_queue_a_request_is_refused_with_the_numbers(modules):
    batcher = batcher_of(modules, rows=1, max_waiting=1)
    try:
        running, queued = Collector(cancel_after=40), Collector()
        submit(batcher, prompts(1)[0], GenerationParams(CONTEXT), running)
        assert running.started.wait(60)  # in its row: the next one waits
        submit(batcher, prompts(1, seed=1)[0], GenerationParams(3), queued)
        with pytest.raises(GenerationQueueFull) as refused:
            submit(batcher, prompts(1, seed=2)[0], GenerationParams(3), Collector())
        assert running.done.wait(60) and queued.done.wait(60)
    finally:
        batcher.close()
    message = str(refused.value)
    assert message.startswith(BUSY_MARKER) and "waiting" in message and "max_waiting_generations 1" in message
    assert queued.steps[-1].finish_reason in ("length", "eos")


def test_a_prompt_the_model_refuses_fails_alone(modules):
    """A prompt longer than the cache fails in prefill: prefilled beside another new prompt, the group is retried
    one by one, so only it fails; the request already running goes on untouched."""
    batcher = batcher_of(modules, rows=3)
    try:
        running, too_long, beside = Collector(), Collector(), Collector()
        submit(batcher, prompts(1)[0], GenerationParams(30), running)
        assert running.started.wait(60)
        huge = np.full((1, CONTEXT + 8), 5)
        progress = SequenceProgress(GenerationParams(4), 10, CONTEXT, lambda ids: "", [EOS])  # lies about its length
        with batcher._condition:  # both wait before the scheduler's next admission: they are prefilled together
            batcher.submit(BatchedGeneration(huge, progress, too_long.emit, too_long.fail))
            submit(batcher, prompts(1, seed=1)[0], GenerationParams(6), beside)
        assert running.done.wait(60) and too_long.done.wait(60) and beside.done.wait(60)
    finally:
        batcher.close()
    assert isinstance(too_long.error, ValueError) and "exceeds the cache" in str(too_long.error)
    assert running.error is None and running.steps[-1].finish_reason in ("length", "eos")
    assert beside.error is None and beside.tokens == alone(modules, prompts(1, seed=1)[0], GenerationParams(6))


def test_closing_cancels_what_runs_and_waits(modules):
    batcher = batcher_of(modules, rows=1)
    running, waiting = Collector(), Collector()
    submit(batcher, prompts(1)[0], GenerationParams(CONTEXT - 64), running)
    submit(batcher, prompts(1, seed=1)[0], GenerationParams(4), waiting)
    batcher.close()
    assert running.done.is_set() and waiting.done.is_set()
    assert running.steps[-1].finish_reason in ("cancelled", "eos", "length")
    assert waiting.steps[-1].finish_reason == "cancelled"
    with pytest.raises(RuntimeError, match="shutting down"):
        submit(batcher, prompts(1)[0], GenerationParams(2), Collector())


def test_prompts_as_embeddings_decode_as_the_ids_do(modules):
    """A VLM's prompt arrives as embeddings (image features spliced in): the batcher embeds each new token on the
    model's device; with a text-only prompt's embeddings the tokens are the ids' own."""
    embedding = TokenEmbeddings(modules.backbone.get_input_embeddings())
    vision_like = GeneratorModules(modules.backbone, modules.lm_head, modules.text_config, embeddings=embedding)
    cases = prompts(3, seed=7)
    expected = [alone(modules, prompt, GenerationParams(12)) for prompt in cases]
    decoder = BatchDecoder(vision_like, 2, CONTEXT, torch.device("cpu"), torch.float32)
    decoder.self_check()
    batcher = InflightBatcher(decoder, max_waiting=8, max_prefill_tokens=4096)
    try:
        collectors = [Collector() for _ in cases]
        for prompt, collector in zip(cases, collectors):
            with torch.inference_mode():
                embedded = embedding(torch.from_numpy(prompt)).numpy()
            submit(batcher, embedded, GenerationParams(12), collector)
        assert all(c.done.wait(60) for c in collectors)
    finally:
        batcher.close()
    assert [c.tokens for c in collectors] == expected


def test_the_load_check_catches_a_cache_the_model_ignores(modules, monkeypatch):
    for rows in (1, 2):
        BatchDecoder(modules, rows, CONTEXT, torch.device("cpu"), torch.float32).self_check()  # the real cache passes
    decoder = BatchDecoder(modules, 2, CONTEXT, torch.device("cpu"), torch.float32)
    monkeypatch.setattr(type(decoder.cache), "update", lambda self, k, v, layer, kwargs=None: (k, v))
    with pytest.raises(RuntimeError, match="check at load failed"):
        decoder.self_check()


def test_the_cache_is_allocated_once_at_its_bound(modules):
    decoder = BatchDecoder(modules, 3, CONTEXT, torch.device("cpu"), torch.float32)
    per_token = kv_bytes_per_token(modules.text_config, torch.float32)
    assert per_token == 2 * 2 * 2 * (64 // 4) * 4  # keys and values, 2 layers, 2 KV heads, head dim 16, fp32
    assert decoder.cache.nbytes == 3 * CONTEXT * per_token


@pytest.mark.parametrize("inline", [True, False], ids=["sent inline", "sent from the delivery thread"])
def test_a_lone_requests_steps_are_sent_inline_or_from_the_delivery_thread(modules, inline):
    """inline_lone_steps (the served model's `inline_delivery`: on the CPU by default, off on a GPU): a lone
    request's steps reach it on the scheduler's thread, or every one on the delivery thread; the tokens are the same."""
    prompt, params = prompts(1, seed=7)[0], GenerationParams(12)
    decoder = BatchDecoder(modules, 2, CONTEXT, torch.device("cpu"), torch.float32)
    batcher = InflightBatcher(decoder, max_waiting=4, max_prefill_tokens=4096, name="lone", inline_lone_steps=inline)
    threads: list[str] = []
    collector = Collector()
    emit = collector.emit
    collector.emit = lambda step: (threads.append(threading.current_thread().name), emit(step))
    try:
        submit(batcher, prompt, params, collector)
        assert collector.done.wait(60)
    finally:
        batcher.close()
    assert collector.tokens == alone(modules, prompt, params) and len(threads) >= 2
    assert set(threads) == {"lone-batcher" if inline else "lone-delivery"}


def test_steps_queued_behind_a_slow_delivery_go_out_together():
    """What a request receives when delivery falls behind: its queued steps joined, in order, nothing lost."""
    from thinkserve_backend.decoding import GenerationStep
    from thinkserve_backend.inflight_batching import merged

    class Request:
        pass

    a, b = Request(), Request()

    def step(n, finish=""):
        return GenerationStep(f"t{n}", [n], [-0.1 * n], [0.01 * n], n, finish)

    items = [("emit", a, step(1)), ("emit", b, step(1)), ("emit", a, step(2)), ("emit", a, step(3, "length")),
             ("emit", b, step(2)), ("fail", b, ValueError("gone"))]
    out = merged(items)
    assert [(h, g is a) for h, g, _ in out] == [("emit", True), ("emit", False), ("fail", False)]
    first = out[0][2]
    assert first.text == "t1t2t3" and first.token_ids == [1, 2, 3] and first.completion_tokens == 3
    assert first.finish_reason == "length" and np.allclose(first.log_probs, [-0.1, -0.2, -0.3])
    assert out[1][2].token_ids == [1, 2] and isinstance(out[2][2], ValueError)
    # nothing joins a finished step
    assert len(merged([("emit", a, step(1, "eos")), ("emit", a, step(2))])) == 2


def test_a_scheduler_fault_fails_what_runs_and_serving_goes_on(modules, monkeypatch):
    """A defect in choosing tokens (here: an exception on the first decode step) fails the running requests with a
    message naming it; the scheduler thread lives on and serves the next request."""
    batcher = batcher_of(modules, rows=2)
    try:
        original = batcher.decoder.choose
        calls = {"n": 0}

        def broken_once(logits, rows):
            calls["n"] += 1
            if calls["n"] == 2:  # after the prefill's choice: the first decode step
                raise IndexError("boom")
            return original(logits, rows)

        monkeypatch.setattr(batcher.decoder, "choose", broken_once)
        hit, after = Collector(), Collector()
        submit(batcher, prompts(1)[0], GenerationParams(20), hit)
        assert hit.done.wait(60)
        submit(batcher, prompts(1, seed=1)[0], GenerationParams(5), after)
        assert after.done.wait(60)
    finally:
        batcher.close()
    assert isinstance(hit.error, RuntimeError) and "IndexError: boom" in str(hit.error)
    assert after.error is None and after.steps[-1].finish_reason in ("length", "eos")


def test_decode_buckets_cover_every_size_up_to_the_largest():
    assert power_buckets(32) == (1, 2, 4, 8, 16, 32) and power_buckets(24) == (1, 2, 4, 8, 16, 24)
    assert power_buckets(8192, 256) == (256, 512, 1024, 2048, 4096, 8192) and power_buckets(100, 256) == (100,)
    assert [bucket_of(n, power_buckets(24)) for n in (1, 3, 5, 17, 24)] == [1, 4, 8, 24, 24]
    with pytest.raises(ValueError, match="exceeds"):
        bucket_of(25, power_buckets(24))


def test_a_padded_step_gives_the_real_rows_the_logits_of_an_exact_one(modules):
    """Three running rows decoded at bucketed shapes (4 rows, 64 positions): their logits are the exact step's, and
    the padding row only wrote position 0 of a free row, which that row's next prefill overwrites."""
    exact = BatchDecoder(modules, 4, CONTEXT, torch.device("cpu"), torch.float32)
    padded = BatchDecoder(modules, 4, CONTEXT, torch.device("cpu"), torch.float32)
    padded.use_bucketed_steps(min_length=64)
    rows = [p for p in prompts(3, seed=5)]
    for decoder in (exact, padded):
        decoder.prefill(0, rows)
    positions = [r.shape[1] for r in rows]
    expected = exact.decode([7, 8, 9], positions)
    got = padded.decode([7, 8, 9], positions)
    assert got.shape == expected.shape == (3, VOCAB)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert padded.cache.keys[0][3, :, 1:].abs().max() == 0  # the padding row: position 0 alone


def test_cuda_graphs_are_declined_off_a_gpu_and_the_eager_step_stays(modules):
    decoder = BatchDecoder(modules, 2, CONTEXT, torch.device("cpu"), torch.float32)
    assert decoder.use_cuda_graphs() == "no CUDA graphs on cpu"
    assert decoder.decode_mode == "eager"


class HostReads(TorchDispatchMode):
    """Records the operators that read a tensor's value back to the host or give a shape that depends on values:
    under CUDA graph capture each of them fails the capture (a captured step may not synchronise with the host)."""

    READS = {"aten::_local_scalar_dense", "aten::item", "aten::is_nonzero", "aten::nonzero", "aten::masked_select",
             "aten::_unique2", "aten::unique_dim"}  # item and is_nonzero: how .item() and bool() dispatch in inference mode

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._schema.name in self.READS:
            self.seen.append(func._schema.name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("embedded", [False, True], ids=["token ids", "embeddings (a VLM's text model)"])
def test_the_decode_step_reads_nothing_back_to_the_host(modules, embedded):
    """What a CUDA graph captures (BatchDecoder._step, through this transformers' model code) must not read a value
    back to the host: on the GPU such a read fails the capture and the model falls back to eager steps. Checked on
    the CPU with a dispatch mode that sees every operator; `.item()` in a step is what it catches."""
    if embedded:
        modules = GeneratorModules(modules.backbone, modules.lm_head, modules.text_config,
                                   embeddings=TokenEmbeddings(modules.backbone.get_input_embeddings()))
    decoder = BatchDecoder(modules, 4, CONTEXT, torch.device("cpu"), torch.float32)
    prompt = prompts(1, seed=2)[0]
    with torch.inference_mode():
        decoder.prefill(0, [modules.embeddings(torch.from_numpy(prompt)) if embedded else prompt] * 2)
        ids, positions = torch.tensor([3, 4, 0, 0]), torch.tensor([prompt.shape[1]] * 2 + [0, 0])
        with HostReads() as reads:
            decoder._step(ids, positions, 64)
        assert reads.seen == []
        with HostReads() as reads:  # the check sees a read when there is one
            decoder._step(ids, positions, 64).argmax().item()
        assert reads.seen == ["aten::item"]


def test_eager_steps_set_the_bucketed_or_graphed_step_aside_and_back(modules):
    """What the GPU runner times the CUDA graphs against, in the same process: within `eager_steps` each decode step
    runs at its exact shapes, after it as before."""
    decoder = BatchDecoder(modules, 4, CONTEXT, torch.device("cpu"), torch.float32)
    decoder.use_bucketed_steps(min_length=16)
    with decoder.eager_steps():
        assert decoder.decode_mode == "eager"
    assert decoder.decode_mode == "bucketed"
