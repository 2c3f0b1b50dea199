"""Prompts for the answering LLM (ChatML: both profiles serve Qwen2-family models) and citation parsing."""

from __future__ import annotations

import re

from .events import EvidenceItem

ANSWER_STOP = ("<|im_end|>",)
SYSTEM = (
    "You answer questions about documents using only the numbered evidence passages. "
    "Cite the passages you use as [1], [2]. If the evidence does not contain the answer, say so."
)
# Conservative characters-per-token for English text, used to keep the prompt inside the model's context
# before the orchestrator has the tokenizer's count; the LLM rejects a prompt that still does not fit.
CHARS_PER_TOKEN = 3.0
_CITATION = re.compile(r"\[(\d{1,3})\]")


def chat(system: str, user: str) -> str:
    return f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def answer_prompt(question: str, evidence: list[EvidenceItem], budget_tokens: int) -> tuple[str, list[EvidenceItem]]:
    """The prompt and the evidence that fitted in it (best first; later passages dropped, not truncated)."""
    budget_chars = int(budget_tokens * CHARS_PER_TOKEN) - len(SYSTEM) - len(question) - 64
    used, blocks = [], []
    for item in evidence:
        source = item.record.document_name + (f", {item.record.section}" if item.record.section else "")
        block = f"[{item.rank}] ({source})\n{item.record.text}"
        if used and sum(map(len, blocks)) + len(block) > budget_chars:
            break
        used.append(item)
        blocks.append(block[: max(budget_chars, 0)])
    user = "Evidence:\n" + "\n\n".join(blocks) + f"\n\nQuestion: {question}"
    return chat(SYSTEM, user), used


def cited_ranks(answer: str, evidence_ranks: set[int]) -> list[int]:
    """Evidence ranks the answer cites, in order of first mention, ignoring numbers that match no evidence."""
    seen: list[int] = []
    for match in _CITATION.finditer(answer):
        rank = int(match.group(1))
        if rank in evidence_ranks and rank not in seen:
            seen.append(rank)
    return seen
