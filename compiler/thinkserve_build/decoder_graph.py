"""The LLM/VLM decoder's ONNX graph: the checkpoint's own layers, with an attention that reads a KV buffer the
caller owns and returns only the step's new keys and values.

Inputs: `input_ids` [b, n] (or `inputs_embeds` [b, n, d]), `position_ids` [b, n], `past_sequence_length` (int64
scalar: how many positions of the buffer hold cached tokens) and, per layer, the buffer
`past_key_values.{i}.{key,value}` [b, kv_heads, capacity, head_dim]. Outputs: `logits` [b, n, vocab] and the
step's `new_key_values.{i}.{key,value}` [b, kv_heads, n, head_dim], which the caller writes into its buffer at
[past, past + n) (thinkserve_backend.decoding). The buffer is an input bound where it lies: a step never copies
the cache, neither into the graph nor out of it, and attention reads it once per key/value head (the query
heads that share a key/value head are one matrix product, so keys and values are never repeated per head).

Attention is causal over the cached positions and the new ones, nothing else: the loop never pads a sequence.
The scores of the cache and of the new tokens are computed apart and share one softmax, so the cache is never
concatenated with the new keys; buffer positions at or past `past_sequence_length` are masked out.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from . import onnx_tools

ATTENTION = "thinkserve_buffer_attention"  # the attention implementation set on the model while exporting


def buffer_attention(query, key, value, past_key, past_value, past_length, scaling: float):
    """query [b, heads, n, d]; this step's key and value [b, kv_heads, n, d] (rotary applied); the buffer
    [b, kv_heads, capacity, d] of which the first `past_length` positions are cached -> output [b, n, heads, d]."""
    batch, heads, length, head_dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    # Query heads j*groups .. j*groups+groups-1 attend with key/value head j (transformers' repeat_kv order):
    # stacked as rows (g, i) of one matrix per key/value head.
    q = query.reshape(batch, kv_heads, groups * length, head_dim)
    capacity = past_key.shape[2]
    cached = torch.arange(capacity) < past_length
    past_scores = torch.matmul(q, past_key.transpose(-1, -2)) * scaling
    past_scores = past_scores.masked_fill(~cached, float("-inf"))
    positions = torch.arange(length)
    causal = (positions[None, :] <= positions[:, None]).repeat(groups, 1)  # row (g, i) sees new tokens <= i
    new_scores = (torch.matmul(q, key.transpose(-1, -2)) * scaling).masked_fill(~causal, float("-inf"))
    probabilities = torch.softmax(torch.cat([past_scores, new_scores], dim=-1), dim=-1, dtype=torch.float32)
    probabilities = probabilities.to(query.dtype)
    output = torch.matmul(probabilities[..., :capacity], past_value) + torch.matmul(probabilities[..., capacity:], value)
    return output.reshape(batch, heads, length, head_dim).transpose(1, 2)


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, thinkserve_kv=None, **kwargs):
    """transformers' attention interface, called with no cache object (nothing was concatenated)."""
    if kwargs.get("sliding_window") or kwargs.get("softcap"):
        raise ValueError("sliding-window and soft-capped attention are not exported")
    layer = module.layer_idx
    output = buffer_attention(
        query,
        key,
        value,
        thinkserve_kv["past"][2 * layer],
        thinkserve_kv["past"][2 * layer + 1],
        thinkserve_kv["past_length"],
        float(scaling if scaling is not None else query.shape[-1] ** -0.5),
    )
    thinkserve_kv["new"][layer] = (key, value)
    return output, None


class BufferDecoder(nn.Module):
    """A decoder backbone + LM head with the graph inputs and outputs above."""

    def __init__(self, backbone: nn.Module, lm_head: nn.Module, text_config, takes_embeddings: bool):
        super().__init__()
        self.backbone, self.lm_head, self.text_config = backbone, lm_head, text_config
        self.takes_embeddings = takes_embeddings
        self.num_layers = text_config.num_hidden_layers

    def forward(self, primary, position_ids, past_sequence_length, *past):
        state = {"past": past, "past_length": past_sequence_length, "new": {}}
        inputs = {"inputs_embeds": primary} if self.takes_embeddings else {"input_ids": primary}
        # No cache object and no mask: the attention above reads the buffer and is causal by itself.
        output = self.backbone(**inputs, position_ids=position_ids, use_cache=False, thinkserve_kv=state)
        new = [t for layer in range(self.num_layers) for t in state["new"][layer]]
        return (self.lm_head(output.last_hidden_state), *new)


def export(backbone: nn.Module, lm_head: nn.Module, text_config, takes_embeddings: bool, path: Path) -> Path:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, _attention)
    layers = text_config.num_hidden_layers
    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
    kv_heads = text_config.num_key_value_heads
    length, past_length, capacity = 5, 3, 16  # a buffer longer than the tokens in it, as served
    if takes_embeddings:
        primary_name, primary = "inputs_embeds", torch.randn(1, length, text_config.hidden_size)
    else:
        primary_name, primary = "input_ids", torch.randint(0, text_config.vocab_size, (1, length))
    past_names = [f"past_key_values.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    new_names = [f"new_key_values.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    args = (
        primary,
        torch.arange(past_length, past_length + length).unsqueeze(0),
        torch.tensor(past_length, dtype=torch.int64),
        *[torch.randn(1, kv_heads, capacity, head_dim) for _ in past_names],
    )
    axes = {
        primary_name: {0: "batch", 1: "sequence"},
        "position_ids": {0: "batch", 1: "sequence"},
        "logits": {0: "batch", 1: "sequence"},
        **{name: {0: "batch", 2: "capacity"} for name in past_names},
        **{name: {0: "batch", 2: "sequence"} for name in new_names},
    }
    module = BufferDecoder(backbone, lm_head, text_config, takes_embeddings).eval()
    previous = text_config._attn_implementation
    text_config._attn_implementation = ATTENTION
    try:
        return onnx_tools.export(
            module,
            args,
            path,
            [primary_name, "position_ids", "past_sequence_length", *past_names],
            ["logits", *new_names],
            axes,
        )
    finally:
        text_config._attn_implementation = previous


def _cache_layer(cache, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    if hasattr(cache, "layers"):  # transformers >= 4.56
        return cache.layers[index].keys, cache.layers[index].values
    return cache.key_cache[index], cache.value_cache[index]


class ConcatenatingDecoder(nn.Module):
    """The decoder step as it was exported before the buffer form: past_key_values.{i}.{key,value} in,
    present.{i}.{key,value} (the past grown by the step, a copy) out."""

    def __init__(self, backbone: nn.Module, lm_head: nn.Module, text_config, takes_embeddings: bool):
        super().__init__()
        self.backbone, self.lm_head, self.text_config = backbone, lm_head, text_config
        self.takes_embeddings = takes_embeddings
        self.num_layers = text_config.num_hidden_layers

    def forward(self, primary, attention_mask, position_ids, *past):
        from transformers import DynamicCache

        cache = DynamicCache(config=self.text_config)
        for layer in range(self.num_layers):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        inputs = {"inputs_embeds": primary} if self.takes_embeddings else {"input_ids": primary}
        output = self.backbone(
            **inputs, attention_mask=attention_mask, position_ids=position_ids, past_key_values=cache, use_cache=True
        )
        present = [t for layer in range(self.num_layers) for t in _cache_layer(output.past_key_values, layer)]
        return (self.lm_head(output.last_hidden_state), *present)


def export_concatenating(backbone: nn.Module, lm_head: nn.Module, text_config, takes_embeddings: bool, path: Path) -> Path:
    """The decoder graph as it was exported before the buffer form (ConcatenatingDecoder: `attention_mask`,
    `position_ids` and past [b, kv_heads, past, head_dim] in, present [b, kv_heads, past + n, head_dim], a grown
    copy, out): the reference the buffer graph is tested and benchmarked against, never served."""
    wrapper = ConcatenatingDecoder(backbone, lm_head, text_config, takes_embeddings).eval()
    config = text_config
    layers, kv_heads = config.num_hidden_layers, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    primary_name = "inputs_embeds" if wrapper.takes_embeddings else "input_ids"
    if wrapper.takes_embeddings:
        primary = torch.randn(1, 5, config.hidden_size)
    else:
        primary = torch.randint(0, config.vocab_size, (1, 5))
    past_names = [f"past_key_values.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    present_names = [f"present.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    axes = {
        primary_name: {0: "batch", 1: "sequence"},
        "attention_mask": {0: "batch", 1: "total"},
        "position_ids": {0: "batch", 1: "sequence"},
        "logits": {0: "batch", 1: "sequence"},
        **{name: {0: "batch", 2: "past"} for name in past_names},
        **{name: {0: "batch", 2: "total"} for name in present_names},
    }
    args = (
        primary,
        torch.ones(1, 8, dtype=torch.long),
        torch.arange(3, 8).unsqueeze(0),
        *[torch.randn(1, kv_heads, 3, head_dim) for _ in past_names],
    )
    names = [primary_name, "attention_mask", "position_ids", *past_names]
    return onnx_tools.export(wrapper, args, path, names, ["logits", *present_names], axes)
