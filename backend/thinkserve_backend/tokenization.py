"""Texts -> padded id / mask / segment arrays, as the tokenizer step of every encoder ensemble produces them."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
from tokenizers import Tokenizer


def load_tokenizer(path, max_length: int) -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(path))
    # Padding and truncation baked into a tokenizer.json (MiniLM's pads to 128) are replaced by ours.
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length)
    return tokenizer


def encode(
    tokenizer: Tokenizer,
    texts: Sequence[str],
    pairs: Optional[Sequence[str]] = None,
    pad_id: int = 0,
    width: Optional[int] = None,
    buckets: Sequence[int] = (),
) -> dict[str, np.ndarray]:
    """Pad to the longest text, rounded up to the next of `buckets` if given (or to `width`): input_ids,
    attention_mask, token_type_ids, each [n, width]."""
    encodings = tokenizer.encode_batch(list(zip(texts, pairs)) if pairs is not None else list(texts))
    longest = max(len(e.ids) for e in encodings)
    if not width:
        width = bucket_width(longest, buckets, _truncation(tokenizer, longest)) if buckets else longest
    arrays = {
        "input_ids": np.full((len(encodings), width), pad_id, dtype=np.int64),
        "attention_mask": np.zeros((len(encodings), width), dtype=np.int64),
        "token_type_ids": np.zeros((len(encodings), width), dtype=np.int64),
    }
    for row, encoding in enumerate(encodings):
        n = len(encoding.ids)
        arrays["input_ids"][row, :n] = encoding.ids
        arrays["attention_mask"][row, :n] = 1
        arrays["token_type_ids"][row, :n] = encoding.type_ids
    return arrays


def _truncation(tokenizer: Tokenizer, default: int) -> int:
    truncation = tokenizer.truncation
    return truncation["max_length"] if truncation else default


def bucket_width(longest: int, buckets: Sequence[int], max_length: int) -> int:
    """The smallest bucket holding `longest` tokens (capped at max_length): a native backend (onnxruntime, TensorRT)
    batches only requests of one shape and builds an engine profile per shape range, so lengths are rounded up to
    a few fixed widths instead of varying token by token."""
    for bucket in sorted(buckets):
        if bucket >= longest:
            return min(bucket, max_length)
    return max_length
