"""The gpu target's TensorRT-LLM side: the `tensorrt_llm` model configs, and the script that builds their engines.

Engines are built for one GPU model and TensorRT-LLM version, inside NVIDIA's Triton TensorRT-LLM container, so
the build does not make them: it writes `<repository>.engines/` beside the repository, holding the checkpoints
(hard links into the build cache: the LLM's, the VLM's decoder as a causal LM of its own) and build_engines.sh,
which converts each checkpoint with TensorRT-LLM's `from_hugging_face` and runs `trtllm-build`. Mounted at
`engines_mount` (default /engines) in the container, that folder is where the configs' gpt_model_path points.
It stays outside the model repository: Triton would take any folder there for a model.

The tensors follow the TensorRT-LLM backend's documented config (all_models/inflight_batcher_llm/tensorrt_llm),
transcribed in tests/unit/trtllm_recorded/tensorrt_llm_config.json, which the adapter's tests check too.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from orchestrator.models.contracts import Tensor

from .artifacts import Artifact
from .model_config import PlannedModel, QueueLimits, add_tensor, schedule, set_parameters
from .repository import link_file

# TensorRT-LLM model classes by a checkpoint's transformers model_type.
TRTLLM_CLASSES = {"qwen2": "QWenForCausalLM", "llama": "LLaMAForCausalLM", "mistral": "LLaMAForCausalLM"}
ENGINE_DTYPE = "bfloat16"
EXECUTOR_WORKER = "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"
# Share of the GPU memory left free once the weights are loaded that each engine's KV cache may take at most: two
# engines (LLM, VLM) and the encoders share one GPU. The cache is sized in tokens (EngineSpec.kv_tokens, the memory
# plan's); the backend takes the smaller of the two.
KV_CACHE_FREE_GPU_MEMORY_FRACTION = 0.4

ENGINE_INPUTS = (
    Tensor("input_ids", "INT32", (-1,)),
    Tensor("input_lengths", "INT32", (1,)),
    Tensor("request_output_len", "INT32", (1,)),
    Tensor("end_id", "INT32", (1,), optional=True),
    Tensor("pad_id", "INT32", (1,), optional=True),
    Tensor("stop_words_list", "INT32", (2, -1), optional=True),
    Tensor("temperature", "FP32", (1,), optional=True),
    Tensor("runtime_top_k", "INT32", (1,), optional=True),
    Tensor("runtime_top_p", "FP32", (1,), optional=True),
    Tensor("seed", "UINT64", (1,), optional=True),
    Tensor("return_log_probs", "BOOL", (1,), optional=True),
    Tensor("return_generation_logits", "BOOL", (1,), optional=True),
    Tensor("exclude_input_in_output", "BOOL", (1,), optional=True),
    Tensor("stop", "BOOL", (1,), optional=True),
    Tensor("streaming", "BOOL", (1,), optional=True),
)
PROMPT_TABLE_INPUTS = (
    Tensor("prompt_embedding_table", "BF16", (-1, -1), optional=True),  # the engine's dtype (ENGINE_DTYPE)
    Tensor("prompt_vocab_size", "INT32", (1,), optional=True),
)
ENGINE_OUTPUTS = (
    Tensor("output_ids", "INT32", (-1, -1)),
    Tensor("sequence_length", "INT32", (-1,)),
    Tensor("output_log_probs", "FP32", (-1, -1)),
    Tensor("generation_logits", "FP32", (-1, -1, -1)),
    Tensor("batch_index", "INT32", (1,)),
)
RAGGED = ("input_ids", "prompt_embedding_table")


def reshaped_to_scalar(tensor: Tensor) -> bool:
    """Whether the config declares `reshape: { shape: [ ] }` for this input, as the backend's template does for every
    one-value input: with more than one request in a batch the backend splits the batch by input_lengths and checks
    that tensor's rank is 1 (`splitBatchInputsTensors`, triton_backend/inflight_batcher_llm/src/utils.cc), so a
    [batch, 1] tensor fails every batched call (the VLM page filter's, the router's under load)."""
    return tensor.dims == (1,) and tensor.name not in RAGGED


@dataclass(frozen=True)
class EngineSpec:
    """One TensorRT-LLM engine: the model that serves it, the checkpoint it is built from, its limits."""

    model: str  # the tensorrt_llm model's name in the repository (llm_engine, vlm_engine)
    folder: str  # its engine and checkpoint folder names under the engines folder (llm, vlm)
    checkpoint: Path  # a transformers causal-LM checkpoint folder
    model_type: str  # its transformers model_type
    max_batch_size: int  # requests in flight together (in-flight batching)
    max_seq_len: int  # prompt + generated tokens (the generator's max_context)
    prompt_table_rows: int = 0  # a VLM: image feature rows the engine takes per batch (0: no prompt table)

    @property
    def kv_tokens(self) -> int:
        """The KV cache's positions: every request in flight at its full length (what guaranteed_no_evict
        admits), so the cache is sized by the plan (gpu_memory.py), not by what loaded before the engine."""
        return self.max_batch_size * self.max_seq_len


def engine_config(spec: EngineSpec, engines_mount: str, queue: QueueLimits) -> PlannedModel:
    """The tensorrt_llm model of an engine: decoupled (streaming), in-flight batched by the backend itself."""
    config = mc.ModelConfig(name=spec.model, backend="tensorrtllm", max_batch_size=spec.max_batch_size)
    config.model_transaction_policy.decoupled = True
    inputs = ENGINE_INPUTS + (PROMPT_TABLE_INPUTS if spec.prompt_table_rows else ())
    for tensor in inputs:
        add_tensor(config.input, tensor, ragged=tensor.name in RAGGED)
        if reshaped_to_scalar(tensor):
            config.input[-1].reshape.SetInParent()  # an empty shape: the batch dimension alone
    for tensor in ENGINE_OUTPUTS:
        add_tensor(config.output, tensor)
    # The backend schedules on the GPU itself: its Triton instance is a CPU one (as NVIDIA's template has it).
    schedule(config, 0, 1, "cpu", queue)
    config.dynamic_batching.preferred_batch_size.append(spec.max_batch_size)
    set_parameters(config, {
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": f"{engines_mount}/{spec.folder}",
        "max_beam_width": 1,
        "batch_scheduler_policy": "guaranteed_no_evict",
        "kv_cache_free_gpu_mem_fraction": KV_CACHE_FREE_GPU_MEMORY_FRACTION,
        "max_tokens_in_paged_kv_cache": spec.kv_tokens,
        "exclude_input_in_output": True,
        "enable_chunked_context": True,
        # The router's and the answer's prompts share long prefixes (instructions, the evidence of one question): their
        # KV blocks are reused across requests. Not on an engine fed a prompt table: images enter as the same
        # placeholder ids, so two pages' prompts would look alike and one would reuse the other's cache (telling them
        # apart needs prompt_table_extra_ids per image, which the adapter does not send).
        "enable_kv_cache_reuse": spec.prompt_table_rows == 0,
        "cancellation_check_period_ms": 10,
        "executor_worker_path": EXECUTOR_WORKER,
        # The backend reads these three without a fallback (getGuidedDecodingConfigFromParams): a config without them
        # fails to load. Empty: no guided decoding (tests/unit/trtllm_recorded/backend_parameters.json).
        "tokenizer_dir": "",
        "xgrammar_tokenizer_info_path": "",
        "guided_decoding_backend": "",
    })
    return PlannedModel(config)


def trtllm_class(model_type: str) -> str:
    try:
        return TRTLLM_CLASSES[model_type]
    except KeyError:
        raise ValueError(
            f"no TensorRT-LLM model class is known for transformers model_type {model_type!r} "
            f"(known: {', '.join(sorted(TRTLLM_CLASSES))})"
        ) from None


BUILD_SCRIPT = """#!/usr/bin/env bash
# Generated by thinkserve-build --target gpu: builds the TensorRT-LLM engines that {models} serve.
# Run it inside NVIDIA's Triton TensorRT-LLM container, on the GPU model that will serve them, with this folder
# mounted at {mount}:
#   docker run --rm --gpus all -v "$PWD/{folder}:{mount}" nvcr.io/nvidia/tritonserver:<yy.mm>-trtllm-python-py3 \\
#     bash {mount}/build_engines.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if ! command -v trtllm-build >/dev/null; then
  echo "build_engines.sh: trtllm-build is not on PATH: run this inside NVIDIA's Triton TensorRT-LLM container" >&2
  exit 1
fi
convert() {{  # a transformers checkpoint -> a TensorRT-LLM checkpoint ($1 model class, $2 in, $3 out)
  python3 -c 'import sys, tensorrt_llm.models as m; getattr(m, sys.argv[1]).from_hugging_face(sys.argv[2], dtype=sys.argv[4]).save_checkpoint(sys.argv[3])' "$1" "$2" "$3" {dtype}
}}
{steps}
echo "engines built under $here"
"""

ENGINE_STEP = """
echo "{folder}: converting {model_type} ({trtllm_class}) and building"
convert {trtllm_class} "$here/checkpoints/{folder}" "$here/converted/{folder}"
trtllm-build --checkpoint_dir "$here/converted/{folder}" --output_dir "$here/{folder}" \\
  --max_batch_size {max_batch_size} --max_seq_len {max_seq_len} --max_input_len {max_input_len} \\
  --max_num_tokens {max_num_tokens} --gather_generation_logits --logits_dtype float32 \\
  --gemm_plugin auto --remove_input_padding enable --kv_cache_type paged --use_paged_context_fmha enable{prompt_table}
"""


def build_script(specs: list[EngineSpec], folder_name: str, mount: str) -> str:
    steps = []
    for spec in specs:
        table = f" \\\n  --max_prompt_embedding_table_size {spec.prompt_table_rows}" if spec.prompt_table_rows else ""
        steps.append(ENGINE_STEP.format(
            folder=spec.folder, model_type=spec.model_type, trtllm_class=trtllm_class(spec.model_type),
            max_batch_size=spec.max_batch_size, max_seq_len=spec.max_seq_len, max_input_len=spec.max_seq_len - 1,
            max_num_tokens=max(spec.max_seq_len, 8192), prompt_table=table,
        ))
    return BUILD_SCRIPT.format(
        models=", ".join(spec.model for spec in specs), mount=mount, folder=shlex.quote(folder_name),
        dtype=ENGINE_DTYPE, steps="".join(steps).rstrip() + "\n",
    )


def engines_folder(repository: Path) -> Path:
    return repository.with_name(repository.name + ".engines")


def write_engines_folder(repository: Path, specs: list[EngineSpec], mount: str) -> Path:
    """`<repository>.engines/`: each engine's checkpoint (hard links) and build_engines.sh; engines already built
    there are left alone."""
    folder = engines_folder(repository)
    for spec in specs:
        target = folder / "checkpoints" / spec.folder
        target.mkdir(parents=True, exist_ok=True)
        for file in spec.checkpoint.iterdir():
            if file.is_file():
                link_file(file, target / file.name)
    script = folder / "build_engines.sh"
    script.write_text(build_script(specs, folder.name, mount))
    script.chmod(0o755)
    return folder


def artifact_checkpoint(artifact: Artifact, directory_fact: str) -> Path:
    return artifact.directory / artifact.facts[directory_fact]
