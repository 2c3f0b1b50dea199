from orchestrator.knowledge.segments import EvidenceRecord
from orchestrator.pipeline.events import EvidenceItem
from orchestrator.pipeline.prompts import CHARS_PER_TOKEN, answer_prompt, cited_ranks


def evidence(n, chars):
    return [
        EvidenceItem(rank, 1.0 / rank, EvidenceRecord(f"d:c{rank}", "d", "doc.md", "chunk", "text", "x" * chars, "Sec", ()))
        for rank in range(1, n + 1)
    ]


def test_prompt_is_chatml_with_numbered_evidence():
    prompt, used = answer_prompt("What?", evidence(2, 10), budget_tokens=500)
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    assert "[1] (doc.md, Sec)\nxxxxxxxxxx" in prompt and "Question: What?" in prompt
    assert [item.rank for item in used] == [1, 2]


def test_evidence_that_does_not_fit_the_context_is_dropped_best_first_kept():
    budget_tokens = 400
    _, used = answer_prompt("What?", evidence(5, 400), budget_tokens)
    assert [item.rank for item in used] == [1, 2]
    assert sum(len(item.record.text) for item in used) <= budget_tokens * CHARS_PER_TOKEN


def test_citations_keep_first_mention_order_and_ignore_unknown_ranks():
    assert cited_ranks("See [2] and [1], again [2]; not [9].", {1, 2, 3}) == [2, 1]
