"""In-flight batching of the torch target's generators, served by the real tritonserver on the CPU.

One server holds three copies of model_repository/tiny-torch's LLM (hard links, their config's scheduling
parameters changed): `llm` as built (in-flight batching, 8 rows), `llm_one_row` (one row, one request may wait)
and `llm_per_thread` (inflight_batching off: one generation per worker thread, the loop before batching); and its
VLM as built.
Streams go over real gRPC through the orchestrator's Triton client.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.request

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from orchestrator.errors import ModelBusyError
from orchestrator.models import contracts
from orchestrator.triton.client import TritonClient
from orchestrator.triton.launcher import TritonServer
from orchestrator.triton.models import GenerationOptions, TritonModels, _chunks, _strings
from tests.conftest import ROOT
from thinkserve_bench.gpu.served_models import renamed_copy

pytestmark = pytest.mark.integration

BUILT_LLM = ROOT / "model_repository" / "tiny-torch" / "llm"
COPIES = {
    "llm": {},
    "llm_one_row": {"max_batch_sequences": "1", "max_waiting_generations": "1"},
    "llm_per_thread": {"inflight_batching": "false"},
    "llm_handoff": {"inline_delivery": "false"},  # a lone request's tokens from the delivery thread, as on a GPU
}
PROMPTS = [
    f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    for question in (
        "What was the revenue?", "Who runs the Aarhus factory?", "Summarise the report.", "How many employees?",
        "Which risks are named?", "What changed in 2024?",
    )
]


@pytest.fixture(scope="module")
def llm_copies(triton_settings, tmp_path_factory):
    if not (BUILT_LLM / "config.pbtxt").is_file():
        pytest.fail(f"{BUILT_LLM} is not built: run `make models-torch` (make test does it)")
    repository = tmp_path_factory.mktemp("llm-copies")
    for name, parameters in COPIES.items():
        renamed_copy(BUILT_LLM.parent, contracts.LLM.name, repository, name, parameters)
    renamed_copy(BUILT_LLM.parent, contracts.VLM.name, repository, contracts.VLM.name, {})  # as built
    server = TritonServer(triton_settings.model_copy(update={"model_repository": repository}), required=(contracts.LLM,))
    server.start()
    yield server
    server.stop()


def run(server, work):
    async def main():
        async with TritonClient(server.endpoints.grpc, default_timeout_s=120) as client:
            return await work(client)

    return asyncio.run(main())


class Received:
    """One stream's chunks and when its first and last arrived."""

    def __init__(self):
        self.chunks, self.first_at, self.last_at = [], None, None

    @property
    def tokens(self) -> list[int]:
        return [t for chunk in self.chunks for t in chunk.token_ids]


async def stream(
    client, model: str, prompt: str, max_tokens: int, stop_after: int | None = None, temperature: float = 0.0,
    top_p: float = 1.0, seed: int | None = None,
) -> Received:
    """A generation request to `model` (the LLM contract's tensors), read until its end or `stop_after` chunks
    (leaving early cancels it in Triton)."""
    arrays = {
        "text_input": _strings([prompt]),
        "max_tokens": np.array([[max_tokens]], dtype=np.int32),
        "temperature": np.array([[temperature]], dtype=np.float32),
        "top_p": np.array([[top_p]], dtype=np.float32),
    }
    if seed is not None:
        arrays["seed"] = np.array([[seed]], dtype=np.uint64)
    received = Received()
    async with client.stream(model, arrays, request_id=f"{model}-{time.time_ns()}") as responses:
        async for chunk in _chunks(responses):
            now = time.monotonic()
            received.first_at = received.first_at or now
            received.last_at = now
            received.chunks.append(chunk)
            if stop_after is not None and len(received.chunks) >= stop_after:
                break
    return received


def most_at_once(streams: list[Received]) -> int:
    """The most streams that were between their first and last chunk at one moment."""
    events = sorted([(r.first_at, 1) for r in streams] + [(r.last_at, -1) for r in streams], key=lambda e: (e[0], e[1]))
    running = most = 0
    for _, change in events:
        running += change
        most = max(most, running)
    return most


def metric(server, name: str, **labels) -> float:
    """A series of Triton's Prometheus endpoint (the generators' custom metrics)."""
    text = urllib.request.urlopen(server.endpoints.metrics, timeout=10).read().decode()
    wanted = ",".join(f'{key}="{value}"' for key, value in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{{{wanted}}} is not among Triton's metrics")


def test_concurrent_streams_run_together_and_stream_the_tokens_they_get_alone(llm_copies):
    """Six streams at once against the batched LLM: at least four stream at the same time (they share the forward
    passes), and each gets exactly the tokens, log-probabilities and finish it gets alone, as through the per-thread
    loop."""

    async def work(client):
        alone = [await stream(client, "llm", prompt, 48) for prompt in PROMPTS]
        # one round: the streams' first chunks once staggered by 0.5 s in about one run in six (five requests
        # waiting while the first ran alone): Triton's dynamic batcher missing a wake-up when a queue policy stopped
        # its prefetching (ServingOptions.max_queue_size); the build writes no policy since
        together = await asyncio.gather(*(stream(client, "llm", prompt, 48) for prompt in PROMPTS))
        per_thread = await asyncio.gather(*(stream(client, "llm_per_thread", prompt, 48) for prompt in PROMPTS))
        return alone, together, per_thread

    alone, together, per_thread = run(llm_copies, work)
    assert [r.tokens for r in together] == [r.tokens for r in alone] == [r.tokens for r in per_thread]
    for batched, single in zip(together, alone):
        assert np.allclose([p for c in batched.chunks for p in c.log_probs], [p for c in single.chunks for p in c.log_probs], atol=1e-4)
        assert batched.chunks[-1].finish_reason == single.chunks[-1].finish_reason
        assert batched.chunks[-1].prompt_tokens == single.chunks[-1].prompt_tokens
    assert most_at_once(together) >= 4  # (the per-thread loop runs two at a time; seen from the client, responses
    # of different streams may arrive out of the server's order, so its overlap is not asserted)
    assert metric(llm_copies, "thinkserve_generator_inflight_batching", model="llm") == 1
    assert metric(llm_copies, "thinkserve_generator_inflight_batching", model="llm_per_thread") == 0
    assert metric(llm_copies, "thinkserve_generator_sequences", model="llm", state="rows") == 8
    # the batched model's decode steps fold its 4 query heads onto their 2 key/value heads: this project's fold
    # (torch_decode_attention) where the model environment's transformers copies them, else transformers' own;
    # the log says which
    loaded = next(line for line in llm_copies.log_path.read_text().splitlines() if '"llm: in-flight batching' in line)
    assert "a lone request's tokens sent from the scheduler's thread" in loaded  # on the CPU (inline_delivery)
    assert ("attention: grouped query heads folded in a decode step (torch_decode_attention)" in loaded
            or "attention: sdpa (transformers' sdpa path folds grouped query heads itself)" in loaded), loaded


def test_tokens_sent_from_the_delivery_thread_are_the_ones_sent_inline(llm_copies):
    """`inline_delivery` off (the GPU default): a lone stream's tokens all leave from the delivery thread, and they
    are the tokens, log-probabilities and finish the inline copy sends."""

    async def work(client):
        return ([await stream(client, "llm", prompt, 24) for prompt in PROMPTS[:2]],
                [await stream(client, "llm_handoff", prompt, 24) for prompt in PROMPTS[:2]])

    inline, handed_off = run(llm_copies, work)
    assert [r.tokens for r in handed_off] == [r.tokens for r in inline]
    for sent, reference in zip(handed_off, inline):
        assert np.allclose([p for c in sent.chunks for p in c.log_probs], [p for c in reference.chunks for p in c.log_probs], atol=1e-4)
        assert sent.chunks[-1].finish_reason == reference.chunks[-1].finish_reason
    loaded = next(line for line in llm_copies.log_path.read_text().splitlines() if '"llm_handoff: in-flight batching' in line)
    assert "every token sent from the delivery thread" in loaded, loaded


def test_vlm_streams_with_images_batch_and_equal_alone(llm_copies):
    """The VLM's prompts are embeddings with each image's features spliced in: streams of different images and
    prompts batched together get the tokens each gets alone."""
    from tests.integration.test_models import png

    cases = [("<image>\nWhat does this chart show?", png(seed=7)), ("<image>\nDescribe the page.", png(90, 140, seed=8)),
             ("Compare: <image>\nwith the text.", png(160, 60, seed=9))]

    async def one(models, text, image):
        async with models.generate(text, GenerationOptions(max_tokens=10), images=[image]) as chunks:
            return [chunk async for chunk in chunks]

    async def work(client):
        models = TritonModels(client)
        alone = [await one(models, text, image) for text, image in cases]
        together = await asyncio.gather(*(one(models, text, image) for text, image in cases))
        return alone, together

    alone, together = run(llm_copies, work)
    for single, batched in zip(alone, together):
        assert [t for c in batched for t in c.token_ids] == [t for c in single for t in c.token_ids]
        assert batched[-1].prompt_tokens == single[-1].prompt_tokens > 10  # the image's features joined the prompt
    assert metric(llm_copies, "thinkserve_generator_inflight_batching", model="vlm") == 1


def test_sampling_follows_each_requests_seed_in_a_batch(llm_copies):
    """Seeded sampling: three streams sampled together each draw the tokens they draw alone from their seed."""

    def sampled(client, seed, prompt):
        return stream(client, "llm", prompt, 16, temperature=1.0, top_p=0.9, seed=seed)

    async def work(client):
        alone = [await sampled(client, seed, prompt) for seed, prompt in enumerate(PROMPTS[:3])]
        together = await asyncio.gather(*(sampled(client, seed, prompt) for seed, prompt in enumerate(PROMPTS[:3])))
        return alone, together

    alone, together = run(llm_copies, work)
    assert [r.tokens for r in together] == [r.tokens for r in alone]
    assert all(len(r.tokens) > 0 for r in together)


def test_a_cancelled_stream_frees_its_row(llm_copies):
    """One row: a long generation cancelled after three tokens leaves its row, and the request waiting for it
    runs to its end; the model says how many tokens the cancelled one produced."""

    async def work(client):
        long = asyncio.create_task(stream(client, "llm_one_row", PROMPTS[0], 1900, stop_after=3))
        await asyncio.sleep(0.2)  # it holds the row
        waiting = asyncio.create_task(stream(client, "llm_one_row", PROMPTS[1], 6))
        return await long, await waiting

    long, waiting = run(llm_copies, work)
    assert len(long.chunks) == 3
    assert waiting.chunks[-1].finish_reason in ("length", "eos") and waiting.chunks[-1].completion_tokens <= 6
    deadline, line = time.monotonic() + 10, ""
    while time.monotonic() < deadline and not line:
        line = next((entry for entry in llm_copies.log_path.read_text().splitlines()
                     if "llm_one_row: request" in entry and "cancelled after" in entry), "")
        time.sleep(0.2)
    assert line, "the model never reported the cancellation"
    assert int(line.split("cancelled after ")[1].split()[0]) < 1900
    deadline = time.monotonic() + 10
    while metric(llm_copies, "thinkserve_generator_sequences", model="llm_one_row", state="running") != 0:
        assert time.monotonic() < deadline, "the cancelled generation still holds its row"
        time.sleep(0.2)


def test_past_its_rows_and_queue_a_request_is_refused_as_busy(llm_copies):
    """One row and one waiting place: a third request is refused at once with the numbers, as backpressure
    (ModelBusyError: the model's circuit breaker does not count it), and the model serves on."""

    async def work(client):
        running = asyncio.create_task(stream(client, "llm_one_row", PROMPTS[0], 1900))
        await asyncio.sleep(0.3)
        waiting = asyncio.create_task(stream(client, "llm_one_row", PROMPTS[1], 4))
        await asyncio.sleep(0.3)
        assert not running.done(), "the long generation ended before the row was shown full"
        with pytest.raises(ModelBusyError) as refused:
            await stream(client, "llm_one_row", PROMPTS[2], 4)
        breaker = client.health_snapshot().breakers["llm_one_row"]
        running.cancel()  # leaving its stream cancels the request: the waiting one takes the row
        with contextlib.suppress(asyncio.CancelledError):
            await running
        waited = await waiting
        after = await stream(client, "llm_one_row", PROMPTS[3], 4)
        return refused.value, breaker, waited, after

    refused, breaker, waiting, after = run(llm_copies, work)
    assert "1 generations running and 1 waiting (max_waiting_generations 1)" in str(refused)
    assert breaker.consecutive_failures == 0 and breaker.state == "closed"
    assert waiting.chunks[-1].finish_reason in ("length", "eos")
    assert after.chunks[-1].finish_reason in ("length", "eos")


def test_the_torch_target_serves_its_generators_batched():
    """What the build writes for the torch target: both generators batch in flight, with bounded rows and queue."""
    for name in ("llm", "vlm"):
        config = text_format.Parse(
            (ROOT / "model_repository" / "tiny-torch" / name / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
        )
        parameters = {key: value.string_value for key, value in config.parameters.items()}
        assert parameters["inflight_batching"] == "true"
        assert int(parameters["max_batch_sequences"]) >= 1 and int(parameters["max_waiting_generations"]) >= 1


def test_the_batching_benchmark_runs_and_finds_the_same_tokens(tmp_path, triton_settings):
    """benchmarks/thinkserve_bench/scripts/generator_batching.py, small: the four copies served (--attention-copy:
    batched with transformers' sdpa attention too; --threads-copy 2: batched with two intra-op threads), every
    stream's tokens compared with the same prompt generated alone."""
    from thinkserve_bench.result_files import read_json
    from thinkserve_bench.command import main as benchmark

    benchmark(["generator_batching",
        "--streams", "1", "3", "--rounds", "1", "--new-tokens", "8", "--prompt-tokens", "16",
        "--model-environment", str(triton_settings.model_environment), "--output", str(tmp_path), "--name", "smoke",
        "--attention-copy", "--threads-copy", "2",
    ])
    result = read_json(tmp_path / "smoke.json")
    levels = result["result"]["levels"]
    assert [level["streams"] for level in levels] == [1, 3]
    for level in levels:
        for copy in ("batched", "per_thread", "batched_sdpa", "batched_2_threads"):
            assert level[copy]["same_tokens_as_alone"] and level[copy]["tokens"] == 8 * level["streams"]
        assert level["batched_over_batched_sdpa"] > 0 and level["batched_over_threads_copy"] > 0
    assert result["copies"] == ["batched", "per_thread", "batched_sdpa", "batched_2_threads"]
    assert result["parameters"]["intra_op_threads"] == "1"  # the build's: ServingOptions.generator_cpu_threads
    report = (tmp_path / "smoke.md").read_text()
    assert "| 3 | batched_sdpa |" in report and "| 3 | batched_2_threads |" in report
    assert "Batched as built (intra_op_threads 1) over batched_2_threads" in report
    assert "Goal (8 streams" not in report  # no 8-stream level was run
