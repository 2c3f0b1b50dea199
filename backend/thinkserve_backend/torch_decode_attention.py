"""The batched decoder's attention for a decode step: grouped query heads folded onto their shared key/value head.

Why: with an attention mask (the batched decoder always hands one: rows at different positions) transformers' sdpa
path cannot use sdpa's own grouped-query support and copies every key/value head once per query head (`repeat_kv`)
before attending. For the 1.5B LLM (12 query heads on 2 key/value heads, 28 layers) at 32 rows over 2,048 positions
that copy writes about 11 GB a step, against 1.9 GB for reading the cache itself. On the H200
(benchmarks/results/gpu/h200-2026-11-30) its graphed step grew from 3.9 ms at one row to 17.9 ms at 32, while the
VLM's text model (no grouped heads: nothing copied) read 3.4x more cache a step in 4.2 ms.

A decode step has one query position, so the query heads that share a key/value head can stand in for query
positions: queries [rows, heads, 1, d] are viewed as [rows, kv_heads, groups, d] and attend over the cache's
[rows, kv_heads, length, d] as they are, the row's mask [rows, 1, 1, length] broadcast over the groups. The result
is the same attention (each query head meets its own key/value head, under its row's mask), with no copy. Every
other call (a prefill, a model without grouped heads, no mask) goes to transformers' sdpa path unchanged.

transformers 5.23 does the same in its own sdpa path (`pack_gqa`, for one query position); 5.17, the GPU machine's,
does not. Where the installed transformers has it, its path serves and this one stays out (the model's log says
so); this module can go once every machine's transformers has it.
"""

from __future__ import annotations

from torch.nn.functional import scaled_dot_product_attention

NAME = "thinkserve_grouped_decode"  # the attention implementation's name in transformers' AttentionInterface


def grouped_decode_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """transformers' attention interface: (attention output [rows, positions, heads, d], no weights)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    rows, heads, positions, head_dim = query.shape
    kv_heads = key.shape[1]
    if positions != 1 or kv_heads == heads or attention_mask is None or attention_mask.shape[1] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    folded = query.reshape(rows, kv_heads, heads // kv_heads, head_dim)
    output = scaled_dot_product_attention(folded, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling)
    return output.reshape(rows, heads, 1, head_dim).transpose(1, 2).contiguous(), None


def transformers_folds_grouped_heads() -> bool:
    """Whether the installed transformers' sdpa path folds grouped query heads itself in a decode step."""
    from transformers.integrations import sdpa_attention

    return hasattr(sdpa_attention, "pack_gqa")


def use_grouped_decode_attention(text_config) -> str:
    """Serve the model of `text_config` with grouped_decode_attention where it runs transformers' sdpa path (the
    default) and that path copies grouped heads; returns "" when it does, else why not (for the model's log)."""
    current = getattr(text_config, "_attn_implementation", None)
    if current == NAME:
        return ""
    if current != "sdpa":
        return f"the model's attention is {current!r}, not sdpa"
    if text_config.num_attention_heads == (getattr(text_config, "num_key_value_heads", None) or text_config.num_attention_heads):
        return "the model has no grouped key/value heads"
    if transformers_folds_grouped_heads():
        return "transformers' sdpa path folds grouped query heads itself"
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, grouped_decode_attention)
    # the masks transformers builds for it (a cache without a mask handed, e.g. the one-at-a-time decoder's static
    # cache) are sdpa's: an attention name without a mask function gets no mask at all, and would attend to every
    # position of a preallocated cache
    AttentionMaskInterface.register(NAME, sdpa_mask)
    text_config._attn_implementation = NAME
    return ""


def use_sdpa_attention(text_config) -> None:
    """Back to transformers' sdpa path (the grouped decode attention failed the batch decoder's check at load)."""
    text_config._attn_implementation = "sdpa"
