"""The gpu target's memory plan: sizes from checkpoints and graphs, a repository that cannot fit refused before it
is written, and engines whose KV cache is sized in tokens by the plan."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from orchestrator.models import contracts
from tests.compiler.test_compiler import CACHE
from thinkserve_build import compiler, gpu_memory, profiles
from thinkserve_build.gpu_memory import GpuMemoryError, kv_cache_bytes, safetensors_parameters


def test_the_kv_cache_of_a_grouped_query_decoder_counts_its_kv_heads_only():
    qwen25_15b = {"num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2, "hidden_size": 1536}
    # 2 (keys, values) x 28 layers x 2 KV heads x 128 dims x 2 bytes: 28 KiB a token, Qwen2.5-1.5B's published figure
    assert kv_cache_bytes(qwen25_15b, 1) == 28 * 1024
    assert kv_cache_bytes({**qwen25_15b, "num_key_value_heads": None}, 1000) == 6 * kv_cache_bytes(qwen25_15b, 1000)


def test_parameters_are_read_from_the_safetensors_headers(tmp_path):
    save_file({"a": np.zeros((3, 4), np.float32), "b": np.zeros(5, np.float16)}, str(tmp_path / "model.safetensors"))
    assert safetensors_parameters([tmp_path / "model.safetensors"]) == 17


def test_a_plan_over_the_declared_memory_is_refused_naming_what_takes_most(tmp_path):
    checkpoint = tmp_path / "llm"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps(
        {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "hidden_size": 64}))
    save_file({"w": np.zeros((1000, 1000), np.float32)}, str(checkpoint / "model.safetensors"))
    plan = gpu_memory.plan([("llm_engine", checkpoint, 1 << 20)], [("encoder", 1 << 30)], [], 1 << 30, 0, declared_gb=2.0)
    kinds = {(item.model, item.kind): item.bytes for item in plan.items}
    assert kinds[("llm_engine", "weights")] == 2_000_000  # bfloat16 engines
    assert kinds[("llm_engine", "kv_cache")] == 2 * 2 * 4 * 16 * (1 << 20) * 2
    assert not plan.fits
    with pytest.raises(GpuMemoryError, match=r"more than the 1\.8 GiB usable of the declared 2\.0 GiB.*largest: encoder"):
        plan.check()
    assert gpu_memory.plan([], [], [], 0, 0, declared_gb=None).fits  # nothing declared: reported, never refused


def test_the_gpu_build_writes_its_plan_sizes_the_kv_caches_in_tokens_and_refuses_a_gpu_too_small(tmp_path):
    output = tmp_path / "tiny-gpu"
    lines: list[str] = []
    models = compiler.compile_repository(profiles.tiny(), output, CACHE, target="gpu", log=lines.append, gpu_memory_gb=80)
    plan = json.loads((tmp_path / "tiny-gpu.engines" / "memory_plan.json").read_text())
    assert plan["fits"] and plan["declared_bytes"] == 80 << 30 and any("GPU memory plan" in line for line in lines)
    configs = {m.name: m.config for m in models}
    for engine, adapter in (("llm_engine", "llm"), ("vlm_engine", "vlm")):
        config = configs[engine]
        tokens = int(config.parameters["max_tokens_in_paged_kv_cache"].string_value)
        context = int(configs[adapter].parameters[contracts.CONTEXT_PARAMETER].string_value)
        assert tokens == config.max_batch_size * context  # every request in flight at its full length
        (kv,) = [item for item in plan["items"] if item["model"] == engine and item["kind"] == "kv_cache"]
        assert kv["note"].startswith(f"{tokens:,} tokens") and kv["bytes"] > 0
    small = tmp_path / "too-small"
    with pytest.raises(GpuMemoryError, match="more than the"):
        compiler.compile_repository(profiles.tiny(), small, CACHE, target="gpu", log=lambda _: None, gpu_memory_gb=0.5)
    assert not small.exists()  # refused before anything was written

