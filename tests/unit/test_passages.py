from orchestrator.knowledge.passages import split_passages

DOCUMENT = """# Report

Intro paragraph.

## Results

Revenue grew. Profit grew too.

Second results paragraph.

## Risks

Risk one.
"""


def test_passages_follow_headings_and_carry_their_section_path():
    passages = split_passages(DOCUMENT, target_chars=200)
    assert [(p.section, p.text) for p in passages] == [
        ("Report", "Intro paragraph."),
        ("Report > Results", "Revenue grew. Profit grew too.\n\nSecond results paragraph."),
        ("Report > Risks", "Risk one."),
    ]
    assert [p.ordinal for p in passages] == [0, 1, 2]


def test_paragraphs_are_grouped_up_to_the_target_and_long_ones_cut_at_sentences():
    text = "\n\n".join(["Short one."] * 3 + ["A long sentence here. " * 20])
    passages = split_passages(text, target_chars=120)
    assert passages[0].text == "Short one.\n\nShort one.\n\nShort one."
    assert all(len(p.text) <= 120 for p in passages)
    assert "".join(p.text for p in passages[1:]).replace(" ", "") == ("A long sentence here." * 20).replace(" ", "")


def test_empty_text_gives_no_passages():
    assert split_passages("\n\n  \n", 100) == []
