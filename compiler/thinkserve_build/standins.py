"""The realistic-size stand-ins of the deployed models: the published architecture of the checkpoint the `hf`
build profile serves for each role (thinkserve_build.profiles.hf), as a transformers config class and its fields,
built with random weights. The compiler builds them into the `standin` repository (recipes.py), a GPU machine
without hub access serves them, and `thinkserve-bench standins` times the same models in PyTorch: one table.

`preset="test"` has the same classes with toy dimensions, so the whole path runs in the test suite.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from orchestrator.prompts import ROUTE_SYSTEM, route_request

PRESETS = ("hf", "test")


@dataclass(frozen=True)
class StandIn:
    """What a role's stand-in mirrors and how to build it (transformers config class name and its fields)."""

    mirrors: str  # the hf profile checkpoint whose published dimensions it copies
    model_class: str  # transformers class built from the config with random weights
    config_class: str
    config: dict[str, Any]
    vision: Optional[dict[str, Any]] = None  # VLM: SiglipVisionConfig fields of its vision tower
    image_size: int = 0  # image encoders and the VLM: input resolution
    max_length: int = 0  # encoders: the served truncation (the hf profile's max_length); 0: none
    pad_to_max_length: bool = False
    prefix_tokens: int = 0  # prompt tokens around the text a call counts (the router's question to the LLM)


# The routing prompt around a question, in Qwen's tokens: its text at about 4 characters a token, plus the chat
# template's markers.
ROUTE_PROMPT_TOKENS = len(ROUTE_SYSTEM + route_request("")) // 4 + 10


def _hf_standins() -> dict[str, StandIn]:
    # rope_theta: both checkpoints' (1,000,000), not transformers' default 10,000, which is what a converter that misses
    # the setting falls back to (thinkserve_build.trtllm_engines.converter_config)
    qwen15_05b = dict(vocab_size=151646, hidden_size=1024, intermediate_size=2816, num_hidden_layers=24,
                      num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=32768, tie_word_embeddings=True,
                      rope_theta=1_000_000.0)
    qwen25_15b = dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                      num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768, tie_word_embeddings=True,
                      rope_theta=1_000_000.0)
    return {
        "text_embedder": StandIn("sentence-transformers/all-MiniLM-L6-v2", "BertModel", "BertConfig",
                                 dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                                      intermediate_size=1536, max_position_embeddings=512), max_length=256),
        "reranker": StandIn("BAAI/bge-reranker-v2-m3", "XLMRobertaForSequenceClassification", "XLMRobertaConfig",
                            dict(vocab_size=250002, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                                 intermediate_size=4096, max_position_embeddings=8194, num_labels=1), max_length=512),
        # the router asks the LLM: one prefill of the routing prompt (thinkserve_build.profiles.PromptRouterSpec)
        "router": StandIn("Qwen/Qwen2.5-1.5B-Instruct", "Qwen2ForCausalLM", "Qwen2Config", qwen25_15b, max_length=256,
                          prefix_tokens=ROUTE_PROMPT_TOKENS),
        "page_text_clip": StandIn("openai/clip-vit-base-patch32", "CLIPTextModelWithProjection", "CLIPTextConfig",
                                  dict(vocab_size=49408, hidden_size=512, num_hidden_layers=12, num_attention_heads=8,
                                       intermediate_size=2048, max_position_embeddings=77, projection_dim=512),
                                  max_length=77),
        "page_image_clip": StandIn("openai/clip-vit-base-patch32", "CLIPVisionModelWithProjection", "CLIPVisionConfig",
                                   dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                                        image_size=224, patch_size=32, projection_dim=512), image_size=224),
        # OpenCLIP ViT-B/32 (LAION-2B): the architecture of OpenAI's ViT-B/32 with other weights
        "page_text_openclip": StandIn("laion/CLIP-ViT-B-32-laion2B-s34B-b79K", "CLIPTextModelWithProjection", "CLIPTextConfig",
                                      dict(vocab_size=49408, hidden_size=512, num_hidden_layers=12, num_attention_heads=8,
                                           intermediate_size=2048, max_position_embeddings=77, projection_dim=512),
                                      max_length=77),
        "page_image_openclip": StandIn("laion/CLIP-ViT-B-32-laion2B-s34B-b79K", "CLIPVisionModelWithProjection",
                                       "CLIPVisionConfig", dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                                                intermediate_size=3072, image_size=224, patch_size=32,
                                                                projection_dim=512), image_size=224),
        "page_text_siglip": StandIn("google/siglip-base-patch16-224", "SiglipTextModel", "SiglipTextConfig",
                                    dict(vocab_size=32000, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                         intermediate_size=3072, max_position_embeddings=64,
                                         bos_token_id=0, eos_token_id=1, pad_token_id=1),  # inside its 32k vocabulary
                                    max_length=64, pad_to_max_length=True),
        "page_image_siglip": StandIn("google/siglip-base-patch16-224", "SiglipVisionModel", "SiglipVisionConfig",
                                     dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                          intermediate_size=3072, image_size=224, patch_size=16), image_size=224),
        "llm": StandIn("Qwen/Qwen2.5-1.5B-Instruct", "Qwen2ForCausalLM", "Qwen2Config", qwen25_15b),
        # LLaVA-interleave 0.5B: SigLIP-so400m (384 px, patch 14: 729 positions per image) -> 2-layer MLP ->
        # a Qwen1.5-0.5B decoder. vlm_relevance is the same model's one-step prefill.
        "vlm": StandIn("llava-hf/llava-interleave-qwen-0.5b-hf", "Qwen2ForCausalLM", "Qwen2Config", qwen15_05b,
                       vision=dict(hidden_size=1152, num_hidden_layers=27, num_attention_heads=16, intermediate_size=4304,
                                   image_size=384, patch_size=14), image_size=384),
        "vlm_relevance": StandIn("llava-hf/llava-interleave-qwen-0.5b-hf", "Qwen2ForCausalLM", "Qwen2Config", qwen15_05b,
                                 vision=dict(hidden_size=1152, num_hidden_layers=27, num_attention_heads=16,
                                             intermediate_size=4304, image_size=384, patch_size=14), image_size=384),
    }


def _test_standins() -> dict[str, StandIn]:
    """The same classes with toy dimensions: seconds to build and run on a CPU."""
    toy = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    out = {}
    for role, s in _hf_standins().items():
        config = {**s.config, **toy}
        if "vocab_size" in config:
            config["vocab_size"] = 1000
        if "num_key_value_heads" in config:
            config["num_key_value_heads"] = 2
        if "projection_dim" in config:
            config["projection_dim"] = 16
        vision = {**s.vision, **toy, "image_size": 28, "patch_size": 14} if s.vision else None
        image_size = 28 if s.vision else (32 if s.image_size else 0)
        if "image_size" in config:
            config.update(image_size=32, patch_size=16)
        if s.config_class == "CLIPTextConfig":  # its special tokens must lie inside the toy vocabulary
            config.update(bos_token_id=0, eos_token_id=2, pad_token_id=1)
        out[role] = StandIn(s.mirrors, s.model_class, s.config_class, config, vision, image_size, s.max_length,
                            s.pad_to_max_length, s.prefix_tokens)
    return out


def standins(preset: str) -> dict[str, StandIn]:
    if preset not in PRESETS:
        raise ValueError(f"unknown stand-in preset {preset!r}; known: {', '.join(PRESETS)}")
    return _hf_standins() if preset == "hf" else _test_standins()


def image_positions(standin: StandIn) -> int:
    """Prompt positions one image takes in the stand-in VLM: one per vision patch."""
    return (standin.image_size // standin.vision["patch_size"]) ** 2 if standin.vision else 0
