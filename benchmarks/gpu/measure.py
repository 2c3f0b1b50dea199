"""The device runner's measurements: every model through the real Triton and in-process PyTorch, in one run.

    python -m benchmarks.gpu.measure --repository R --install-root I --model-env M --device cuda \\
        --parts encoders,generators,mix [--quick] --out DIR

(run_on_device.py prepares R, I and M and passes them.) Triton is started by the project's launcher on the
models the parts need (a hard-linked copy of those model folders), with the model environment given.

- **encoders**: each network model of the repository (embedder, cross-encoder, page text and image towers; the
  router's classifier where the profile has one) at batch 1, 8 and 32, called directly with the same token ids or
  pixels both ways: through Triton (one request of `batch` rows at a time; at the largest batch also 4 in flight)
  and in-process (thinkserve_backend.torch_modules.load_network: the module, device and dtype the served model
  runs). Throughput is rows per second of sequential calls; Triton's share = 1 - Triton / in-process. Before
  anything, the embedder's ensemble (text in: BYTES through the tokenizer step) is checked against the network
  fed the same ids, and every network's Triton output against the in-process one.
- **generators**: the LLM and the VLM (one image, its positions counted in the prompt) with prompts of exactly
  `--prompt-tokens` positions (1,024) and `--new-tokens` (128) greedy tokens, at 1, 8 and 32 concurrent streams:
  through Triton (grpc streams) and in-process (the same torch_decoding.TorchKVCacheDecoder and decoding.generate,
  streams in a thread pool as large as the served model's, max_concurrent_generations). TTFT (submit to first
  token, queueing in the pool included) and tokens per second (all streams' tokens over the level's wall time).
- **mix**: a cost run's recorded model calls (--cost, the routed questions) replayed by the ceiling mode's replay
  (orchestrator.bench.modes.ceiling: the pipeline's phases, branches and concurrency per question) against this
  Triton, per route, closed loop at concurrency 1, 4 and 16: model-bound queries/s and model time per query (p50,
  p95); cost per query at the price table's H100 and H200 rates; an end-to-end estimate per route = the cost run's
  own orchestrator time (measured on the CPU machine) + this model time, labelled an estimate.

Results are written after every unit of work (`gpu-<parts>.json`, then `.md`), so a command stopped at its time
limit still returns what it measured; `--deadline` (from run_on_device) skips what would not finish in time.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import itertools
import json
import math
import os
import platform
import shutil
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Callable, Optional, Sequence

import numpy as np
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from orchestrator.config import TritonSettings
from orchestrator.models import contracts
from orchestrator.triton.client import TritonClient
from orchestrator.triton.launcher import TritonServer
from orchestrator.triton.models import GenerationOptions, TritonModels

from . import report

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("encoders", "generators", "mix")
DEFAULT_COST = ROOT / "benchmarks" / "results" / "bench" / "bench-cost-llm.json"
NETWORK_SUFFIXES = ("_encode", "_score", "_classify")
# Token length of each text encoder's calls (capped at its served max_length; a tokenizer that pads to its
# maximum uses that): the embedder at ingest, passages of up to 254 tokens (ingest.passage_tokens), where batches
# are large; the cross-encoder, question + passage (the cost runs: ~130 tokens a pair); page text towers, questions.
SEQUENCE_TOKENS = {"text_embedder": 256, "reranker": 256, "router": 64}
QUESTION_TOKENS = 32
# Ids every text tokenizer of the profiles has (MiniLM's WordPiece; the stand-ins' vocabularies are larger): the
# first and last are its [CLS] and [SEP], where CLIP's towers pool.
CLS_ID, SEP_ID, LOW_ID, HIGH_ID = 101, 102, 1000, 29000
WORDS = (
    "revenue growth quarter region margin report annual table figure page total increase decrease market share "
    "customer product service cost price plan board dividend cash equity debt asset value operating income net "
    "profit loss forecast budget segment sales volume supply demand energy water steel freight contract lease "
    "policy employee safety device battery manual study patient treatment result accuracy model baseline test "
    "survey adult concern economy bridge repair library weekday vacation day notice agreement party deposit rent"
).split()


@dataclass
class Options:
    parts: tuple[str, ...]
    device: str
    batches: tuple[int, ...] = (1, 8, 32)
    inflight: int = 4  # Triton requests in flight at the largest batch (besides one at a time)
    seconds: float = 1.5  # timed seconds per encoder case and path
    min_calls: int = 5
    streams: tuple[int, ...] = (1, 8, 32)
    prompt_tokens: int = 1024
    new_tokens: int = 128
    mix_concurrency: tuple[int, ...] = (1, 4, 16)
    mix_warmup_s: float = 2.0
    mix_window_s: float = 8.0
    cost: Path = DEFAULT_COST
    cost_config: str = "routed"
    source_image_tokens: int = 36  # the cost run's VLM (tiny: 96 px / 16 px patches = 36 positions an image)
    networks: tuple[str, ...] = ()  # the encoder networks measured (empty: every one)
    deadline: float = math.inf  # epoch seconds: no new unit of work starts that would end after it

    @classmethod
    def quick(cls, parts: tuple[str, ...], device: str, **overrides) -> "Options":
        """About a third of the full run's time: shorter windows, fewer generated tokens."""
        values = dict(seconds=0.6, min_calls=3, new_tokens=32, mix_warmup_s=1.0, mix_window_s=3.0)
        return cls(parts, device, **{**values, **overrides})

    def left(self) -> float:
        return self.deadline - time.time()


# ---------------------------------------------------------------- repository reading


def read_config(repository: Path, model: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse((repository / model / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())


def parameters(config: model_config_pb2.ModelConfig) -> dict[str, str]:
    return {key: value.string_value for key, value in config.parameters.items()}


def model_names(repository: Path) -> list[str]:
    return sorted(p.name for p in repository.iterdir() if (p / "config.pbtxt").is_file())


def encoder_networks(repository: Path) -> list[str]:
    """The repository's networks of the torch target (what a `network` parameter names), encoders first."""
    names = []
    for name in model_names(repository):
        if name.endswith(NETWORK_SUFFIXES) and "network" in parameters(read_config(repository, name)):
            names.append(name)
    return names


def public_name(network: str) -> str:
    for suffix in NETWORK_SUFFIXES:
        if network.endswith(suffix):
            return network[: -len(suffix)]
    return network


def with_steps(repository: Path, names: Sequence[str]) -> set[str]:
    """`names` and every model their ensembles call (transitively)."""
    wanted, pending = set(), list(names)
    while pending:
        name = pending.pop()
        if name in wanted or not (repository / name / "config.pbtxt").is_file():
            continue
        wanted.add(name)
        pending += [step.model_name for step in read_config(repository, name).ensemble_scheduling.step]
    return wanted


def recorded_models(cost: dict, config: str) -> set[str]:
    """The public models a cost run's series called."""
    return {u["model"] for r in cost["result"]["configs"][config]["records"] for u in r.get("usage", [])}


def models_for(repository: Path, options: "Options") -> list[str]:
    """The model folders Triton must load for the parts (with the steps of the ensembles they call): the networks
    measured, the embedder's ensemble (the round-trip check), the generators, the models the replayed run called."""
    wanted = {contracts.TEXT_EMBEDDER.name}
    if "encoders" in options.parts:
        wanted |= set(measured_networks(repository, options))
    if "generators" in options.parts:
        wanted |= {contracts.LLM.name, contracts.VLM.name}
    if "mix" in options.parts:
        wanted |= recorded_models(json.loads(options.cost.read_text()), options.cost_config)
    return sorted(with_steps(repository, sorted(wanted)))


def measured_networks(repository: Path, options: "Options") -> list[str]:
    networks = encoder_networks(repository)
    return [n for n in networks if n in options.networks] if options.networks else networks


def serving_repository(repository: Path, models: Sequence[str], destination: Path) -> Path:
    """A repository of `models` alone: their folders hard-linked (nothing copied), so Triton loads only those."""
    shutil.rmtree(destination, ignore_errors=True)
    destination.mkdir(parents=True)
    for model in models:
        shutil.copytree(repository / model, destination / model, copy_function=_link,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return destination


def _link(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


# ---------------------------------------------------------------- statistics


def latency_summary(seconds: Sequence[float]) -> dict:
    if not seconds:
        return {"calls": 0, "p50_ms": None, "p95_ms": None, "mean_ms": None}
    ordered = sorted(seconds)
    return {"calls": len(ordered), "p50_ms": 1000 * _percentile(ordered, 50), "p95_ms": 1000 * _percentile(ordered, 95),
            "mean_ms": 1000 * statistics.fmean(ordered)}


def _percentile(ordered: Sequence[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default)."""
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def share(triton: Optional[float], in_process: Optional[float]) -> Optional[float]:
    """Triton's share of the cost: 1 - Triton's throughput / in-process throughput (0: no overhead)."""
    if not triton or not in_process:
        return None
    return 1.0 - triton / in_process


# ---------------------------------------------------------------- encoders


def text_length(repository: Path, network: str) -> int:
    """Token length of the calls to a text network: SEQUENCE_TOKENS (questions for page towers), capped at what its
    tokenizer step serves; a tokenizer that pads to its maximum always gives that."""
    public = public_name(network)
    tokenize = repository / f"{public}_tokenize"
    wanted = SEQUENCE_TOKENS.get(public, QUESTION_TOKENS)
    if not (tokenize / "config.pbtxt").is_file():
        return wanted
    params = parameters(read_config(repository, f"{public}_tokenize"))
    max_length = int(params.get("max_length", wanted))
    if params.get("pad_to_max_length", "false").lower() in ("1", "true", "yes"):
        return max_length
    return min(wanted, max_length)


def encoder_inputs(config: model_config_pb2.ModelConfig, batch: int, length: int, seed: int = 0) -> dict[str, np.ndarray]:
    """One call's inputs, as the network's config declares them: token ids ([CLS] ... [SEP], every id inside each
    profile's vocabulary) with full masks, or pixels."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for tensor in config.input:
        if tensor.data_type == model_config_pb2.TYPE_FP32:
            arrays[tensor.name] = rng.standard_normal((batch, *tensor.dims)).astype(np.float32)
        elif tensor.name == "input_ids":
            ids = rng.integers(LOW_ID, HIGH_ID, size=(batch, length), dtype=np.int64)
            ids[:, 0], ids[:, -1] = CLS_ID, SEP_ID
            arrays[tensor.name] = ids
        elif tensor.name == "attention_mask":
            arrays[tensor.name] = np.ones((batch, length), dtype=np.int64)
        else:  # token_type_ids
            arrays[tensor.name] = np.zeros((batch, length), dtype=np.int64)
    return arrays


def torch_device(device: str):
    """What a served model instance gets: cuda:0 in bf16, or the CPU in fp32 (thinkserve_backend.torch_modules)."""
    from thinkserve_backend.torch_modules import device_and_dtype

    return device_and_dtype("cuda:0" if device == "cuda" else "cpu")


class InProcessNetwork:
    """A network as the torch target's served model runs it (torch_runner.TorchRunnerModel), called directly."""

    def __init__(self, repository: Path, network: str, device: str):
        import torch
        from thinkserve_backend.torch_modules import NetworkKind, load_network

        config = read_config(repository, network)
        params = parameters(config)
        self.torch = torch
        self.device, self.dtype = torch_device(device)
        if device == "cpu":
            torch.set_num_threads(int(params.get("intra_op_threads", "2")))
        self.network = load_network(NetworkKind.from_facts(json.loads(params["network"])), repository / network / "1",
                                    self.device, self.dtype)
        accepted = set(inspect.signature(self.network.forward).parameters)
        self.inputs = [t.name for t in config.input if t.name in accepted]

    def __call__(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        torch = self.torch
        with torch.inference_mode():
            feeds = {}
            for name in self.inputs:
                tensor = torch.from_numpy(arrays[name]).to(self.device, non_blocking=True)
                feeds[name] = tensor.to(self.dtype) if tensor.is_floating_point() else tensor
            return self.network(**feeds).float().cpu().numpy()

    def close(self) -> None:
        del self.network
        if self.device.type == "cuda":
            self.torch.cuda.empty_cache()


def timed_calls(call: Callable[[], object], seconds: float, min_calls: int, warmup: int = 2) -> tuple[list[float], float]:
    """Sequential calls after `warmup` untimed ones, until `seconds` passed and `min_calls` were made: each call's
    seconds, and the wall time of them all."""
    for _ in range(warmup):
        call()
    latencies = []
    began = time.perf_counter()
    while len(latencies) < min_calls or time.perf_counter() - began < seconds:
        start = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - start)
    return latencies, time.perf_counter() - began


async def timed_async(call: Callable[[], Awaitable[object]], seconds: float, min_calls: int, inflight: int = 1,
                      warmup: int = 2) -> tuple[list[float], float]:
    """`inflight` closed-loop workers of `call` (after `warmup` untimed calls each): latencies and wall time."""
    await asyncio.gather(*(call() for _ in range(warmup * inflight)))
    latencies: list[float] = []
    began = time.perf_counter()

    async def worker() -> None:
        while len(latencies) < min_calls or time.perf_counter() - began < seconds:
            start = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - start)

    await asyncio.gather(*(worker() for _ in range(inflight)))
    return latencies, time.perf_counter() - began


def path_result(latencies: list[float], wall: float, batch: int) -> dict:
    return {**latency_summary(latencies), "rows_per_s": batch * len(latencies) / wall if wall > 0 else None}


async def round_trip_check(client: TritonClient, repository: Path, device: str) -> dict:
    """Text in through the embedder's ensemble (BYTES into the tokenizer step, then the network) against the
    network fed the same ids directly, and against in-process PyTorch: the numpy-1 model environment and DLPack
    are right before anything is timed."""
    from thinkserve_backend.tokenization import encode, load_tokenizer

    texts = ["What was the revenue in 2023?", "The table on page 4 lists revenue by region and by quarter.", "Hello"]
    name = contracts.TEXT_EMBEDDER.name
    params = parameters(read_config(repository, f"{name}_tokenize"))
    tokenizer = load_tokenizer(repository / f"{name}_tokenize" / "1" / "tokenizer.json", int(params["max_length"]))
    network = f"{name}_encode"
    config = read_config(repository, network)
    wanted = [t.name for t in config.input]
    rows = [encode(tokenizer, [text], None, int(params.get("pad_id", "0")), None, []) for text in texts]
    through_ensemble = (await client.infer(name, {"text": np.array([[t.encode()] for t in texts], dtype=np.object_)},
                                           ["embedding"]))["embedding"]
    direct, local = [], []
    model = InProcessNetwork(repository, network, device)
    try:
        for arrays in rows:
            feeds = {n: arrays[n].astype(np.int64) for n in wanted}
            direct.append((await client.infer(network, feeds, ["embedding"]))["embedding"][0])
            local.append(model(feeds)[0])
    finally:
        model.close()
    direct_array, local_array = np.stack(direct), np.stack(local)
    result = {
        "texts": len(texts),
        "ensemble_vs_network": float(np.abs(through_ensemble - direct_array).max()),
        "triton_vs_in_process": float(np.abs(direct_array - local_array).max()),
        "norms": [float(n) for n in np.linalg.norm(through_ensemble, axis=1)],
    }
    tolerance = 5e-2 if device == "cuda" else 1e-4
    result["ok"] = bool(np.isfinite(through_ensemble).all() and result["ensemble_vs_network"] <= 1e-5
                        and result["triton_vs_in_process"] <= tolerance and all(abs(n - 1) < 1e-2 for n in result["norms"]))
    return result


async def measure_encoders(client: TritonClient, repository: Path, options: Options, record: Callable[[dict], None],
                           progress: Callable[[str], None]) -> None:
    for network in measured_networks(repository, options):
        if options.left() < 6 * options.seconds * len(options.batches):
            progress(f"  {network}: skipped, out of time")
            record({"model": network, "skipped": "out of time"})
            continue
        config = read_config(repository, network)
        output = config.output[0].name
        image = any(t.data_type == model_config_pb2.TYPE_FP32 for t in config.input)
        length = 0 if image else text_length(repository, network)
        model = InProcessNetwork(repository, network, options.device)
        try:
            for batch in options.batches:
                arrays = encoder_inputs(config, batch, length, seed=batch)
                local, wall_local = timed_calls(lambda: model(arrays), options.seconds, options.min_calls)

                async def call(arrays=arrays):
                    return await client.infer(network, arrays, [output])

                remote, wall_remote = await timed_async(call, options.seconds, options.min_calls)
                served = (await call())[output]
                row = {
                    "model": network, "public": public_name(network), "batch": batch,
                    "input": f"{length} tokens" if length else "x".join(map(str, config.input[0].dims)) + " pixels",
                    "in_process": path_result(local, wall_local, batch),
                    "triton": path_result(remote, wall_remote, batch),
                    "max_abs_diff": float(np.abs(served - model(arrays)).max()),
                }
                if batch == max(options.batches) and options.inflight > 1:
                    pipelined, wall = await timed_async(call, options.seconds, options.min_calls, options.inflight)
                    row["triton_inflight"] = {**path_result(pipelined, wall, batch), "inflight": options.inflight}
                row["triton_share"] = share(row["triton"]["rows_per_s"], row["in_process"]["rows_per_s"])
                record(row)
                progress(f"  {network} batch {batch}: in-process {row['in_process']['rows_per_s']:.1f} rows/s, "
                         f"Triton {row['triton']['rows_per_s']:.1f} rows/s (share {report.percent(row['triton_share'])})")
        finally:
            model.close()


# ---------------------------------------------------------------- generators


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
    from orchestrator.bench.modes.ceiling import page_image as ceiling_page_image

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
        "ttft_p50_ms": 1000 * _percentile(sorted(ttft), 50) if ttft else None,
        "ttft_p95_ms": 1000 * _percentile(sorted(ttft), 95) if ttft else None,
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


# ---------------------------------------------------------------- the pipeline's call mix


def passages(words: Sequence[str], count: int, length: int, offset: int = 0) -> list[str]:
    return [" ".join(words[(offset + i * length + j) % len(words)] for j in range(length)) for i in range(count)]


def plans_from_cost(cost: dict, config: str, source_image_tokens: int, image_tokens: int,
                    words: Sequence[str] = WORDS, contexts: Optional[dict[str, int]] = None) -> list[tuple[str, object, float]]:
    """(route, ceiling.Plan, the orchestrator's own ms) for every ok query of a cost run's series: its recorded
    model calls, the VLM's prompt tokens re-counted for this VLM's image positions (and a generator's prompt cut to
    its context, `contexts`), the question from the run's workload, and evidence passages as long as its
    cross-encoder pairs were (the run's texts are not recorded)."""
    from orchestrator.bench.modes.ceiling import Call, Plan

    contexts = contexts or {}

    questions = {q["id"]: q["question"] for q in (cost.get("workload") or {}).get("questions_text", [])}
    out = []
    for n, record in enumerate(cost["result"]["configs"][config]["records"]):
        if record.get("status") != "ok":
            continue
        calls = []
        for u in record["usage"]:
            tokens_in = u["tokens_in"]
            if u["model"] == contracts.VLM.name:  # the ledger counts 1 + images items per call
                tokens_in += max(0, u["items"] - u["calls"]) * (image_tokens - source_image_tokens)
            if u["model"] in contexts:  # a prompt (per call) the served context cannot take with its answer
                room = contexts[u["model"]] - u["tokens_out"] // max(1, u["calls"]) - 32
                tokens_in = min(tokens_in, room * max(1, u["calls"]))
            calls.append(Call(u["model"], u["stage"], u["items"], max(1, tokens_in), u["tokens_out"], max(1, u["calls"])))
        pairs = [c for c in calls if c.model == contracts.RERANKER.name]
        per_pair = pairs[0].tokens_in // max(1, pairs[0].items) if pairs else 130
        count = max((c.items // c.calls for c in pairs), default=8)
        question = questions.get(record.get("question_id"), "What does the report say about revenue by region?")
        texts = passages(words, count, max(8, int((per_pair - len(question.split())) * 0.75)), offset=7 * n)
        out.append((record.get("route") or "unknown", Plan(question, calls, texts), float(record.get("orchestrator_ms", 0.0))))
    return out


async def replay_level(models: TritonModels, plans: Sequence[object], images: list[bytes], concurrency: int,
                       warmup_s: float, window_s: float, until: float = math.inf, min_completed: int = 3) -> dict:
    """Closed loop of `concurrency` workers replaying `plans` in turn (the ceiling's replay): queries/s and model
    time per query over the window after the warm-up.

    The window lasts `window_s`, and longer, until `min_completed` queries have ended inside it (answered or
    failed), at most 10 windows or 60 s, and never past `until` (epoch seconds): on the first H200 run a Complex
    query's LLM answer outlasted a 3 s window and the level counted nothing. Queries still running when it closes
    are cancelled and not counted."""
    from orchestrator.bench.modes.ceiling import ReplayTally, replay

    cycle = itertools.cycle(plans)
    ended: list[tuple[float, float]] = []
    errors: list[str] = []
    failed_at: list[float] = []
    tally = ReplayTally()
    closed = asyncio.Event()

    async def worker() -> None:
        while not closed.is_set():
            began = time.monotonic()
            try:
                await replay(models, next(cycle), images, tally)
                ended.append((time.monotonic(), time.monotonic() - began))
            except Exception as error:  # noqa: BLE001 - counted and reported, the level goes on
                errors.append(f"{type(error).__name__}: {error}")
                failed_at.append(time.monotonic())

    workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
    await asyncio.sleep(warmup_s)
    t0 = time.monotonic()
    hard_stop = t0 + max(window_s, min(until - time.time(), max(60.0, 10 * window_s)))
    while True:
        now = time.monotonic()
        inside = sum(1 for end, _ in ended if end >= t0) + sum(1 for end in failed_at if end >= t0)
        if (now - t0 >= window_s and inside >= min_completed) or now >= hard_stop:
            break
        await asyncio.sleep(min(0.05, max(0.0, hard_stop - now)))
    t1 = time.monotonic()
    closed.set()
    for task in workers:
        task.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    inside = [latency for end, latency in ended if t0 <= end <= t1]
    return {"concurrency": concurrency, "window_s": t1 - t0, "completed": len(inside), "errors": len(errors),
            "error_messages": sorted(set(errors))[:3], "queries_per_s": len(inside) / (t1 - t0) if t1 > t0 else None,
            **{k: v for k, v in latency_summary(inside).items() if k != "calls"}}


def costs(queries_per_s: Optional[float], rates: dict[str, float]) -> dict:
    """$ per query and per 1,000 queries at each GPU's hourly rate, at that throughput."""
    if not queries_per_s:
        return {}
    return {kind: {"usd_per_query": rate / 3600 / queries_per_s, "usd_per_1000_queries": 1000 * rate / 3600 / queries_per_s}
            for kind, rate in rates.items()}


def gpu_rates() -> dict[str, float]:
    """The price table's hourly rate of one H100 and one H200 (orchestrator.bench.prices defaults)."""
    from orchestrator.bench.prices import PriceTable

    table = PriceTable()
    return {kind: table.deployments[kind].usd_per_deployment_hour for kind in ("h100", "h200") if kind in table.deployments}


async def measure_mix(client: TritonClient, repository: Path, options: Options, record: Callable[[str, object], None],
                      progress: Callable[[str], None]) -> None:
    from orchestrator.bench.modes.ceiling import calibrate

    models = TritonModels(client)
    cost = json.loads(options.cost.read_text())
    facts = {name: await models.generator_facts(name) for name in (contracts.LLM.name, contracts.VLM.name)}
    image_tokens = facts[contracts.VLM.name].image_tokens
    # the calibrated prompts are made of words the LLM's tokenizer reads as one token each (a first guess of
    # 0.7 words a token then lands below the target, as the ceiling's calibration expects)
    words = single_token_words(whole_text_tokenizer(repository / contracts.LLM.name / "1" / "tokenizer.json"))
    planned = plans_from_cost(cost, options.cost_config, options.source_image_tokens, image_tokens, words,
                              {name: f.context_tokens for name, f in facts.items()})
    progress(f"  calibrating the generators' prompts of {len(planned)} recorded queries")
    await calibrate(models, [plan for _, plan, _ in planned])
    images = [page_image(seed) for seed in range(8)]
    rates = gpu_rates()
    routes: dict[str, list] = {}
    for route, plan, own_ms in planned:
        routes.setdefault(route, []).append((plan, own_ms))
    record("source", {"cost_run": str(options.cost.relative_to(ROOT)) if options.cost.is_relative_to(ROOT) else str(options.cost),
                      "command": cost.get("command"), "config": options.cost_config, "queries": len(planned),
                      "source_image_tokens": options.source_image_tokens, "image_tokens": image_tokens,
                      "rates_usd_per_hour": rates,
                      "routes": {r: len(v) for r, v in sorted(routes.items())}})
    units_left = len(routes) * len(options.mix_concurrency)
    for route, items in sorted(routes.items()):
        plans = [plan for plan, _ in items]
        own = sorted(ms for _, ms in items)
        levels = []
        for concurrency in options.mix_concurrency:
            if options.left() < options.mix_warmup_s + options.mix_window_s + 15:
                levels.append({"concurrency": concurrency, "skipped": "out of time"})
                units_left -= 1
                continue
            # a level may stretch its window to count a few slow queries, but leaves every later level its minimum
            units_left -= 1
            until = options.deadline - 15 - units_left * (options.mix_warmup_s + options.mix_window_s + 15)
            level = await replay_level(models, plans, images, concurrency, options.mix_warmup_s, options.mix_window_s,
                                       until=until)
            level["cost"] = costs(level["queries_per_s"], rates)
            levels.append(level)
            progress(f"  {route} at concurrency {concurrency}: {level['queries_per_s'] or 0:.2f} q/s, model time p50 "
                     f"{level['p50_ms'] or 0:.0f} ms, p95 {level['p95_ms'] or 0:.0f} ms ({level['completed']} queries)")
        measured = [lv for lv in levels if lv.get("queries_per_s")]
        best = max(measured, key=lambda lv: lv["queries_per_s"], default=None)
        alone = next((lv for lv in measured if lv["concurrency"] == min(options.mix_concurrency)), None)
        own_p50 = _percentile(own, 50) if own else None
        record(route, {
            "queries": len(items), "levels": levels,
            "best": {"concurrency": best["concurrency"], "queries_per_s": best["queries_per_s"], "cost": best["cost"]} if best else None,
            "orchestrator_ms_p50_cpu": own_p50,
            # the estimate: the orchestrator's own time as the cost run measured it on the CPU machine + the model
            # time of one query alone on this GPU; not a measurement of the whole system
            "end_to_end_estimate_ms": (own_p50 + alone["p50_ms"]) if own_p50 is not None and alone and alone["p50_ms"] else None,
        })


# ---------------------------------------------------------------- the run


def machine_facts(device: str) -> dict:
    import torch

    facts = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
             "device": device, "cpu_count": os.cpu_count()}
    if device == "cuda" and torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        facts.update(gpu=torch.cuda.get_device_name(0), gpu_memory_gib=round(total / 2**30, 1),
                     dtype="bfloat16")
    else:
        facts.update(gpu="none", dtype="float32")
    return facts


class Results:
    """The run's results, written to disk after every unit of work."""

    def __init__(self, out: Path, options: Options, repository: Path):
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.stem = "gpu-" + "-".join(options.parts)
        self.data: dict = {
            "kind": "thinkserve-gpu-measurements", "dry_run": options.device != "cuda", "parts": list(options.parts),
            "repository": str(repository), "profile": _profile_of(repository), "machine": machine_facts(options.device),
            "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in options.__dict__.items() if k != "deadline"},
            "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "encoders": [], "generators": [], "mix": {}, "notes": [],
        }

    def save(self) -> None:
        for suffix, text in ((".json", json.dumps(self.data, indent=2, default=str) + "\n"), (".md", report.markdown([self.data]))):
            path = self.out / (self.stem + suffix)
            path.with_suffix(suffix + ".tmp").write_text(text)
            path.with_suffix(suffix + ".tmp").replace(path)


def _profile_of(repository: Path) -> str:
    name = repository.name.removeprefix("repo-")
    return name.rsplit("-", 1)[0] if name.endswith(("-cuda", "-cpu")) else name


async def run(args, options: Options, progress: Callable[[str], None]) -> int:
    results = Results(args.out, options, args.repository)
    results.save()
    serving = serving_repository(args.repository, models_for(args.repository, options), args.work / "serving")
    settings = TritonSettings(
        model_repository=serving, model_environment=args.model_env, install_root=args.install_root,
        log_dir=args.work / "logs", startup_timeout_s=max(60.0, min(900.0, options.left() - 60)),
        call_timeout_s=600.0, supervise=False,
    )
    server = TritonServer(settings, required=())
    began = time.monotonic()
    progress(f"starting tritonserver on {len(model_names(serving))} models ({', '.join(options.parts)})")
    try:
        server.start()
    except Exception as error:
        results.data["error"] = f"Triton did not start: {error}"
        results.save()
        _keep_log(server, args.out)
        progress(results.data["error"])
        return 1
    results.data["triton_start_s"] = round(time.monotonic() - began, 1)
    results.data["machine"].update(machine_facts(options.device))
    progress(f"Triton ready in {results.data['triton_start_s']} s")
    client = TritonClient.from_settings(settings, server.endpoints.grpc)
    status = 0
    try:
        if "encoders" in options.parts or "mix" in options.parts:
            check = await round_trip_check(client, serving, options.device)
            results.data["round_trip"] = check
            results.save()
            progress(f"round trip (text through the ensemble vs the network vs in-process): {check}")
            if not check["ok"]:
                raise RuntimeError("the round-trip check failed: Triton's answers are wrong, nothing else is measured")
        for part in options.parts:
            began = time.monotonic()
            progress(f"{part}:")
            if part == "encoders":
                await measure_encoders(client, serving, options, lambda row: (results.data["encoders"].append(row), results.save()), progress)
            elif part == "generators":
                await measure_generators(client, serving, options, lambda row: (results.data["generators"].append(row), results.save()), progress)
            elif part == "mix":
                await measure_mix(client, serving, options, lambda key, value: (results.data["mix"].__setitem__(key, value), results.save()), progress)
            results.data.setdefault("part_seconds", {})[part] = round(time.monotonic() - began, 1)
            results.save()
    except Exception as error:  # noqa: BLE001 - what was measured is kept; the error is reported with it
        results.data["error"] = f"{type(error).__name__}: {error}"
        progress(f"error: {results.data['error']}")
        status = 1
    finally:
        await client.close()
        server.stop()
        _keep_log(server, args.out)
        results.data["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        results.save()
    return status


def _keep_log(server: TritonServer, out: Path, lines: int = 400) -> None:
    """The tail of Triton's log beside the results (errors and the stubs' messages)."""
    if server.log_path and server.log_path.is_file():
        tail = server.log_path.read_text(errors="replace").splitlines()[-lines:]
        (out / "gpu-triton.log").write_text("\n".join(tail) + "\n")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu.measure", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", type=Path, required=True, help="a torch-target model repository")
    parser.add_argument("--install-root", type=Path, required=True, help="tritonserver's folder (bin/, backends/, stubs)")
    parser.add_argument("--model-env", type=Path, required=True, help="Triton's model environment (numpy 1)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/thinkserve-gpu"))
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--quick", action="store_true", help="shorter windows and 32 generated tokens (about a third of the time)")
    parser.add_argument("--batches", help="encoder batch sizes (default 1,8,32)")
    parser.add_argument("--streams", help="generator concurrent streams (default 1,8,32)")
    parser.add_argument("--prompt-tokens", type=int, help="generator prompt positions (default 1024)")
    parser.add_argument("--new-tokens", type=int, help="generated tokens per stream (default 128; --quick 32)")
    parser.add_argument("--mix-concurrency", help="replay concurrency levels (default 1,4,16)")
    parser.add_argument("--mix-window", type=float, help="measured seconds per replay level")
    parser.add_argument("--networks", help="encoder networks to measure, comma-separated (default: every one)")
    parser.add_argument("--cost", type=Path, help=f"the cost run to replay (default {DEFAULT_COST.relative_to(ROOT)})")
    parser.add_argument("--source-image-tokens", type=int, help="prompt positions per image of the cost run's VLM (tiny: 36)")
    parser.add_argument("--deadline", type=float, default=math.inf, help="epoch seconds: start no work that ends later")
    args = parser.parse_args(argv)
    parts = tuple(p.strip() for p in args.parts.split(",") if p.strip())
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown parts {unknown}; known: {', '.join(PARTS)}")
    overrides: dict = {"deadline": args.deadline}
    if args.networks:
        overrides["networks"] = tuple(n.strip() for n in args.networks.split(",") if n.strip())
    for name, value in (("batches", args.batches), ("streams", args.streams), ("mix_concurrency", args.mix_concurrency)):
        if value:
            overrides[name] = tuple(int(v) for v in value.split(","))
    for name, value in (("prompt_tokens", args.prompt_tokens), ("new_tokens", args.new_tokens), ("mix_window_s", args.mix_window),
                        ("cost", args.cost), ("source_image_tokens", args.source_image_tokens)):
        if value is not None:
            overrides[name] = value
    options = Options.quick(parts, args.device, **overrides) if args.quick else Options(parts, args.device, **overrides)
    started = time.monotonic()

    def progress(line: str) -> None:
        print(f"[measure {time.monotonic() - started:6.1f}s] {line}", flush=True)

    return asyncio.run(run(args, options, progress))


if __name__ == "__main__":
    raise SystemExit(main())
