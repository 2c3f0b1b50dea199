"""The generators' measurements: the LLM and the VLM (one image, its positions counted in the prompt) with prompts of
an exact number of positions, at several concurrent streams, through Triton (grpc streams) and in-process (the same
checkpoint scheduled as the served model schedules it: in-flight batching, or one generation per thread): TTFT and
tokens per second.

The in-process side lives as long as the model and is warmed before anything is timed, as the served model is (on
the first H200 run a new pool per level left the measured threads cold). A level is
repeated in rounds, both paths each round, until its tokens/s are known to a stated precision (precision.py) or its
rounds or time run out; where the two paths' greedy tokens part, the step and the in-process logit margins there
are recorded for every stream (divergence.py). A level stops at the deadline: streams still running are cut."""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from orchestrator.models import contracts
from orchestrator.triton.client import TritonClient
from orchestrator.triton.models import GenerationOptions, TritonModels

from ..stats import percentile
from . import divergence, precision
from .options import Options
from .served_models import model_names, parameters, read_config, torch_device

WORDS = (
    "revenue growth quarter region margin report annual table figure page total increase decrease market share "
    "customer product service cost price plan board dividend cash equity debt asset value operating income net "
    "profit loss forecast budget segment sales volume supply demand energy water steel freight contract lease "
    "policy employee safety device battery manual study patient treatment result accuracy model baseline test "
    "survey adult concern economy bridge repair library weekday vacation day notice agreement party deposit rent"
).split()



def whole_text_tokenizer(path: Path):
    """The generator's tokenizer as the served model loads it (models.common.whole_text_tokenizer)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def single_token_words(tokenizer, limit: int = 4000) -> list[str]:
    """Alphabetic words that the tokenizer (a byte-level BPE: "Ġ" marks a leading space) encodes as one token after a
    space: texts of n such words take about n tokens, so prompts of a given length are found in a few tries."""
    words = []
    for token, _ in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1]):
        word = token[1:]
        if token.startswith("\u0120") and len(word) >= 3 and word.isascii() and word.isalpha():
            if len(tokenizer.encode(" " + word, add_special_tokens=False).ids) == 1:
                words.append(word)
        if len(words) >= limit:
            break
    return words or list(WORDS)


def exact_prompt(count: Callable[[str], int], positions: int, seed: int, words: Sequence[str] = WORDS) -> str:
    """A text of words whose prompt takes exactly `positions` positions by `count` (the model's own tokenizer): the
    most words that stay within the target (binary search), then one-token fillers."""
    rng = np.random.default_rng(seed)
    pool = [words[i] for i in rng.integers(0, len(words), size=2 * positions + 16)]
    low, high = 0, len(pool)
    while low < high:
        middle = (low + high + 1) // 2
        if count(" ".join(pool[:middle])) <= positions:
            low = middle
        else:
            high = middle - 1
    text = " ".join(pool[:low])
    for filler in (" .", " ,", " x", " the"):
        candidate = text
        while count(candidate) < positions:
            candidate += filler
        if count(candidate) == positions:
            return candidate
    raise ValueError(f"cannot make a prompt of exactly {positions} positions with this tokenizer")


def page_image(seed: int) -> bytes:
    """A page-render-sized PNG (A4 at 40 dpi) with lines of text, as the VLM is sent pages (the ceiling's own)."""
    from thinkserve_bench.modes.ceiling import page_image as ceiling_page_image

    return ceiling_page_image(seed)


@dataclass
class Stream:
    """One generation's times (perf_counter seconds) and what it produced."""

    submitted: float
    first_token: Optional[float] = None
    ended: Optional[float] = None
    tokens: int = 0
    prompt_tokens: int = 0
    finish_reason: str = ""
    token_ids: list[int] = field(default_factory=list)
    error: str = ""


def level_summary(streams: Sequence[Stream]) -> dict:
    """One round's streams: completed, tokens, TTFT percentiles, tokens/s over the round's wall time."""
    done = [s for s in streams if not s.error and s.ended is not None]
    if not done:
        return {"streams": len(streams), "completed": 0, "errors": sorted({s.error for s in streams})[:3]}
    ttft = [s.first_token - s.submitted for s in done if s.first_token is not None]
    wall = max(s.ended for s in done) - min(s.submitted for s in done)
    tokens = sum(s.tokens for s in done)
    decode = [(s.tokens - 1) / (s.ended - s.first_token) for s in done if s.tokens > 1 and s.ended > s.first_token]
    reasons: dict[str, int] = {}
    for s in done:
        reasons[s.finish_reason] = reasons.get(s.finish_reason, 0) + 1
    return {
        "streams": len(streams), "completed": len(done), "errors": sorted({s.error for s in streams if s.error})[:3],
        "prompt_tokens": sorted({s.prompt_tokens for s in done}), "tokens": tokens,
        "ttft_p50_ms": 1000 * percentile(ttft, 50) if ttft else None,
        "ttft_p95_ms": 1000 * percentile(ttft, 95) if ttft else None,
        "wall_s": wall, "tokens_per_s": tokens / wall if wall > 0 else None,
        "stream_decode_tokens_per_s": statistics.fmean(decode) if decode else None,
        "finish_reasons": reasons,
    }


def rounds_summary(rounds: Sequence[Sequence[Stream]]) -> dict:
    """A level's rounds on one path: TTFT over every stream of every round; tokens/s as the mean of the rounds' with
    its 95% interval (`tokens_per_s_interval`), so the precision of the figure is stated."""
    per_round = [level_summary(streams) for streams in rounds]
    everything = level_summary([stream for streams in rounds for stream in streams])
    rates = precision.interval([r.get("tokens_per_s") for r in per_round])
    reasons: dict[str, int] = {}
    for r in per_round:
        for reason, count in (r.get("finish_reasons") or {}).items():
            reasons[reason] = reasons.get(reason, 0) + count
    return {
        **everything, "rounds": len(per_round), "wall_s": sum(r.get("wall_s") or 0.0 for r in per_round),
        "tokens_per_s": rates["mean"], "tokens_per_s_interval": rates,
        "tokens_per_s_rounds": [r.get("tokens_per_s") for r in per_round], "finish_reasons": reasons,
    }


class InProcessGenerator:
    """The served generator's decoder, loaded as served (generator_runtime.torch_generator) and scheduled as served:
    with in-flight batching (the served config's `inflight_batching`) through the same InflightBatcher over a
    BatchDecoder of the served rows, prompts prepared in a thread pool as large as the served model's; otherwise
    decoding.generate in that pool, each thread with its own KV cache. Kept for the model's life and warmed before
    anything is timed, like the served model."""

    def __init__(self, repository: Path, model: str, device: str):
        import torch
        from thinkserve_backend.generator_runtime import torch_generator
        from thinkserve_backend.images import ImagePreprocessing

        config = read_config(repository, model)
        params = parameters(config)
        self.torch = torch
        self.vision = model == contracts.VLM.name
        self.device, self.dtype = torch_device(device)
        if device == "cpu":
            torch.set_num_threads(int(params.get("intra_op_threads", "2")))
        folder = repository / model / "1"
        self.tokenizer = whole_text_tokenizer(folder / params["tokenizer_file"])
        self.eos_token_ids = json.loads(params["eos_token_ids"])
        self.max_context = int(params[contracts.CONTEXT_PARAMETER])
        self.workers = int(params.get("max_concurrent_generations", "2"))
        self.runtime = torch_generator(folder, self.vision, self.max_context, self.device, self.dtype)
        self.pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="in-process")
        self.batcher = None
        self.no_batching_reason = ""
        self.decode_mode, self.no_graphs_reason = "", ""
        if params.get("inflight_batching", "false").lower() == "true":
            from thinkserve_backend.inflight_batching import InflightBatcher, inline_lone_steps_by_default
            from thinkserve_backend.torch_batch_decoding import BatchDecoder

            rows = int(params.get("max_batch_sequences", "8"))
            try:
                decoder = BatchDecoder(self.runtime.decoder.modules, rows, self.max_context, self.device, self.dtype,
                                       grouped_attention=params.get("grouped_decode_attention", "true").lower() == "true")
                decoder.self_check()
            except Exception as error:  # noqa: BLE001 - as the served model (models.generator): one per thread
                self.no_batching_reason = f"the batch decoder failed its check at load ({error})"
            else:
                # the decode step as the served model runs it: CUDA graphs on a GPU unless its parameter is off
                if self.device.type == "cuda" and params.get("cuda_graphs", "true").lower() == "true":
                    self.no_graphs_reason = decoder.use_cuda_graphs()
                self.decode_mode = decoder.decode_mode
                inline = params.get("inline_delivery", str(inline_lone_steps_by_default(self.device))).lower() == "true"
                self.batcher = InflightBatcher(decoder, max_waiting=1_000_000,
                                               max_prefill_tokens=int(params.get("max_prefill_tokens", "8192")),
                                               name=f"in-process-{model}", inline_lone_steps=inline)
        self.scheduling = "in-flight batching" if self.batcher is not None else "one generation per thread"
        if self.vision:
            self.image_token = params["image_token"]
            self.image_token_id = self.tokenizer.token_to_id(self.image_token)
            self.preprocessing = ImagePreprocessing.from_json(params["preprocessing"])

    def prepare(self, text: str, images: Sequence[bytes]):
        """VisionLanguageModel.prepare / LanguageModel.prepare, as served."""
        from thinkserve_backend.decoding import splice_image_features
        from thinkserve_backend.images import pixels_of, place_images

        if not self.vision:
            return np.array([self.tokenizer.encode(text, add_special_tokens=False).ids], dtype=np.int64), None
        text = place_images(text, len(images), self.image_token)
        ids = np.array([self.tokenizer.encode(text, add_special_tokens=False).ids], dtype=np.int64)
        embeddings = self.runtime.embed(ids)
        if images:
            features = self.runtime.image_features(np.stack([pixels_of(data, self.preprocessing) for data in images]))
            embeddings = splice_image_features(ids[0], embeddings[0], features, self.image_token_id)[None]
        return embeddings.astype(np.float32, copy=False), self.runtime.embed

    def generate(self, text: str, images: Sequence[bytes], max_tokens: int, stream: Stream,
                 deadline: float = math.inf) -> Stream:
        """One stream; past `deadline` (epoch seconds) it is cut (finish reason "cancelled", counted as an error)."""
        from thinkserve_backend.decoding import GenerationParams, generate

        try:
            prompt, embed = self.prepare(text, images)
            stream.prompt_tokens = prompt.shape[1]
            for step in generate(self.runtime.decoder, prompt, GenerationParams(max_tokens),
                                 decode=lambda ids: self.tokenizer.decode(list(ids), skip_special_tokens=True),
                                 eos_token_ids=self.eos_token_ids, max_context=self.max_context, embed=embed,
                                 is_cancelled=lambda: time.time() > deadline):
                if step.token_ids and stream.first_token is None:
                    stream.first_token = time.perf_counter()
                stream.token_ids += step.token_ids
                stream.tokens = step.completion_tokens
                stream.finish_reason = step.finish_reason or stream.finish_reason
            if stream.finish_reason == "cancelled":
                stream.error = "cut: out of time"
            stream.ended = time.perf_counter()
        except Exception as error:  # noqa: BLE001 - a failed stream is counted, the level goes on
            stream.error = f"{type(error).__name__}: {error}"
        return stream

    def queue(self, text: str, images: Sequence[bytes], max_tokens: int, stream: Stream,
              deadline: float = math.inf) -> threading.Event:
        """One stream handed to the in-flight batcher (its prompt prepared here, as the served model's workers do);
        the event is set when it ends. Past `deadline` it is cut like `generate`'s."""
        from thinkserve_backend.decoding import GenerationParams, SequenceProgress
        from thinkserve_backend.inflight_batching import BatchedGeneration

        ended = threading.Event()

        def emit(step) -> None:
            if step.token_ids and stream.first_token is None:
                stream.first_token = time.perf_counter()
            stream.token_ids += step.token_ids
            stream.tokens = step.completion_tokens or stream.tokens
            if step.finish_reason:
                stream.finish_reason = step.finish_reason
                if step.finish_reason == "cancelled":
                    stream.error = "cut: out of time"
                stream.ended = time.perf_counter()
                ended.set()

        def fail(error: BaseException) -> None:
            stream.error = f"{type(error).__name__}: {error}"
            ended.set()

        try:
            prompt, _ = self.prepare(text, images)
            stream.prompt_tokens = prompt.shape[1]
            progress = SequenceProgress(GenerationParams(max_tokens), prompt.shape[1], self.max_context,
                                        lambda ids: self.tokenizer.decode(list(ids), skip_special_tokens=True), self.eos_token_ids)
            self.batcher.submit(BatchedGeneration(prompt, progress, emit, fail, lambda: time.time() > deadline))
        except Exception as error:  # noqa: BLE001 - a failed stream is counted, the level goes on
            fail(error)
        return ended

    def warm(self, prompts: Sequence[str], images: Sequence[bytes], max_tokens: int) -> list[Stream]:
        """Before anything is timed: with in-flight batching, one round of as many streams as prompts given (kernels
        chosen, the cache touched); otherwise one generation on each of the pool's threads, all at once (a barrier
        holds each task until every thread has one), so every thread's KV cache is allocated first."""
        if self.batcher is not None:
            return self.level(prompts, images, max_tokens)
        barrier = threading.Barrier(self.workers)

        def one(prompt: str) -> Stream:
            barrier.wait(timeout=120)
            return self.generate(prompt, images, max_tokens, Stream(time.perf_counter()))

        futures = [self.pool.submit(one, prompts[i % len(prompts)]) for i in range(self.workers)]
        return [future.result() for future in futures]

    def level(self, prompts: Sequence[str], images: Sequence[bytes], max_tokens: int,
              deadline: float = math.inf) -> list[Stream]:
        if self.batcher is not None:
            streams = [Stream(time.perf_counter()) for _ in prompts]
            futures = [self.pool.submit(self.queue, prompt, images, max_tokens, stream, deadline)
                       for prompt, stream in zip(prompts, streams)]
            for future in futures:
                future.result().wait()
            return streams
        futures = [self.pool.submit(self.generate, prompt, images, max_tokens, Stream(time.perf_counter()), deadline)
                   for prompt in prompts]
        return [future.result() for future in futures]

    def decode_step_ms(self, rows_levels: Sequence[int], position: int, steps: int = 20) -> dict:
        """The batch decoder's decode step alone, in this process, as it serves (CUDA graphs where they were captured)
        and eagerly at exact shapes, the two timed in turn at each number of running rows: what the graphs gain,
        measured in one run. Called between levels, when the batcher runs nothing."""
        decoder = self.batcher.decoder
        position = min(position, decoder.cache.capacity - steps - 1)
        modes = {decoder.decode_mode: nullcontext}
        if decoder.decode_mode != "eager":
            modes["eager"] = decoder.eager_steps
        timings: dict = {}
        for rows in sorted({min(r, decoder.slots) for r in rows_levels}):
            for mode, within in modes.items():
                with within():
                    for _ in range(3):  # warm: the bucket's graph or the eager kernels for these shapes
                        decoder.decode([7] * rows, [position] * rows)
                    self._synchronize()
                    began = time.perf_counter()
                    for step in range(steps):
                        decoder.decode([7] * rows, [position + step] * rows)
                    self._synchronize()
                    timings.setdefault(mode, {})[str(rows)] = 1000 * (time.perf_counter() - began) / steps
        return timings

    def decode_step_kernels(self, rows: int, position: int, steps: int = 3, top: int = 8) -> dict:
        """Where one decode step's device time goes, by kernel (torch.profiler; operators on a CPU), eagerly at exact
        shapes so each kernel is seen: with the attention the decoder serves and, where that is the grouped decode
        attention, with transformers' sdpa path (which copies key/value heads), in the same run. Per attention: the
        step's total kernel ms and its `top` kernels. Called between levels, when the batcher runs nothing."""
        from thinkserve_backend.torch_decode_attention import NAME as GROUPED
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        decoder = self.batcher.decoder
        config = decoder.modules.text_config
        rows, position = min(rows, decoder.slots), min(position, decoder.cache.capacity - steps - 4)
        served = config._attn_implementation
        attentions = [served] + (["sdpa"] if served == GROUPED else [])
        on_gpu = self.device.type == "cuda"
        activity = ProfilerActivity.CUDA if on_gpu else ProfilerActivity.CPU
        found: dict = {}
        try:
            for attention in attentions:
                config._attn_implementation = attention
                with decoder.eager_steps():
                    for _ in range(2):
                        decoder.decode([7] * rows, [position] * rows)
                    self._synchronize()
                    with profile(activities=[activity]) as profiler:
                        for step in range(steps):
                            decoder.decode([7] * rows, [position + 2 + step] * rows)
                        self._synchronize()
                kernels = []
                for event in profiler.key_averages():
                    # on a GPU the kernels themselves (an operator's self device time repeats its kernels'), on a
                    # CPU the operators
                    kernel = event.device_type != DeviceType.CPU if on_gpu else event.key.startswith("aten::")
                    us = event.self_device_time_total if on_gpu else event.self_cpu_time_total
                    if kernel and us > 0:
                        kernels.append((event.key, us / 1000 / steps, event.count // steps))
                kernels.sort(key=lambda k: -k[1])
                found[attention] = {"ms": round(sum(k[1] for k in kernels), 3),
                                    "top": [{"kernel": name[:120], "ms": round(ms, 3), "calls": calls}
                                            for name, ms, calls in kernels[:top]]}
        finally:
            config._attn_implementation = served
        return {"rows": rows, "position": position, "device_time": "kernels" if on_gpu else "cpu operators",
                "by_attention": found}

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def logits_at(self, text: str, images: Sequence[bytes], tokens: Sequence[int]) -> np.ndarray:
        """The in-process model's logits after the prompt and `tokens`, replayed on one of the pool's warmed threads
        as its streams step (divergence.logits_after)."""
        def replay() -> np.ndarray:
            prompt, embed = self.prepare(text, images)
            return divergence.logits_after(self.runtime.decoder, prompt, tokens, embed)

        return self.pool.submit(replay).result()

    def close(self) -> None:
        if self.batcher is not None:
            self.batcher.close()
            self.batcher = None
        self.pool.shutdown(wait=True)
        del self.runtime
        if self.device.type == "cuda":
            self.torch.cuda.empty_cache()


async def triton_level(models: TritonModels, prompts: Sequence[str], images: Sequence[bytes], max_tokens: int,
                       deadline: float = math.inf, grace_s: float = 2.0) -> list[Stream]:
    """Every prompt as a grpc stream at once. Past `deadline` (epoch seconds) the streams still running are cancelled
    (and given `grace_s` to close, not waited for beyond it): they count as cut."""
    streams = [Stream(time.perf_counter()) for _ in prompts]

    async def one(prompt: str, stream: Stream) -> Stream:
        try:
            async with models.generate(prompt, GenerationOptions(max_tokens=max_tokens), images) as chunks:
                async for chunk in chunks:
                    if chunk.token_ids and stream.first_token is None:
                        stream.first_token = time.perf_counter()
                    stream.token_ids += chunk.token_ids
                    stream.tokens = chunk.completion_tokens or stream.tokens
                    stream.prompt_tokens = chunk.prompt_tokens or stream.prompt_tokens
                    stream.finish_reason = chunk.finish_reason or stream.finish_reason
            stream.ended = time.perf_counter()
        except Exception as error:  # noqa: BLE001 - a failed stream is counted, the level goes on
            stream.error = f"{type(error).__name__}: {error}"
        return stream

    tasks = [asyncio.ensure_future(one(prompt, stream)) for prompt, stream in zip(prompts, streams)]
    _, running = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.time()) if deadline < math.inf else None)
    for task in running:
        task.cancel()
    if running:
        await asyncio.wait(running, timeout=grace_s)
    for stream in streams:
        if stream.ended is None and not stream.error:
            stream.error = "cut: out of time"
    return streams


def generator_prompts(model: InProcessGenerator, positions: int, streams: int, image_tokens: int) -> list[str]:
    """`streams` different prompts of exactly `positions` prompt positions (a VLM's image positions included)."""
    def count(text: str) -> int:
        if not model.vision:
            return len(model.tokenizer.encode(text, add_special_tokens=False).ids)
        from thinkserve_backend.images import place_images

        return len(model.tokenizer.encode(place_images(text, 1, model.image_token), add_special_tokens=False).ids) - 1 + image_tokens

    words = single_token_words(model.tokenizer)
    return [exact_prompt(count, positions, seed, words) for seed in range(streams)]


async def measure_generators(client: TritonClient, repository: Path, options: Options, record: Callable[[dict], None],
                             progress: Callable[[str], None]) -> None:
    models = TritonModels(client)
    image = page_image(0)
    for name in (contracts.LLM.name, contracts.VLM.name):
        if name not in model_names(repository) or name not in options.generators:
            continue
        facts = await models.generator_facts(name)
        positions = min(options.prompt_tokens, facts.context_tokens - options.new_tokens)
        images = [image] if name == contracts.VLM.name else []
        model = InProcessGenerator(repository, name, options.device)
        replays: dict = {}  # (prompt, in-process tokens before the divergence) -> logits: a prompt's stream repeats
        try:
            prompts = generator_prompts(model, positions, max(*options.streams, model.workers), facts.image_tokens)
            # warm-up of every generation thread on both sides (each keeps its own KV cache; the in-process pool is
            # the one every level then uses): kernels chosen and caches allocated before anything is timed
            warm = max(model.workers, min(len(prompts), model.batcher.decoder.slots if model.batcher else 0))
            model.warm(prompts[:warm], images, 4)
            await triton_level(models, prompts[:warm], images, 4)
            if model.batcher is not None and options.left() > 60:
                # the decode step alone, as served against eager, at the levels' rows (the batcher is idle here)
                timings = model.decode_step_ms(options.streams, positions)
                record({"model": name, "decode_step_ms": timings, "position": positions})
                progress(f"  {name} decode step alone, ms by running rows: "
                         + "; ".join(f"{mode} " + ", ".join(f"{rows}: {ms:.1f}" for rows, ms in by_rows.items())
                                     for mode, by_rows in timings.items()))
                try:  # a diagnostic: a profiler that cannot run there (no CUPTI) costs it alone, not the levels
                    kernels = model.decode_step_kernels(max(options.streams), positions)
                except Exception as error:  # noqa: BLE001
                    record({"model": name, "decode_step_kernels_error": f"{type(error).__name__}: {error}"})
                    progress(f"  {name} decode step's kernels: not profiled ({type(error).__name__}: {error})")
                else:
                    record({"model": name, "decode_step_kernels": kernels})
                    progress(f"  {name} decode step's {kernels['device_time']} at {kernels['rows']} rows, ms a step: "
                             + "; ".join(f"{attention} {found['ms']:.2f} (top: {found['top'][0]['kernel'][:60]} "
                                         f"{found['top'][0]['ms']:.2f})" for attention, found in kernels["by_attention"].items()
                                         if found["top"]))
            rate = None  # tokens/s of the slower path at the last level: how long the next one will take
            for streams in options.streams:
                needed = 20 + (4.4 * streams * options.new_tokens / rate if rate else 0)  # the warm round and one more, both paths
                if options.left() < needed:
                    progress(f"  {name} {streams} streams: skipped, out of time")
                    record({"model": name, "streams": streams, "skipped": "out of time"})
                    continue
                row = await _level(model, models, prompts[:streams], images, options, replays, progress)
                row.update(model=name, streams=streams, prompt_positions=positions, new_tokens=options.new_tokens,
                           image_tokens=facts.image_tokens if images else 0, served_threads=model.workers,
                           scheduling=model.scheduling, no_batching_reason=model.no_batching_reason or None,
                           decode_step=model.decode_mode or None, no_graphs_reason=model.no_graphs_reason or None,
                           batch_rows=model.batcher.decoder.slots if model.batcher else None)
                rates = [r for r in (row["triton"].get("tokens_per_s"), row["in_process"].get("tokens_per_s")) if r]
                rate = min(rates) if rates else rate
                record(row)
                gaps = row["divergence_summary"]
                progress(f"  {name} {streams} streams, {row['rounds']} rounds: in-process "
                         f"{row['in_process'].get('tokens_per_s') or 0:.1f} tok/s, Triton {row['triton'].get('tokens_per_s') or 0:.1f} "
                         f"tok/s ({precision.percent(row['throughput_ratio_relative'])} on their ratio), TTFT p50 "
                         f"{row['in_process'].get('ttft_p50_ms') or 0:.0f} / {row['triton'].get('ttft_p50_ms') or 0:.0f} ms; "
                         f"tokens differ on {gaps['diverged']} of {gaps['streams']} streams"
                         + (f" (first at token {gaps['earliest']}, margins {gaps['margin_min']} to {gaps['margin_max']})"
                            if gaps["diverged"] else ""))
        finally:
            model.close()


async def _level(model: InProcessGenerator, models: TritonModels, prompts: Sequence[str], images: Sequence[bytes],
                 options: Options, replays: dict, progress: Callable[[str], None]) -> dict:
    """One level: an untimed round of both paths, then rounds of both (alternating which goes first) until both tokens/s are known within
    `generator_precision` over at least `generator_min_rounds` rounds and `generator_min_tokens` tokens a path, or
    `generator_max_rounds` rounds ran, or the next round would not end in time; then where the tokens part."""
    local_rounds: list[list[Stream]] = []
    remote_rounds: list[list[Stream]] = []
    reason = "rounds"
    # One untimed round of both paths at this level's streams and lengths first: on the H200 (2026-11-29) every
    # level's first in-process round ran 2-4x slower than its later ones (new batch and sequence shapes), which
    # left the in-process tokens/s known only to +-30-40% after six rounds.
    model.level(prompts, images, options.new_tokens, options.deadline - 10)
    await triton_level(models, prompts, images, options.new_tokens, options.deadline - 10)
    while True:
        began = time.monotonic()
        until = options.deadline - 10  # a round running into the deadline is cut there, not waited for
        if len(local_rounds) % 2 == 0:
            local_rounds.append(model.level(prompts, images, options.new_tokens, until))
            remote_rounds.append(await triton_level(models, prompts, images, options.new_tokens, until))
        else:
            remote_rounds.append(await triton_level(models, prompts, images, options.new_tokens, until))
            local_rounds.append(model.level(prompts, images, options.new_tokens, until))
        spent = time.monotonic() - began
        local, remote = rounds_summary(local_rounds), rounds_summary(remote_rounds)
        done = len(local_rounds) >= options.generator_min_rounds and min(local["tokens"] or 0, remote["tokens"] or 0) >= \
            options.generator_min_tokens and precision.precise_enough(
                [local["tokens_per_s_interval"], remote["tokens_per_s_interval"]], options.generator_precision)
        if done:
            reason = "precision"
            break
        if len(local_rounds) >= options.generator_max_rounds:
            break
        if options.left() < 1.5 * spent + 20:
            reason = "time"
            break
    ratio = precision.ratio_interval(remote["tokens_per_s_interval"], local["tokens_per_s_interval"])
    row = {
        "in_process": local, "triton": remote, "rounds": len(local_rounds), "stopped_by": reason,
        "precision_target": options.generator_precision,
        "throughput_ratio": ratio["ratio"], "throughput_ratio_relative": ratio["relative"],
        # greedy on the same prompt: does a path give the same tokens every round (bf16 kernels may not)?
        "in_process_repeatable": _repeatable(local_rounds), "triton_repeatable": _repeatable(remote_rounds),
    }
    streams = [divergence.stream_divergence(i, ours.token_ids, theirs.token_ids)
               for i, (ours, theirs) in enumerate(zip(local_rounds[0], remote_rounds[0]))]
    for stream, ours in zip(streams, local_rounds[0]):
        at = stream["first_divergent_token"]
        if at is None:
            continue
        if ours.error or at >= len(ours.token_ids):
            stream["margin"] = "not replayed: the in-process stream " + ("failed" if ours.error else "ended there")
            continue
        key = (prompts[stream["stream"]], tuple(ours.token_ids[:at]))
        per_token = (ours.ended - ours.first_token) / max(1, ours.tokens - 1) if ours.first_token else 0.1
        if key not in replays and options.left() < 30 + (at + 2) * per_token * 3:
            stream["margin"] = "not replayed: out of time"
            continue
        if key not in replays:
            replays[key] = model.logits_at(prompts[stream["stream"]], images, ours.token_ids[:at])
        stream.update(divergence.margins(replays[key], ours.token_ids[at], stream["triton_token"]))
    row["same_tokens"] = all(s["first_divergent_token"] is None for s in streams)
    row["divergence"] = streams
    row["divergence_summary"] = divergence.summary(streams)
    return row


def _repeatable(rounds: Sequence[Sequence[Stream]]) -> bool:
    """Whether every round gave each prompt the same tokens as the first round did."""
    return all([s.token_ids for s in streams] == [s.token_ids for s in rounds[0]] for streams in rounds[1:])
