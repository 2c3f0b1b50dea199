"""What the GPU device runner records since issue 57, checked without a GPU: the precision of repeated rounds, where
two paths' greedy tokens part and the in-process margins there (replayed on the tiny LLM), levels cut at the
deadline without waiting on stragglers, the routes' order and a record per level, Triton's statistics and the GPU's
samples per unit, and Triton's log copied as it grows. tests/integration/test_gpu_runner_cpu.py runs them all
against the real tritonserver."""

from __future__ import annotations

import asyncio
import json
import math
import os
import stat
import time
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
import pytest

from orchestrator.models import contracts
from tests.conftest import ROOT
from thinkserve_bench.gpu import call_mix, divergence, generator_measurements, observation, options, precision, triton_log
from thinkserve_bench.gpu.generator_measurements import Stream
from thinkserve_bench.gpu.served_models import renamed_copy

TINY_TORCH = ROOT / "model_repository" / "tiny-torch"
needs_tiny_torch = pytest.mark.skipif(not (TINY_TORCH / "llm" / "config.pbtxt").is_file(), reason="make models-torch builds it")


# ---------------------------------------------------------------- precision


def test_an_interval_is_students_and_a_ratio_adds_relative_errors():
    result = precision.interval([10.0, 12.0, 11.0])
    assert result["mean"] == 11.0 and result["n"] == 3
    assert result["half_width"] == pytest.approx(4.303 / math.sqrt(3))  # t(2 df) x sd 1 / sqrt(3)
    assert result["relative"] == pytest.approx(4.303 / math.sqrt(3) / 11)
    assert precision.interval([5.0])["half_width"] is None and precision.interval([])["mean"] is None
    ratio = precision.ratio_interval({"mean": 30.0, "relative": 0.03}, {"mean": 20.0, "relative": 0.04})
    assert ratio == {"ratio": 1.5, "relative": pytest.approx(0.05)}
    assert precision.precise_enough([{"relative": 0.04}, {"relative": 0.05}], 0.05)
    assert not precision.precise_enough([{"relative": 0.04}, {"relative": None}], 0.05)


# ---------------------------------------------------------------- divergence


def test_the_first_divergence_and_the_margins_there():
    assert divergence.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert divergence.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert divergence.first_divergence([1, 2], [1, 2, 7]) == 2  # one ended (end of sequence) where the other went on
    stream = divergence.stream_divergence(3, [1, 2, 9], [1, 2, 4])
    assert stream == {"stream": 3, "first_divergent_token": 2, "tokens": [3, 3], "in_process_token": 9, "triton_token": 4}
    logits = np.array([0.0, 1.0, 5.0, 4.99, -2.0], dtype=np.float32)
    found = divergence.margins(logits, ours=2, theirs=3)
    assert found["top1_minus_top2"] == pytest.approx(0.01, abs=1e-5) and found["replay_matches"]
    assert found["in_process_minus_triton"] == pytest.approx(0.01, abs=1e-5)
    summary = divergence.summary([{**stream, **found}, divergence.stream_divergence(0, [1], [1])])
    assert summary == {"streams": 2, "diverged": 1, "earliest": 2, "margin_min": found["top1_minus_top2"],
                       "margin_max": found["top1_minus_top2"], "margins": 1}


@needs_tiny_torch
@pytest.mark.parametrize("batched", [True, False], ids=["in-flight batching", "per thread"])
def test_a_replay_gives_the_logits_the_in_process_stream_chose_from(batched, tmp_path):
    """The in-process side schedules as the served model does (the tiny torch repository batches in flight; a copy
    with inflight_batching off runs one generation per thread). The margins are taken from a replay of the stream's
    own steps on a warmed thread of the kept pool: on the tiny LLM it chooses every greedy token the stream chose."""
    repository = TINY_TORCH
    if not batched:
        repository = tmp_path / "repository"
        repository.mkdir()
        renamed_copy(TINY_TORCH, contracts.LLM.name, repository, contracts.LLM.name, {"inflight_batching": "false"})
    model = generator_measurements.InProcessGenerator(repository, contracts.LLM.name, "cpu")
    try:
        prompt = "revenue growth quarter region margin report annual table figure page total"
        warmed = model.warm([prompt], [], 2)
        if batched:  # the served rows, warmed by one round
            assert model.scheduling == "in-flight batching" and model.batcher.decoder.slots == 8 and len(warmed) == 1
        else:  # every thread of the pool, each with its own KV cache
            assert model.scheduling == "one generation per thread" and len(warmed) == model.workers
        assert all(s.tokens == 2 and not s.error for s in warmed)
        threads = {thread.name for thread in model.pool._threads}
        (stream,) = model.level([prompt], [], 6)
        assert stream.tokens == len(stream.token_ids) >= 2 and not stream.error
        assert {thread.name for thread in model.pool._threads} == threads  # the warmed threads, no new ones
        for k, token in enumerate(stream.token_ids):
            logits = model.logits_at(prompt, [], stream.token_ids[:k])
            assert divergence.margins(logits, token, None)["replay_matches"], k
        (cut,) = model.level([prompt], [], 50, deadline=time.time() - 1)  # past its deadline: cut, not waited for
        assert cut.error == "cut: out of time" and cut.finish_reason == "cancelled"
    finally:
        model.close()


@needs_tiny_torch
def test_the_in_process_side_falls_back_as_the_served_model_does(monkeypatch):
    """A batch decoder that fails its check at load (a transformers whose attention ignores the cache it is handed)
    makes the served model generate one sequence per thread (models.generator); the in-process side does the same
    and says why, instead of failing the whole generators part on the GPU machine's transformers."""
    from thinkserve_backend.torch_batch_decoding import BatchDecoder

    def failing_check(self):
        raise RuntimeError("the batch decoder's check at load failed: batched logits differ")

    monkeypatch.setattr(BatchDecoder, "self_check", failing_check)
    model = generator_measurements.InProcessGenerator(TINY_TORCH, contracts.LLM.name, "cpu")
    try:
        assert model.batcher is None and model.scheduling == "one generation per thread"
        assert "batched logits differ" in model.no_batching_reason
        (stream,) = model.level(["revenue growth quarter region margin report"], [], 4)
        assert stream.tokens >= 1 and not stream.error
    finally:
        model.close()


# ---------------------------------------------------------------- rounds until precise


class _Model:
    """An in-process side whose rounds take `durations` (seconds per stream, one per round) and produce `tokens`."""

    workers = 2

    def __init__(self, durations, tokens):
        self.durations, self.tokens, self.rounds, self.replayed = list(durations), tokens, 0, []

    def level(self, prompts, images, max_tokens, deadline=math.inf):
        duration = self.durations[min(self.rounds, len(self.durations) - 1)]
        self.rounds += 1
        return [Stream(0.0, 0.01, duration, len(self.tokens), 8, "length", list(self.tokens)) for _ in prompts]

    def logits_at(self, text, images, tokens):
        self.replayed.append(tuple(tokens))
        logits = np.zeros(16, dtype=np.float32)
        logits[self.tokens[len(tokens)]] = 2.0
        logits[7] = 1.5
        return logits


def _options(**values) -> options.Options:
    return options.Options(("generators",), "cpu", **{"generator_min_rounds": 3, "generator_max_rounds": 6,
                                                       "generator_min_tokens": 8, "generator_precision": 0.05, **values})


def test_a_level_repeats_until_both_paths_are_precise_and_records_where_tokens_part(monkeypatch):
    theirs = [3, 4, 7, 6]

    async def triton_level(models, prompts, images, max_tokens, deadline=math.inf):
        return [Stream(0.0, 0.01, 2.0, 4, 8, "length", list(theirs)) for _ in prompts]

    monkeypatch.setattr(generator_measurements, "triton_level", triton_level)
    steady, replays = _Model([1.0], [3, 4, 5, 6]), {}
    row = asyncio.run(generator_measurements._level(steady, None, ["a", "b"], [], _options(), replays, print))
    assert row["rounds"] == 3 and row["stopped_by"] == "precision"  # identical rounds: the interval is 0 wide
    assert row["in_process"]["tokens_per_s"] == pytest.approx(8 / 1.0) and row["triton"]["tokens_per_s"] == pytest.approx(8 / 2.0)
    assert row["throughput_ratio"] == pytest.approx(0.5) and row["in_process_repeatable"] and not row["same_tokens"]
    first = row["divergence"][0]
    assert first["first_divergent_token"] == 2 and (first["in_process_token"], first["triton_token"]) == (5, 7)
    assert first["top1_minus_top2"] == pytest.approx(0.5) and first["in_process_minus_triton"] == pytest.approx(0.5)
    assert row["divergence_summary"]["diverged"] == 2 and steady.replayed == [(3, 4), (3, 4)]  # one per prompt
    asyncio.run(generator_measurements._level(steady, None, ["a"], [], _options(), replays, print))
    assert len(steady.replayed) == 2  # a prompt's stream at a later level: its replay is kept, not run again

    noisy = _Model([1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0], [3, 4, 7, 6])
    row = asyncio.run(generator_measurements._level(noisy, None, ["a"], [], _options(), {}, print))
    assert row["rounds"] == 6 and row["stopped_by"] == "rounds" and row["same_tokens"]
    assert row["in_process"]["tokens_per_s_interval"]["relative"] > 0.05 and row["divergence_summary"]["diverged"] == 0
    late = _options(deadline=time.time() + 15)  # a second round would not end 20 s before the deadline
    assert asyncio.run(generator_measurements._level(_Model([1.0], [3]), None, ["a"], [], late, {}, print))["stopped_by"] == "time"


class _SlowModels:
    """A TritonModels whose streams yield a token every `every` seconds; `stubborn` ones ignore cancellation."""

    def __init__(self, every: float, stubborn: bool = False):
        self.every, self.stubborn = every, stubborn

    @asynccontextmanager
    async def generate(self, prompt, options, images):
        async def chunks():
            for n in range(1, 1000):
                try:
                    await asyncio.sleep(self.every)
                except asyncio.CancelledError:
                    if not self.stubborn:
                        raise
                    await asyncio.sleep(30)  # a straggler: closes long after it was told to
                yield type("Chunk", (), {"token_ids": [n], "completion_tokens": n, "prompt_tokens": 8, "finish_reason": ""})

        yield chunks()


@pytest.mark.parametrize("stubborn", [False, True])
def test_a_triton_level_is_cut_at_its_deadline_without_waiting_on_stragglers(stubborn):
    began = time.monotonic()
    streams = asyncio.run(generator_measurements.triton_level(_SlowModels(0.05, stubborn), ["a", "b"], [], 1000,
                                                              deadline=time.time() + 0.4, grace_s=0.3))
    assert time.monotonic() - began < 1.5
    assert all(s.error == "cut: out of time" and 3 <= s.tokens for s in streams)


# ---------------------------------------------------------------- the call mix


def test_the_routes_run_cheapest_first():
    assert call_mix.route_order(["complex", "unknown", "simple", "moderate"]) == ["simple", "moderate", "complex", "unknown"]


def test_a_replay_level_does_not_wait_on_queries_that_ignore_their_cancellation(monkeypatch):
    from thinkserve_bench.modes import ceiling

    async def stubborn_replay(models, plan, images, tally):
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(10)

    monkeypatch.setattr(ceiling, "replay", stubborn_replay)
    began = time.monotonic()
    level = asyncio.run(call_mix.replay_level(None, ["plan"], [], 2, warmup_s=0.0, window_s=0.1,
                                              until=time.time() + 0.3, grace_s=0.2))
    assert time.monotonic() - began < 1.5 and level["abandoned"] == 2 and level["completed"] == 0


@needs_tiny_torch
def test_the_mix_records_every_level_as_it_ends_simple_first(monkeypatch):
    from orchestrator.triton.models import GeneratorFacts, TritonModels
    from thinkserve_bench.modes import ceiling

    async def facts(self, name):
        return GeneratorFacts(context_tokens=8192, image_tokens=36)

    async def replay(models, plan, images, tally):
        await asyncio.sleep(0.01)

    async def calibrate(models, plans):
        return None

    monkeypatch.setattr(TritonModels, "generator_facts", facts)
    monkeypatch.setattr(ceiling, "replay", replay)
    monkeypatch.setattr(ceiling, "calibrate", calibrate)
    recorded: list[tuple[str, dict]] = []
    units = iter(range(100))

    class Observer:
        def begin(self):
            pass

        def end(self):
            return {"unit": next(units)}

    chosen = options.Options(("mix",), "cpu", mix_concurrency=(1, 2), mix_warmup_s=0.0, mix_window_s=0.05)
    asyncio.run(call_mix.measure_mix(None, TINY_TORCH, chosen, lambda key, value: recorded.append((key, json.loads(json.dumps(value)))),
                                     lambda line: None, Observer()))
    routes = [key for key, _ in recorded if key != "source"]
    assert routes == ["simple"] * 3 + ["moderate"] * 3 + ["complex"] * 3  # after each level, then the route's whole
    levels = [len(value["levels"]) for key, value in recorded if key != "source"]
    assert levels == [1, 2, 2] * 3 and [value["partial"] for key, value in recorded if key == "simple"] == [True, True, False]
    final = dict(recorded)
    assert [lv["observed"]["unit"] for route in ("simple", "moderate", "complex") for lv in final[route]["levels"]] == list(range(6))
    assert final["source"]["route_order"] == ["simple", "moderate", "complex"]


# ---------------------------------------------------------------- the server side of each unit


def _stats(requests: int, queue: int, infer: int, batches: int) -> dict:
    duration = lambda ns: {"count": str(requests), "ns": str(ns)}  # noqa: E731 - Triton's JSON gives strings
    return {"model_stats": [{
        "name": "reranker_score", "execution_count": str(batches), "inference_count": str(requests),
        "inference_stats": {"success": duration(0), "queue": duration(queue), "compute_input": duration(1_000_000),
                            "compute_infer": duration(infer), "compute_output": duration(500_000)},
        "batch_stats": [{"batch_size": "4", "compute_input": {"ns": "250000"}, "compute_infer": {"count": str(batches), "ns": str(infer // 4)},
                         "compute_output": {"ns": "125000"}}],
    }, {"name": "idle", "inference_stats": {}}]}


def test_tritons_statistics_over_a_unit_per_model_and_phase():
    before = observation.counters_by_model(_stats(4, 2_000_000, 8_000_000, 1))
    after = observation.counters_by_model(_stats(12, 10_000_000, 32_000_000, 3))
    (name, delta), = observation.difference(after, before).items()
    assert name == "reranker_score" and delta["requests"] == 8 and delta["executions"] == 2
    assert delta["queue_ms_per_request"] == pytest.approx(8.0 / 8) and delta["compute_infer_ms_per_request"] == pytest.approx(24.0 / 8)
    assert delta["compute_input_ms_per_request"] == 0.0 and delta["mean_batch"] == 4.0
    assert delta["busy_ms"] == pytest.approx((32 - 8) / 4 + 0.0)  # the batch executions' infer (input/output unchanged)


def _fake_nvidia_smi(folder: Path) -> Path:
    """A stand-in for the driver's nvidia-smi in loop mode: a CSV line every 50 ms, utilisation rising."""
    script = folder / "nvidia-smi"
    script.write_text("#!/bin/sh\nn=0\nwhile true; do n=$((n+10)); echo \"$n, $((1000+n))\"; sleep 0.05; done\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_the_gpu_is_sampled_in_the_background_and_summarised_per_unit(tmp_path):
    sampler = observation.GpuSampler(interval_ms=50, command=str(_fake_nvidia_smi(tmp_path))).start()
    try:
        observer = observation.UnitObserver(None, sampler)
        observer.begin()
        time.sleep(0.4)
        unit = observer.end()
    finally:
        sampler.stop()
    gpu = unit["gpu"]
    assert gpu["available"] and gpu["samples"] >= 4 and gpu["utilization_max_pct"] > gpu["utilization_mean_pct"] > 0
    assert gpu["memory_used_max_mib"] == 1000 + gpu["utilization_max_pct"]
    assert unit["triton"] == {"error": "no statistics endpoint"} and unit["window_s"] >= 0.4
    missing = observation.GpuSampler(command=None)
    missing.command = None
    assert missing.start().window(0, time.monotonic())["available"] is False


# ---------------------------------------------------------------- Triton's log


def test_tritons_log_is_copied_as_it_grows_and_capped(tmp_path):
    source, copy = tmp_path / "triton.log", tmp_path / "out" / "gpu-triton.log"
    copy.parent.mkdir()
    path: list[Path] = []  # unknown until the server is launched
    mirror = triton_log.TritonLogMirror(lambda: path[0] if path else None, copy, interval_s=0.05, limit_bytes=64).start()
    try:
        time.sleep(0.1)
        path.append(source)
        source.write_text("I loading: llm\n")
        deadline = time.monotonic() + 2
        while copy.read_text() != "I loading: llm\n" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert copy.read_text() == "I loading: llm\n"  # before the run ends: what a killed command keeps
        with open(source, "a") as log:
            log.write("E model failed\n" + "x" * 100 + "\n")
    finally:
        mirror.stop()
    text = copy.read_text()
    assert text.startswith("I loading: llm\nE model failed\n") and "not copied" in text and len(text) < 64 + 100
    assert os.path.getsize(source) > 64
