"""The documentation (README.md and docs/): no dead relative link or image, no anchor into a missing heading, no page
over 800 lines, and the generated parts (every setting, every metric) equal to what the code declares."""

import importlib.util
import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

MAX_LINES = 800
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^)\s]*)(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(\S+)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    kept, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        opened = FENCE.match(line)
        if fence is None and opened:
            fence = opened.group(1)[0]
        elif fence is not None and opened and opened.group(1)[0] == fence:
            fence = None
        elif fence is None:
            kept.append((number, line))
    return kept


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text without markup, lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link counts by its text
    text = re.sub(r"[`*_~]|<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found, seen = set(), {}
    for _, line in prose(path.read_text(encoding="utf-8")):
        heading = HEADING.match(line)
        if heading:
            base = slug(heading.group(2))
            found.add(base if base not in seen else f"{base}-{seen[base]}")
            seen[base] = seen.get(base, 0) + 1
    return found


def dead_links(path: Path) -> list[str]:
    """'file:line: target (why)' for every relative link or image of a Markdown file that leads nowhere."""
    dead = []
    for number, line in prose(path.read_text(encoding="utf-8")):
        line = CODE_SPAN.sub("", line)
        targets = [match.group(1).strip("<>") for match in INLINE_LINK.finditer(line)]
        targets += [match.group(1) for match in [REFERENCE.match(line)] if match]
        for target in targets:
            if not target or re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # an address (https:, mailto:)
                continue
            file_part, _, anchor = target.partition("#")
            destination = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{number}: {target}"
            if not destination.exists():
                dead.append(f"{where} (no such file)")
            elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
                dead.append(f"{where} (no heading with that anchor in {destination.name})")
    return dead


def test_every_relative_link_and_image_leads_somewhere():
    dead = [entry for page in pages() for entry in dead_links(page)]
    assert not dead, "dead links:\n" + "\n".join(dead)


def test_no_page_is_over_800_lines():
    long = {str(page.relative_to(ROOT)): count for page in pages()
            if (count := len(page.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"pages over {MAX_LINES} lines (split them under docs/): {long}"


def test_the_link_check_finds_dead_links_and_anchors(tmp_path):
    (tmp_path / "other.md").write_text("# A heading\n\n## `code` and: punctuation\n\n## A heading\n")
    (tmp_path / "page.md").write_text(
        "[fine](other.md#a-heading) [fine](other.md#code-and-punctuation) [second](other.md#a-heading-1)\n"
        "[gone](missing.md) ![gone](pictures/none.png) [bad anchor](other.md#nowhere) [here](#title)\n"
        "`[in code](missing.md)` [address](https://example.com/x)\n"
        "```\n[in a block](missing.md)\n```\n"
        "[ref]: missing-too.md\n# Title\n"
    )
    found = [entry.split(": ", 1)[1] for entry in dead_links(tmp_path / "page.md")]
    assert found == ["missing.md (no such file)", "pictures/none.png (no such file)",
                     "other.md#nowhere (no heading with that anchor in other.md)", "missing-too.md (no such file)"]


def generator():
    spec = importlib.util.spec_from_file_location("docs_generate", ROOT / "docs" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("page", ["configuration.md", "operations.md"])
def test_the_generated_parts_are_what_the_code_declares(page):
    written = (ROOT / "docs" / page).read_text(encoding="utf-8")
    assert generator().regenerated(page) == written, f"docs/{page} is out of date: run `make docs` and commit it"


def test_the_settings_reference_names_every_setting():
    from orchestrator.config import Settings

    reference = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    for section, field in Settings.model_fields.items():
        assert f"`[{section}]`" in reference or f"| `{section}` |" in reference
        for key in getattr(field.annotation, "model_fields", {}):
            assert f"`{key}`" in reference or f"`[{section}.{key}]`" in reference, f"{section}.{key}"
