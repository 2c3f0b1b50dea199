"""The generators' measurements: the LLM and the VLM (one image, its positions counted in the prompt) with prompts of
an exact number of positions, at several concurrent streams, through Triton (grpc streams) and in-process (the same
decoder and decoding loop, streams in a thread pool as large as the served model's): TTFT and tokens per second."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from orchestrator.models import contracts
from orchestrator.triton.client import TritonClient
from orchestrator.triton.models import GenerationOptions, TritonModels

from ..stats import percentile
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


class InProcessGenerator:
    """The served generator's decoder, loaded as served (generator_runtime.torch_generator), driven by
    decoding.generate in a thread pool as large as the served model's."""

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

    def generate(self, text: str, images: Sequence[bytes], max_tokens: int, stream: Stream) -> Stream:
        from thinkserve_backend.decoding import GenerationParams, generate

        try:
            prompt, embed = self.prepare(text, images)
            stream.prompt_tokens = prompt.shape[1]
            for step in generate(self.runtime.decoder, prompt, GenerationParams(max_tokens),
                                 decode=lambda ids: self.tokenizer.decode(list(ids), skip_special_tokens=True),
                                 eos_token_ids=self.eos_token_ids, max_context=self.max_context, embed=embed):
                if step.token_ids and stream.first_token is None:
                    stream.first_token = time.perf_counter()
                stream.token_ids += step.token_ids
                stream.tokens = step.completion_tokens
                stream.finish_reason = step.finish_reason or stream.finish_reason
            stream.ended = time.perf_counter()
        except Exception as error:  # noqa: BLE001 - a failed stream is counted, the level goes on
            stream.error = f"{type(error).__name__}: {error}"
        return stream

    def level(self, prompts: Sequence[str], images: Sequence[bytes], max_tokens: int) -> list[Stream]:
        with ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="in-process") as pool:
            futures = [pool.submit(self.generate, prompt, images, max_tokens, Stream(time.perf_counter())) for prompt in prompts]
            return [future.result() for future in futures]

    def close(self) -> None:
        del self.runtime
        if self.device.type == "cuda":
            self.torch.cuda.empty_cache()


async def triton_level(models: TritonModels, prompts: Sequence[str], images: Sequence[bytes], max_tokens: int) -> list[Stream]:
    async def one(prompt: str) -> Stream:
        stream = Stream(time.perf_counter())
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

    return list(await asyncio.gather(*(one(p) for p in prompts)))


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
        if name not in model_names(repository):
            continue
        facts = await models.generator_facts(name)
        positions = min(options.prompt_tokens, facts.context_tokens - options.new_tokens)
        images = [image] if name == contracts.VLM.name else []
        model = InProcessGenerator(repository, name, options.device)
        try:
            prompts = generator_prompts(model, positions, max(*options.streams, model.workers), facts.image_tokens)
            # warm-up of every generation thread (each keeps its own KV cache) on both sides: kernels chosen and
            # caches allocated before anything is timed
            model.level(prompts[: model.workers], images, 4)
            await triton_level(models, prompts[: model.workers], images, 4)
            rate = None  # tokens/s of the slower path at the last level: how long the next one will take
            for streams in options.streams:
                needed = 20 + (2.4 * streams * options.new_tokens / rate if rate else 0)
                if options.left() < needed:
                    progress(f"  {name} {streams} streams: skipped, out of time")
                    record({"model": name, "streams": streams, "skipped": "out of time"})
                    continue
                local = model.level(prompts[:streams], images, options.new_tokens)
                remote = await triton_level(models, prompts[:streams], images, options.new_tokens)
                row = {
                    "model": name, "streams": streams, "prompt_positions": positions, "new_tokens": options.new_tokens,
                    "image_tokens": facts.image_tokens if images else 0, "served_threads": model.workers,
                    "in_process": level_summary(local), "triton": level_summary(remote),
                    # greedy on the same prompt: do both paths produce the same tokens (bf16 kernels may differ)?
                    "same_tokens": local[0].token_ids == remote[0].token_ids,
                }
                row["throughput_ratio"] = _ratio(row["triton"].get("tokens_per_s"), row["in_process"].get("tokens_per_s"))
                rates = [r for r in (row["triton"].get("tokens_per_s"), row["in_process"].get("tokens_per_s")) if r]
                rate = min(rates) if rates else rate
                record(row)
                progress(f"  {name} {streams} streams: in-process {row['in_process'].get('tokens_per_s') or 0:.1f} tok/s, "
                         f"Triton {row['triton'].get('tokens_per_s') or 0:.1f} tok/s, TTFT p50 "
                         f"{row['in_process'].get('ttft_p50_ms') or 0:.0f} / {row['triton'].get('ttft_p50_ms') or 0:.0f} ms")
        finally:
            model.close()


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a and b else None

