"""The prompt format the served generators (LLM, VLM) read: ChatML, as both profiles serve Qwen2-family models.

Below the pipeline and the knowledge base, which both build prompts with it (answers; descriptions and extraction
at ingest)."""

from __future__ import annotations

from typing import Sequence


def chat(system: str, user: str, turns: Sequence[tuple[str, str]] = ()) -> str:
    history = "".join(f"<|im_start|>{role}\n{text}<|im_end|>\n" for role, text in turns)
    return f"<|im_start|>system\n{system}<|im_end|>\n{history}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
