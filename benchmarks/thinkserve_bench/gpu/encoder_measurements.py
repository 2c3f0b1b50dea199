"""The encoders' measurements: each network model of the repository (embedder, cross-encoder, page text and image
towers; the router's classifier where the profile has one) at each batch size, called directly with the same token
ids or pixels through Triton and in-process PyTorch (the module, device and dtype the served model runs); before
anything, a round trip of text through the embedder's ensemble. Image towers take what their ensemble's preprocess
step sends them, resized uint8 pixels (3 bytes a pixel), and normalise on their device: both paths get those."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Callable, Optional

import numpy as np
from tritonclient.grpc import model_config_pb2

from orchestrator.models import contracts
from orchestrator.triton.client import TritonClient

from ..stats import call_latency_summary
from ..timed_calls import time_async_window, time_window
from .gpu_report import percent
from .options import Options
from .served_models import measured_networks, parameters, public_name, read_config, torch_device

SEQUENCE_TOKENS = {"text_embedder": 256, "reranker": 256, "router": 64}
QUESTION_TOKENS = 32
# Ids every text tokenizer of the profiles has (MiniLM's WordPiece; the stand-ins' vocabularies are larger): the
# first and last are its [CLS] and [SEP], where CLIP's towers pool.
CLS_ID, SEP_ID, LOW_ID, HIGH_ID = 101, 102, 1000, 29000

def share(triton: Optional[float], in_process: Optional[float]) -> Optional[float]:
    """Triton's share of the cost: 1 - Triton's throughput / in-process throughput (0: no overhead)."""
    if not triton or not in_process:
        return None
    return 1.0 - triton / in_process


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
    profile's vocabulary) with full masks, or uint8 pixels (an image tower's input, as the preprocess step sends it)."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for tensor in config.input:
        if tensor.data_type == model_config_pb2.TYPE_UINT8:
            arrays[tensor.name] = rng.integers(0, 256, size=(batch, *tensor.dims), dtype=np.uint8)
        elif tensor.name == "input_ids":
            ids = rng.integers(LOW_ID, HIGH_ID, size=(batch, length), dtype=np.int64)
            ids[:, 0], ids[:, -1] = CLS_ID, SEP_ID
            arrays[tensor.name] = ids
        elif tensor.name == "attention_mask":
            arrays[tensor.name] = np.ones((batch, length), dtype=np.int64)
        else:  # token_type_ids
            arrays[tensor.name] = np.zeros((batch, length), dtype=np.int64)
    return arrays


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


def _log_size(log_path: Optional[Callable[[], Optional[Path]]]) -> int:
    path = log_path() if log_path else None
    return path.stat().st_size if path is not None and path.is_file() else 0


def _stage_times(log_path: Optional[Callable[[], Optional[Path]]], offset: int, network: str) -> dict:
    """The served model's stage times logged since `offset`, per batch size (rows of one execute, as text keys)."""
    from thinkserve_backend import stage_times  # the line's format, beside the code that writes it

    path = log_path() if log_path else None
    if path is None or not path.is_file():
        return {}
    with open(path, "rb") as log:
        log.seek(offset)
        text = log.read().decode("utf-8", errors="replace")
    return {str(rows): means for rows, means in sorted(stage_times.parse(text, network).items())}


def path_result(latencies: list[float], wall: float, batch: int) -> dict:
    return {**call_latency_summary(latencies), "rows_per_s": batch * len(latencies) / wall if wall > 0 else None}


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
                           progress: Callable[[str], None], log_path: Optional[Callable[[], Optional[Path]]] = None) -> None:
    """Each network at each batch size both ways; with `log_path` (Triton's log), the served model's stage times over
    the row (thinkserve_backend.stage_times: its execute's inputs, to device, forward, outputs), where it logs them."""
    for network in measured_networks(repository, options):
        if options.left() < 6 * options.seconds * len(options.batches):
            progress(f"  {network}: skipped, out of time")
            record({"model": network, "skipped": "out of time"})
            continue
        config = read_config(repository, network)
        output = config.output[0].name
        image = any(t.data_type == model_config_pb2.TYPE_UINT8 for t in config.input)
        length = 0 if image else text_length(repository, network)
        model = InProcessNetwork(repository, network, options.device)
        try:
            for batch in options.batches:
                arrays = encoder_inputs(config, batch, length, seed=batch)
                log_offset = _log_size(log_path)
                local, wall_local = time_window(lambda: model(arrays), options.seconds, options.min_calls)

                async def call(arrays=arrays):
                    return await client.infer(network, arrays, [output])

                remote, wall_remote = await time_async_window(call, options.seconds, options.min_calls)
                served = (await call())[output]
                row = {
                    "model": network, "public": public_name(network), "batch": batch,
                    "input": f"{length} tokens" if length else "x".join(map(str, config.input[0].dims)) + " uint8 pixels",
                    "in_process": path_result(local, wall_local, batch),
                    "triton": path_result(remote, wall_remote, batch),
                    "max_abs_diff": float(np.abs(served - model(arrays)).max()),
                }
                if batch == max(options.batches) and options.inflight > 1:
                    pipelined, wall = await time_async_window(call, options.seconds, options.min_calls, options.inflight)
                    row["triton_inflight"] = {**path_result(pipelined, wall, batch), "inflight": options.inflight}
                row["triton_share"] = share(row["triton"]["rows_per_s"], row["in_process"]["rows_per_s"])
                stages = _stage_times(log_path, log_offset, network)
                if stages:
                    row["triton_stages"] = stages
                record(row)
                progress(f"  {network} batch {batch}: in-process {row['in_process']['rows_per_s']:.1f} rows/s, "
                         f"Triton {row['triton']['rows_per_s']:.1f} rows/s (share {percent(row['triton_share'])})")
        finally:
            model.close()

