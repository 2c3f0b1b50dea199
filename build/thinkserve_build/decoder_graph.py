"""The LLM/VLM decoder's ONNX graph: the checkpoint's own layers, with attention as onnxruntime's
com.microsoft GroupQueryAttention reading and writing a KV buffer that the caller allocates.

Inputs: `input_ids` [b, n] (or `inputs_embeds` [b, n, d]), `position_ids` [b, n], `seqlens_k` [b] (int32: the
tokens in the cache after this step, minus one), `total_sequence_length` (int32 scalar) and, per layer,
`past_key_values.{i}.{key,value}` [b, kv_heads, capacity, head_dim]. Outputs: `logits` [b, n, vocab] and
`present.{i}.{key,value}`, the same buffers with this step's keys and values written at positions
[total - n, total). Bound to the very OrtValues given as the past (thinkserve_backend.decoding), they are
written in place: a step costs O(cache) only in attention's reads, never in a copy of the cache. Given a
zero-length past, onnxruntime allocates a present of length n (the batched prefill).

Attention is causal over the first `total` positions and nothing else: the loop never pads a sequence.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

from . import onnx_tools

ATTENTION = "thinkserve_group_query_attention"  # the attention implementation set on the model while exporting


@torch.library.custom_op("thinkserve::group_query_attention", mutates_args=())
def group_query_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    past_key: torch.Tensor,
    past_value: torch.Tensor,
    seqlens_k: torch.Tensor,
    total_sequence_length: torch.Tensor,
    num_heads: int,
    kv_num_heads: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What GroupQueryAttention computes for one unpadded batch; traced once, exported as the onnxruntime op.

    query [b, n, heads * head_dim], key and value [b, n, kv_heads * head_dim], past [b, kv_heads, capacity, head_dim]
    -> output [b, n, heads * head_dim] and the past with the new keys and values written in."""
    batch, length, _ = query.shape
    head_dim = past_key.shape[-1]
    total = int(total_sequence_length)
    start = total - length
    presents = []
    for past, new in ((past_key, key), (past_value, value)):
        present = past.new_zeros(batch, kv_num_heads, max(past.shape[2], total), head_dim)
        present[:, :, :start] = past[:, :, :start]
        present[:, :, start:total] = new.view(batch, length, kv_num_heads, head_dim).transpose(1, 2)
        presents.append(present)
    groups = num_heads // kv_num_heads
    keys = presents[0][:, :, :total].repeat_interleave(groups, dim=1)
    values = presents[1][:, :, :total].repeat_interleave(groups, dim=1)
    q = query.view(batch, length, num_heads, head_dim).transpose(1, 2)
    scores = (q @ keys.transpose(-1, -2)) * scale
    causal = torch.ones(length, total, dtype=torch.bool).tril(start)
    probabilities = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
    output = (probabilities @ values).transpose(1, 2).reshape(batch, length, num_heads * head_dim)
    return output, presents[0], presents[1]


def _group_query_attention_symbolic(g, query, key, value, past_key, past_value, seqlens_k, total, heads, kv_heads, scale):
    from torch.onnx import symbolic_helper

    outputs = g.op(
        "com.microsoft::GroupQueryAttention",
        query, key, value, past_key, past_value, seqlens_k, total,
        num_heads_i=symbolic_helper._maybe_get_const(heads, "i"),
        kv_num_heads_i=symbolic_helper._maybe_get_const(kv_heads, "i"),
        scale_f=symbolic_helper._maybe_get_const(scale, "f"),
        outputs=3,
    )
    # The output is shaped like the query, each present like its past (the exporter cannot infer a custom op's).
    for output, like in zip(outputs, (query, past_key, past_value)):
        output.setType(like.type())
    return outputs


torch.onnx.register_custom_op_symbolic("thinkserve::group_query_attention", _group_query_attention_symbolic, 1)


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, thinkserve_kv=None, **kwargs):
    """transformers' attention interface: query [b, heads, n, d] and this step's key and value [b, kv_heads, n, d]
    (rotary applied; no cache was passed, so nothing was concatenated) -> output [b, n, heads, d]."""
    if kwargs.get("sliding_window") or kwargs.get("softcap"):
        raise ValueError("sliding-window and soft-capped attention are not exported to GroupQueryAttention")
    batch, heads, length, head_dim = query.shape
    kv_heads = key.shape[1]
    layer = module.layer_idx
    output, present_key, present_value = group_query_attention(
        query.transpose(1, 2).reshape(batch, length, heads * head_dim),
        key.transpose(1, 2).reshape(batch, length, kv_heads * head_dim),
        value.transpose(1, 2).reshape(batch, length, kv_heads * head_dim),
        thinkserve_kv["past"][2 * layer],
        thinkserve_kv["past"][2 * layer + 1],
        thinkserve_kv["seqlens_k"],
        thinkserve_kv["total_sequence_length"],
        heads,
        kv_heads,
        float(scaling if scaling is not None else head_dim**-0.5),
    )
    thinkserve_kv["present"][layer] = (present_key, present_value)
    return output.view(batch, length, heads, head_dim), None


class SharedBufferDecoder(nn.Module):
    """A decoder backbone + LM head with the graph inputs and outputs above."""

    def __init__(self, backbone: nn.Module, lm_head: nn.Module, text_config, takes_embeddings: bool):
        super().__init__()
        self.backbone, self.lm_head, self.text_config = backbone, lm_head, text_config
        self.takes_embeddings = takes_embeddings
        self.num_layers = text_config.num_hidden_layers

    def forward(self, primary, position_ids, seqlens_k, total_sequence_length, *past):
        state = {"past": past, "seqlens_k": seqlens_k, "total_sequence_length": total_sequence_length, "present": {}}
        inputs = {"inputs_embeds": primary} if self.takes_embeddings else {"input_ids": primary}
        # No cache object and no mask: the attention above keeps the cache and is causal by itself.
        output = self.backbone(**inputs, position_ids=position_ids, use_cache=False, thinkserve_kv=state)
        present = [t for layer in range(self.num_layers) for t in state["present"][layer]]
        return (self.lm_head(output.last_hidden_state), *present)


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
    present_names = [f"present.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    total = past_length + length
    args = (
        primary,
        torch.arange(past_length, total).unsqueeze(0),
        torch.tensor([total - 1], dtype=torch.int32),
        torch.tensor(total, dtype=torch.int32),
        *[torch.randn(1, kv_heads, capacity, head_dim) for _ in past_names],
    )
    axes = {
        primary_name: {0: "batch", 1: "sequence"},
        "position_ids": {0: "batch", 1: "sequence"},
        "seqlens_k": {0: "batch"},
        "logits": {0: "batch", 1: "sequence"},
        **{name: {0: "batch", 2: "capacity"} for name in past_names + present_names},
    }
    module = SharedBufferDecoder(backbone, lm_head, text_config, takes_embeddings).eval()
    previous = text_config._attn_implementation
    text_config._attn_implementation = ATTENTION
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module,
                args,
                str(path),
                input_names=[primary_name, "position_ids", "seqlens_k", "total_sequence_length", *past_names],
                output_names=["logits", *present_names],
                dynamic_axes=axes,
                opset_version=onnx_tools.OPSET,
                custom_opsets={"com.microsoft": 1},
                do_constant_folding=True,
                dynamo=False,
            )
    finally:
        text_config._attn_implementation = previous
    return path
