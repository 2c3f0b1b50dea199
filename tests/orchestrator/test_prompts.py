from orchestrator.knowledge.storage.segments import EvidenceRecord
from orchestrator.pipeline.events import EvidenceItem
from orchestrator.prompts import Conversation, answer_prompt, cited_ranks, decoupler_prompt
from tests.model_double import CHATML


def evidence(n, chars):
    return [
        EvidenceItem(rank, 1.0 / rank, EvidenceRecord(f"d:c{rank}", "d", "doc.md", "chunk", "text", "x" * chars, "Sec", ()))
        for rank in range(1, n + 1)
    ]


def four_chars(text: str) -> int:
    """A token counter for the arithmetic: one token per four characters, rounded up."""
    return -(-len(text) // 4)


def test_prompt_is_chatml_with_numbered_evidence():
    prompt, used = answer_prompt(CHATML, "What?", evidence(2, 10), 500, four_chars)
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    assert "[1] (doc.md, Sec)\nxxxxxxxxxx" in prompt and "Question: What?" in prompt
    assert [item.rank for item in used] == [1, 2]


def test_evidence_that_does_not_fit_the_budget_is_dropped_best_first_kept():
    prompt, used = answer_prompt(CHATML, "What?", evidence(5, 400), 400, four_chars)
    assert [item.rank for item in used] == [1, 2, 3] and four_chars(prompt) <= 400
    assert "[4]" not in prompt  # dropped whole, never cut
    decoupler = decoupler_prompt(CHATML, "What?", evidence(5, 400), "", 400, four_chars)
    assert four_chars(decoupler) <= 400 and "[2]" in decoupler and "[3]" not in decoupler  # its system prompt is longer


def test_a_first_entry_too_long_alone_is_cut_to_fit():
    prompt, used = answer_prompt(CHATML, "What?", evidence(2, 8000), 300, four_chars)
    assert [item.rank for item in used] == [1] and 290 <= four_chars(prompt) <= 300
    assert prompt.endswith("Question: What?<|im_end|>\n<|im_start|>assistant\n")


def test_citations_keep_first_mention_order_and_ignore_unknown_ranks():
    assert cited_ranks("See [2] and [1], again [2]; not [9].", {1, 2, 3}) == [2, 1]


def test_a_chat_clients_conversation_reaches_the_prompt_in_order_and_keeps_the_evidence_rules():
    conversation = Conversation("Answer in French.", (("user", "Who makes the X1?"), ("assistant", "Acme [1].")))
    prompt, used = answer_prompt(CHATML, "And its price?", evidence(2, 10), 500, four_chars, conversation=conversation)
    system, rest = prompt.split("<|im_end|>\n", 1)
    assert system.startswith("<|im_start|>system\nYou answer questions about documents") and system.endswith("Answer in French.")
    assert rest.startswith("<|im_start|>user\nWho makes the X1?<|im_end|>\n<|im_start|>assistant\nAcme [1].<|im_end|>\n"
                           "<|im_start|>user\nEvidence:")
    assert prompt.endswith("Question: And its price?<|im_end|>\n<|im_start|>assistant\n") and len(used) == 2


def test_a_long_conversation_loses_its_oldest_turns_first_and_never_the_evidence():
    turns = tuple((("user", "q" * 400), ("assistant", "a" * 400)) * 5)
    prompt, used = answer_prompt(CHATML, "What?", evidence(2, 40), 600, four_chars, conversation=Conversation("", turns))
    assert four_chars(prompt) <= 600 and [item.rank for item in used] == [1, 2]
    kept = prompt.count("q" * 400) + prompt.count("a" * 400)
    assert 0 < kept < len(turns)  # a third of the budget: the newest turns that fit
    assert prompt.index("a" * 400) < prompt.index("Evidence:")  # history comes before the question's turn
