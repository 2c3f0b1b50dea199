"""The gpu target's TensorRT-LLM side: the `tensorrt_llm` model configs, and the script that builds their engines.

Engines are built for one GPU model and TensorRT-LLM version, inside NVIDIA's Triton TensorRT-LLM container, so
the build does not make them: it writes `<repository>.engines/` beside the repository, holding the checkpoints
(hard links into the build cache: the LLM's, the VLM's decoder as a causal LM of its own) and build_engines.sh,
which converts each checkpoint with TensorRT-LLM's `from_hugging_face` and runs `trtllm-build`. Mounted at
`engines_mount` (default /engines) in the container, that folder is where the configs' gpt_model_path points.
It stays outside the model repository: Triton would take any folder there for a model.

The tensors follow the TensorRT-LLM backend's documented config (all_models/inflight_batcher_llm/tensorrt_llm),
transcribed in tests/backend/trtllm_recorded/tensorrt_llm_config.json, which the adapter's tests check too.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

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


def engine_config(spec: EngineSpec, engines_mount: str, queue: Optional[QueueLimits]) -> PlannedModel:
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
    set_parameters(config, engine_parameters(spec, engines_mount))
    return PlannedModel(config)


def engine_parameters(spec: EngineSpec, engines_mount: str) -> dict[str, object]:
    """The backend parameters of an engine's model (their names are checked against the container's backend by
    build_engines.sh, backend_names)."""
    return {
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
        # fails to load. Empty: no guided decoding (tests/backend/trtllm_recorded/backend_parameters.json).
        "tokenizer_dir": "",
        "xgrammar_tokenizer_info_path": "",
        "guided_decoding_backend": "",
    }


def backend_names() -> list[str]:
    """Every name the engine models' configs give the tensorrtllm backend: its parameters and the tensors the
    adapter sends and reads. build_engines.sh looks each up in the container's backend library, so a name the
    pinned release does not know (one renamed between releases: random_seed and seed) stops the build instead of
    being ignored at serving time."""
    sample = EngineSpec("engine", "engine", Path("."), "qwen2", 1, 2, prompt_table_rows=1)
    tensors = [t.name for t in ENGINE_INPUTS + PROMPT_TABLE_INPUTS + ENGINE_OUTPUTS]
    return sorted(set(engine_parameters(sample, "/engines")) | set(tensors))


def trtllm_class(model_type: str) -> str:
    try:
        return TRTLLM_CLASSES[model_type]
    except KeyError:
        raise ValueError(
            f"no TensorRT-LLM model class is known for transformers model_type {model_type!r} "
            f"(known: {', '.join(sorted(TRTLLM_CLASSES))})"
        ) from None


# transformers 5 saves a checkpoint's RoPE under `rope_parameters` ({rope_theta, rope_type, scaling fields}) and no
# top-level `rope_theta`. The converter of the pinned container (TensorRT-LLM 0.20 on transformers 4.x:
# QWenConfig.from_hugging_face reads getattr(hf_config, "rope_theta") and "rope_scaling") then gets transformers 4.x's
# default, 10,000, instead of Qwen's 1,000,000: the engine builds and generates garbage
# (tests/backend/trtllm_recorded/converter_reads.json). The checkpoint handed over carries them at the top level.
ROPE_SCALING_FIELDS = ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor",
                       "beta_fast", "beta_slow", "attention_factor", "mrope_section", "short_factor", "long_factor")


def converter_config(config: dict) -> dict:
    """A checkpoint's config.json as the pinned converter must read it: `rope_theta` (and `rope_scaling` for a
    scaled RoPE) at the top level, taken from transformers 5's `rope_parameters`; a config saved by transformers 4
    is returned as it is. A config naming two different bases, or none, is refused."""
    parameters = config.get("rope_parameters")
    if not parameters:
        if "rope_theta" not in config:
            raise ValueError("the checkpoint's config.json has no RoPE base (neither rope_theta nor rope_parameters): "
                             "TensorRT-LLM's converter would take 10,000")
        return dict(config)
    theta = float(parameters["rope_theta"])
    if "rope_theta" in config and float(config["rope_theta"]) != theta:
        raise ValueError(f"the checkpoint's config.json names two RoPE bases: rope_theta {config['rope_theta']} "
                         f"and rope_parameters {theta}")
    handed = {**config, "rope_theta": theta}
    kind = parameters.get("rope_type", parameters.get("type", "default"))
    if kind == "default":
        handed.setdefault("rope_scaling", None)
    else:  # transformers 4.x's rope_scaling; TensorRT-LLM's RotaryScalingType reads "type" (older) or "rope_type"
        handed["rope_scaling"] = {"type": kind, "rope_type": kind,
                                  **{k: v for k, v in parameters.items() if k in ROPE_SCALING_FIELDS}}
    if "partial_rotary_factor" in parameters:
        handed.setdefault("partial_rotary_factor", parameters["partial_rotary_factor"])
    return handed


CHECKS_FILE = "check_engines.py"
STARTUP_FILE = "startup.json"
# Checks build_engines.sh runs inside the container (the standard library only). `names`: every name the engine
# models' configs give the backend is in the container's tensorrtllm backend as a string of its own; a name held only
# inside a longer one (random_seed for seed) is refused too, as that is how a renamed input looks (set
# THINKSERVE_TRUST_NAMES=1 to go on anyway). `rope`: a converted checkpoint's rotary_base is the checkpoint's.
CHECKS_SCRIPT = r"""#!/usr/bin/env python3
# Generated by thinkserve-build --target gpu; run by build_engines.sh inside NVIDIA's Triton TensorRT-LLM container.
import json, math, os, re, sys
from pathlib import Path

NAMES = __NAMES__


def names(folder):
    data = b"".join(path.read_bytes() for path in sorted(Path(folder).glob("*.so*")) if path.is_file())
    if not data:
        sys.exit(f"check_engines: no backend library under {folder}")
    missing, inside = [], {}
    for name in NAMES:
        if re.search(rb"(?<![A-Za-z0-9_])" + re.escape(name.encode()) + rb"\x00", data):
            continue
        longer = sorted({m.decode() for m in re.findall(rb"[A-Za-z0-9_]+" + re.escape(name.encode()) + rb"(?=\x00)", data)})
        (inside.__setitem__(name, longer[:3]) if longer else missing.append(name))
    problems = [f"{name} (not in the backend)" for name in missing]
    problems += [f"{name} (only inside {', '.join(longer)})" for name, longer in inside.items()]
    if problems and os.environ.get("THINKSERVE_TRUST_NAMES") != "1":
        print("check_engines: the engine configs use names this container's tensorrtllm backend does not read: "
              + "; ".join(problems) + ". Rebuild the repository for this release (or THINKSERVE_TRUST_NAMES=1).",
              file=sys.stderr)
        sys.exit(1)
    print(f"check_engines: {len(NAMES)} names found in the backend" + (f" (trusted: {problems})" if problems else ""))


def rope(converted, expected):
    found = json.loads(Path(converted).read_text()).get("rotary_base")
    if found is None or not math.isclose(float(found), float(expected), rel_tol=1e-6):
        print(f"check_engines: {converted} has rotary_base {found}, the checkpoint's RoPE base is {float(expected)}: "
              "this converter misread the checkpoint's config.json; the engine would generate garbage", file=sys.stderr)
        sys.exit(1)
    print(f"check_engines: rotary_base {found}")


if __name__ == "__main__":
    {"names": lambda: names(sys.argv[2]), "rope": lambda: rope(sys.argv[2], sys.argv[3])}[sys.argv[1]]()
"""

BUILD_SCRIPT = """#!/usr/bin/env bash
# Generated by thinkserve-build --target gpu: builds the TensorRT-LLM engines that {models} serve, then starts the
# whole repository once so that every encoder's TensorRT engine is built too, and times a warm start.
# Run it inside NVIDIA's Triton TensorRT-LLM container (the image's trtllm flavour), on the GPU model that will
# serve them, with this folder at {mount}, the model repository at $MODELS (default /models) and the TensorRT cache
# volume where the encoders' configs write it (/data/tensorrt-cache):
#   docker run --rm --gpus all --shm-size=2g -v "$PWD/{folder}:{mount}" -v "$PWD/<repository>:/models:ro" \\
#     -v thinkserve_tensorrt-cache:/data/tensorrt-cache thinkserve --entrypoint bash {mount}/build_engines.sh
# STARTUP_BUDGET_S (default 600): the startup probes' allowance; the build fails when the warm start needs more than
# half of it, so that a deployment is not killed by its own probe while it loads.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
models="${{MODELS:-/models}}"
budget="${{STARTUP_BUDGET_S:-600}}"
if ! command -v trtllm-build >/dev/null; then
  echo "build_engines.sh: trtllm-build is not on PATH: run this inside NVIDIA's Triton TensorRT-LLM container" >&2
  exit 1
fi
# 1. the names the engine configs use, against this release's backend (a renamed one is otherwise ignored)
python3 "$here/{checks}" names "${{TRTLLM_BACKEND_DIR:-/opt/tritonserver/backends/tensorrtllm}}"
convert() {{  # a transformers checkpoint -> a TensorRT-LLM checkpoint ($1 model class, $2 in, $3 out)
  python3 -c 'import sys, tensorrt_llm.models as m; getattr(m, sys.argv[1]).from_hugging_face(sys.argv[2], dtype=sys.argv[4]).save_checkpoint(sys.argv[3])' "$1" "$2" "$3" {dtype}
}}
check_rope() {{  # the converted checkpoint's RoPE base is the checkpoint's ($1 engine folder, $2 base)
  python3 "$here/{checks}" rope "$here/converted/$1/config.json" "$2"
}}
# 2. the TensorRT-LLM engines
{steps}
echo "engines built under $here"
# 3. the encoders' TensorRT engines: onnxruntime builds them when a model first loads, which would otherwise happen
#    at the first start of the service, under its startup probe. Start the repository once (building them into the
#    cache volume), then again, warm, timed: what the startup probes must allow.
if [ ! -f "$models/llm_engine/config.pbtxt" ]; then
  echo "build_engines.sh: no repository at $models: the encoders' TensorRT engines will be built at the first start" >&2
  exit 0
fi
[ -d /opt/thinkserve/.venv-triton/bin ] && export PATH="/opt/thinkserve/.venv-triton/bin:$PATH"
start_once() {{  # start tritonserver on the whole repository as the service does, wait until ready, stop; prints seconds
  local began=$SECONDS pid
  tritonserver --model-repository="$models" --model-control-mode=explicit --load-model='*' --exit-timeout-secs=10 \\
    --http-port=18000 --grpc-port=18001 --metrics-port=18002 >"$here/first-start-$1.log" 2>&1 &
  pid=$!
  until python3 -c 'import urllib.request; urllib.request.urlopen("http://127.0.0.1:18000/v2/health/ready", timeout=3)' 2>/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "build_engines.sh: tritonserver exited while loading the repository: see $here/first-start-$1.log" >&2
      return 1
    fi
    sleep 2
  done
  echo $((SECONDS - began))
  kill -TERM "$pid" && wait "$pid" || true
}}
cold=$(start_once cold)
warm=$(start_once warm)
printf '{{"cold_start_s": %s, "warm_start_s": %s, "startup_budget_s": %s}}\\n' "$cold" "$warm" "$budget" >"$here/{startup}"
echo "repository started in ${{cold}} s cold (TensorRT engines built), ${{warm}} s warm; the probes allow ${{budget}} s"
if [ $((2 * warm)) -gt "$budget" ]; then
  echo "build_engines.sh: a warm start takes ${{warm}} s, more than half the startup probes' ${{budget}} s: raise" \\
       "TRITON_START_PERIOD_S (compose) or the startupProbe's failureThreshold and STARTUP_BUDGET_S (Kubernetes)" >&2
  exit 1
fi
"""

ENGINE_STEP = """
echo "{folder}: converting {model_type} ({trtllm_class}) and building"
convert {trtllm_class} "$here/checkpoints/{folder}" "$here/converted/{folder}"
check_rope {folder} {rope_theta!r}
trtllm-build --checkpoint_dir "$here/converted/{folder}" --output_dir "$here/{folder}" \\
  --max_batch_size {max_batch_size} --max_seq_len {max_seq_len} --max_input_len {max_input_len} \\
  --max_num_tokens {max_num_tokens} --gather_generation_logits --logits_dtype float32 \\
  --gemm_plugin auto --remove_input_padding enable --kv_cache_type paged --use_paged_context_fmha enable{prompt_table}
"""


def build_script(specs: list[EngineSpec], folder_name: str, mount: str) -> str:
    steps = []
    for spec in specs:
        table = f" \\\n  --max_prompt_embedding_table_size {spec.prompt_table_rows}" if spec.prompt_table_rows else ""
        rope_theta = converter_config(json.loads((spec.checkpoint / "config.json").read_text()))["rope_theta"]
        steps.append(ENGINE_STEP.format(
            folder=spec.folder, model_type=spec.model_type, trtllm_class=trtllm_class(spec.model_type),
            rope_theta=float(rope_theta), max_batch_size=spec.max_batch_size, max_seq_len=spec.max_seq_len,
            max_input_len=spec.max_seq_len - 1, max_num_tokens=max(spec.max_seq_len, 8192), prompt_table=table,
        ))
    return BUILD_SCRIPT.format(
        models=", ".join(spec.model for spec in specs), mount=mount, folder=shlex.quote(folder_name),
        dtype=ENGINE_DTYPE, steps="".join(steps).rstrip() + "\n", checks=CHECKS_FILE, startup=STARTUP_FILE,
    )


def engines_folder(repository: Path) -> Path:
    return repository.with_name(repository.name + ".engines")


def write_engines_folder(repository: Path, specs: list[EngineSpec], mount: str) -> Path:
    """`<repository>.engines/`: each engine's checkpoint (hard links to the build's files, but config.json, written
    as the pinned converter must read it: converter_config), build_engines.sh and its checks; engines already built
    there are left alone."""
    folder = engines_folder(repository)
    for spec in specs:
        target = folder / "checkpoints" / spec.folder
        target.mkdir(parents=True, exist_ok=True)
        for file in spec.checkpoint.iterdir():
            if file.is_file() and file.name != "config.json":
                link_file(file, target / file.name)
        config = target / "config.json"
        config.unlink(missing_ok=True)  # a hard link into the build cache, from an earlier build: never written through
        config.write_text(json.dumps(converter_config(json.loads((spec.checkpoint / "config.json").read_text())), indent=2) + "\n")
    checks = folder / CHECKS_FILE
    checks.write_text(CHECKS_SCRIPT.replace("__NAMES__", repr(backend_names())))
    script = folder / "build_engines.sh"
    script.write_text(build_script(specs, folder.name, mount))
    script.chmod(0o755)
    return folder


def artifact_checkpoint(artifact: Artifact, directory_fact: str) -> Path:
    return artifact.directory / artifact.facts[directory_fact]
