"""Prompts for the answering LLM, the perceiving VLM and the decoupler (ChatML: both profiles serve
Qwen2-family models), and citation parsing."""

from __future__ import annotations

import re
from typing import Sequence

from .events import EvidenceItem

ANSWER_STOP = ("<|im_end|>",)
SYSTEM = (
    "You answer questions about documents using only the numbered evidence. "
    "Cite the evidence you use as [1], [2]. If the evidence does not contain the answer, say so."
)
# Conservative characters-per-token for English text, used to keep the prompt inside the model's context
# before the orchestrator has the tokenizer's count; the LLM rejects a prompt that still does not fit.
CHARS_PER_TOKEN = 3.0
_CITATION = re.compile(r"\[(\d{1,3})\]")
_VISUAL_NAMES = {"image": "figure", "chart": "chart", "table": "table", "equation": "equation", "page": "page"}


def chat(system: str, user: str) -> str:
    return f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def evidence_block(item: EvidenceItem) -> str:
    """One numbered evidence entry: source, text, and what perception and the page around it add."""
    record = item.record
    source = record.document_name
    if record.page >= 0:
        source += f", page {record.page + 1}"
    if record.section:
        source += f", {record.section}"
    if record.kind != "chunk":
        source += f", {_VISUAL_NAMES.get(record.block_type, record.block_type)}"
    lines = [f"[{item.rank}] ({source})"]
    if record.text:
        lines.append(record.text)
    if item.perception:
        lines.append(f"Visual description: {item.perception}")
    if item.context:
        lines.append("Nearby text: " + " | ".join(item.context))
    return "\n".join(lines)


def evidence_section(evidence: Sequence[EvidenceItem], budget_chars: int) -> tuple[str, list[EvidenceItem]]:
    """The evidence entries that fit in `budget_chars` (best first; later entries dropped, not truncated)."""
    used, blocks = [], []
    for item in evidence:
        block = evidence_block(item)
        if used and sum(map(len, blocks)) + len(block) > budget_chars:
            break
        used.append(item)
        blocks.append(block[: max(budget_chars, 0)])
    return "Evidence:\n" + "\n\n".join(blocks), used


def answer_prompt(
    question: str,
    evidence: Sequence[EvidenceItem],
    budget_tokens: int,
    instruction: str = "",
    sub_questions: Sequence[str] = (),
    notes: str = "",
) -> tuple[str, list[EvidenceItem]]:
    """The answering prompt (LLM, or the VLM end to end) and the evidence that fitted in it."""
    system = SYSTEM + (f" {instruction}" if instruction else "")
    tail = f"\n\nQuestion: {question}"
    if sub_questions:
        tail += "\nIt breaks down into: " + " ".join(sub_questions)
    if notes:
        tail = f"\n\nDetails found in the evidence:\n{notes}" + tail
    section, used = evidence_section(evidence, _chars(budget_tokens) - len(system) - len(tail) - 64)
    return chat(system, section + tail), used


def decoupler_prompt(question: str, salient: Sequence[EvidenceItem], details: str, budget_tokens: int) -> str:
    """HKRAG's decoupler: anchored on the salient evidence, list the fine print the first reading missed."""
    system = (
        "You read evidence closely for details a quick reading misses: exact numbers, units, dates, "
        "conditions, exceptions, footnotes and table cells. List only details that bear on the question, "
        "one per line, each with its evidence number like [2]. Do not answer the question."
    )
    tail = (f"\n\nDetails already found:\n{details}" if details else "") + f"\n\nQuestion: {question}\nList the details:"
    section, _ = evidence_section(salient, _chars(budget_tokens) - len(system) - len(tail) - 64)
    return chat(system, section + tail)


def _chars(tokens: int) -> int:
    return int(tokens * CHARS_PER_TOKEN)


def perception_prompt(question: str, item: EvidenceItem) -> str:
    """DPR: the VLM describes what it sees as structured text, with the page's words as context."""
    record = item.record
    kind = _VISUAL_NAMES.get(record.block_type, "image")
    lines = [f"This {kind} comes from the document {record.document_name!r}" + (f", page {record.page + 1}." if record.page >= 0 else ".")]
    if record.text:
        lines.append(f"What the document says about it: {record.text[:800]}")
    if item.context:
        lines.append("Text next to it: " + " | ".join(item.context)[:800])
    lines.append(
        f"Describe the {kind} as structured text: its title, its axes, columns or labels, every value you can read, "
        f"and what it shows. Someone will use your description to answer: {question}"
    )
    return chat("You describe images, tables and pages accurately and completely.", "\n".join(lines))


def cited_ranks(answer: str, evidence_ranks: set[int]) -> list[int]:
    """Evidence ranks the answer cites, in order of first mention, ignoring numbers that match no evidence."""
    seen: list[int] = []
    for match in _CITATION.finditer(answer):
        rank = int(match.group(1))
        if rank in evidence_ranks and rank not in seen:
            seen.append(rank)
    return seen
