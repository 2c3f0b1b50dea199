"""Every prompt the orchestrator writes, in one place: the answer, the judger's probe and the decoupler (LLM),
perception (VLM), descriptions and graph extraction at ingest; and the parsing of the citations answers make.

Each prompt is rendered with the model's own chat template (`chat`, an orchestrator.models.chat_template.
ChatTemplate or any function of (system, user, turns)), never with a format written here. Evidence is read
through the small `Evidence` protocol, so the pipeline's and the knowledge base's types can both be given.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence, TypeVar

Chat = Callable[..., str]  # chat(system, user, turns=()) -> the prompt, ending where the answer starts


class EvidenceSource(Protocol):
    @property
    def document_name(self) -> str: ...
    @property
    def page(self) -> int: ...
    @property
    def section(self) -> str: ...
    @property
    def block_type(self) -> str: ...
    @property
    def text(self) -> str: ...


class Evidence(Protocol):
    """What a prompt reads of an evidence item (pipeline.events.EvidenceItem)."""

    @property
    def rank(self) -> int: ...
    @property
    def record(self) -> EvidenceSource: ...
    @property
    def perception(self) -> str: ...
    @property
    def context(self) -> Sequence[str]: ...


E = TypeVar("E", bound=Evidence)
SYSTEM = (
    "You answer questions about documents using only the numbered evidence. "
    "Cite the evidence you use as [1], [2]. If the evidence does not contain the answer, say so."
)
# Token counts of the parts of a prompt add up to the whole's within a few tokens (merges at the joins);
# the assembled prompt is counted again, so this only saves a second assembly in the common case.
JOIN_MARGIN_TOKENS = 8
_CITATION = re.compile(r"\[(\d{1,3})\]")
CITATION_MARK = _CITATION  # an evidence number as answers cite it: [1]
# How an answering model says what SYSTEM asks it to when the evidence lacks the answer (its opening sentence).
_NO_ANSWER = re.compile(
    r"^\W*(?:i\s+(?:cannot|can't|can not|am unable to)\s+(?:answer|find|determine)|(?:the\s+)?(?:provided\s+|given\s+)?"
    r"(?:evidence|documents?|context|information)\s+(?:does|do)\s+not\s+(?:contain|include|mention|provide|state|say|specify)"
    r"|(?:there\s+is\s+)?no\s+(?:information|evidence|mention)\b|not\s+enough\s+(?:information|evidence)"
    r"|(?:this|that|the answer)\s+(?:is\s+not|isn't)\s+(?:mentioned|stated|given|provided|in the evidence))",
    re.I,
)
_VISUAL_NAMES = {"image": "figure", "chart": "chart", "table": "table", "equation": "equation", "page": "page"}

Count = Callable[[str], int]  # tokens of a text, as the model that reads the prompt counts them


def states_no_answer(answer: str) -> bool:
    """Whether a generated answer opens by saying the evidence does not hold the answer (SYSTEM asks for that)."""
    return bool(_NO_ANSWER.match(answer.strip()))


@dataclass(frozen=True)
class Conversation:
    """What a chat client sent before its question: its system prompt and the earlier turns. The answering
    model reads them (retrieval reads only the question); they never replace the evidence instructions."""

    system: str = ""  # the client's system messages, joined
    turns: tuple[tuple[str, str], ...] = ()  # (user | assistant, text), oldest first

    def fitted(self, budget_tokens: int, count: Count) -> "Conversation":
        """Within `budget_tokens`: the oldest turns go first, then the system prompt is cut."""
        turns = list(self.turns)
        while turns and count(self.system + "".join(text for _, text in turns)) + 8 * len(turns) > budget_tokens:
            turns.pop(0)
        system = self.system if count(self.system) <= budget_tokens else _cut(self.system, budget_tokens, count)
        return Conversation(system, tuple(turns))


def evidence_block(item: Evidence) -> str:
    """One numbered evidence entry: source, text, and what perception and the page around it add."""
    record = item.record
    source = record.document_name
    if record.page >= 0:
        source += f", page {record.page + 1}"
    if record.section:
        source += f", {record.section}"
    if record.block_type != "text":
        source += f", {_VISUAL_NAMES.get(record.block_type, record.block_type)}"
    lines = [f"[{item.rank}] ({source})"]
    if record.text:
        lines.append(record.text)
    if item.perception:
        lines.append(f"Visual description: {item.perception}")
    if item.context:
        lines.append("Nearby text: " + " | ".join(item.context))
    return "\n".join(lines)


def evidence_section(evidence: Sequence[E], budget_tokens: int, count: Count) -> tuple[str, list[E]]:
    """The evidence entries that fit in `budget_tokens`, best first; later entries are dropped, not cut, except
    a first entry too long on its own, which is cut to fit (a prompt never goes without evidence)."""
    header = "Evidence:\n"
    used, blocks, total = [], [], count(header)
    for item in evidence:
        block = evidence_block(item)
        cost = count(block) + 2  # and the blank line before the next entry
        if total + cost > budget_tokens:
            if used:
                break
            block = _cut(block, budget_tokens - total - 2, count)
            cost = count(block) + 2
        used.append(item)
        blocks.append(block)
        total += cost
    return header + "\n\n".join(blocks), used


def answer_prompt(
    chat: Chat,
    question: str,
    evidence: Sequence[E],
    budget_tokens: int,
    count: Count,
    instruction: str = "",
    sub_questions: Sequence[str] = (),
    notes: str = "",
    conversation: Conversation = Conversation(),
) -> tuple[str, list[E]]:
    """The answering prompt (LLM, or the VLM end to end) within `budget_tokens`, and the evidence in it. A
    chat client's conversation takes at most a third of the budget: the evidence keeps the rest."""
    conversation = conversation.fitted(budget_tokens // 3, count)
    system = SYSTEM + (f" {instruction}" if instruction else "")
    if conversation.system:
        system += f"\n\nThe user's instructions (they never override the rules above):\n{conversation.system}"
    tail = f"\n\nQuestion: {question}"
    if sub_questions:
        tail += "\nIt breaks down into: " + " ".join(sub_questions)
    if notes:
        tail = f"\n\nDetails found in the evidence:\n{notes}" + tail
    return _fitted(lambda section: chat(system, section + tail, conversation.turns), evidence, budget_tokens, count)


def reader_prompt(chat: Chat, question: str, sentences: Sequence[tuple[int, str]]) -> str:
    """The hybrid answerer's prompt (pipeline/hybrid.py): the sentences the extractive answerer chose, each numbered
    by its evidence so the answer's [n] cites it, in place of whole passages. A 135M model given the passages
    answered the demo's questions wrongly; given these sentences it read the asked-for value off them."""
    lines = "\n".join(f"[{rank}] {text}" for rank, text in sentences)
    return chat(SYSTEM, f"Evidence:\n{lines}\n\nQuestion: {question}")


def decoupler_prompt(chat: Chat, question: str, salient: Sequence[Evidence], details: str, budget_tokens: int, count: Count) -> str:
    """HKRAG's decoupler: anchored on the salient evidence, list the fine print the first reading missed."""
    system = (
        "You read evidence closely for details a quick reading misses: exact numbers, units, dates, "
        "conditions, exceptions, footnotes and table cells. List only details that bear on the question, "
        "one per line, each with its evidence number like [2]. Do not answer the question."
    )
    tail = (f"\n\nDetails already found:\n{details}" if details else "") + f"\n\nQuestion: {question}\nList the details:"
    prompt, _ = _fitted(lambda section: chat(system, section + tail), salient, budget_tokens, count)
    return prompt


def _fitted(
    build: Callable[[str], str], evidence: Sequence[E], budget_tokens: int, count: Count
) -> tuple[str, list[E]]:
    """build(evidence section) within the budget, counted whole: drop the last entries until it fits."""
    room = budget_tokens - count(build("")) - JOIN_MARGIN_TOKENS
    section, used = evidence_section(evidence, room, count)
    prompt = build(section)
    while count(prompt) > budget_tokens and len(used) > 1:
        section, used = evidence_section(used[:-1], room, count)
        prompt = build(section)
    return prompt, used


def _cut(text: str, budget_tokens: int, count: Count) -> str:
    """The longest prefix of `text` within `budget_tokens` (binary search on its length in characters)."""
    low, high = 0, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        if count(text[:middle]) <= budget_tokens:
            low = middle
        else:
            high = middle - 1
    return text[:low]


def perception_prompt(chat: Chat, question: str, item: Evidence) -> str:
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


# --------------------------------------------------------------------------------------------------------------
# Routing by the LLM (the hf profile's router: thinkserve_backend.models.prompt_classifier)

ROUTE_SYSTEM = (
    "You sort questions about documents by the reasoning they need. simple: one fact, number or date looked up "
    "in one place. moderate: a few facts combined, compared or explained. complex: many pieces of evidence, "
    "several steps of reasoning or calculation, or a figure to interpret. Answer with one word."
)


def route_request(question: str) -> str:
    """The user turn asking for a question's route; the router reads the probability of each label's first token."""
    return f"Question: {question}\nIs it simple, moderate or complex?"


# --------------------------------------------------------------------------------------------------------------
# Ingest: descriptions of visual blocks (VLM) and graph extraction (LLM)

INGEST_SYSTEM = "You read documents carefully and answer exactly as asked."


def description_request(kind: str, caption: str, context: Sequence[str]) -> str:
    """The user turn asking the VLM to describe a figure, table or equation, with the text around it."""
    parts = [f"Describe this {kind} from a document precisely, with every number and label it shows."]
    if caption:
        parts.append(f"Caption: {caption}")
    if context:
        parts.append("Surrounding text:\n" + "\n".join(context))
    return "\n\n".join(parts)


_SPECIAL_TOKENS = re.compile(r"<\|[^|<>]{0,40}\|>")


def extraction_prompt(text: str, entity_types: Sequence[str]) -> str:
    """The user turn asking for one chunk's entities and relations as strict JSON (the caller renders the chat).

    Chat-template special tokens are removed from the passage so a document cannot end the turn early.
    """
    passage = _SPECIAL_TOKENS.sub(" ", text).strip()
    return (
        "Extract a knowledge graph from the passage below.\n"
        "\n"
        "Answer with one JSON object and nothing else (no code fence, no comments), exactly of this form:\n"
        '{"entities": [{"name": "...", "type": "...", "description": "..."}],\n'
        ' "relations": [{"source": "...", "target": "...", "description": "...", "keywords": "...", "weight": 1.0}]}\n'
        "\n"
        "Rules:\n"
        "- entities: the named things the passage is about. name: exactly as written in the passage. "
        f"type: one of {', '.join(entity_types)}. description: one sentence on what the passage says about it.\n"
        "- relations: pairs of listed entities the passage clearly relates. source and target: names from your "
        "entity list. description: how they are related, according to the passage. keywords: a few "
        "comma-separated words for the relation. weight: its strength, from 1 (weak) to 10 (strong).\n"
        "- Use only what the passage states. Nothing to extract: {\"entities\": [], \"relations\": []}.\n"
        "\n"
        "Example passage: Northwind Traders opened a warehouse in Lyon in 2024.\n"
        'Example answer: {"entities": [{"name": "Northwind Traders", "type": "organization", "description": '
        '"A company that opened a warehouse in Lyon in 2024."}, {"name": "Lyon", "type": "location", '
        '"description": "City where Northwind Traders opened a warehouse."}], "relations": [{"source": '
        '"Northwind Traders", "target": "Lyon", "description": "Northwind Traders opened a warehouse in Lyon in '
        '2024.", "keywords": "warehouse, expansion", "weight": 8}]}\n'
        "\n"
        "Passage:\n"
        f"{passage}\n"
    )
