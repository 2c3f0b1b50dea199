"""Workloads: a deterministic question mix over any collection, and a JSONL format to replay a team's own questions.

The generator needs no access to the server's files: it reads the collection through the public API
(ListDocuments, then probe queries whose evidence items carry each passage's text, page, block type and
section), so it works against any deployment. Passages are sorted by what they say and where (document name,
page, type, section, text) before the seeded draw, never by id: ids hash the document's bytes, and a PDF
regenerated with a new timestamp has new ids. So the same content and seed give the same questions. Question types:

  lookup        one passage's specific content words ("What does report X say about A B C?")
  comparison    two passages on different pages ("Compare A with B.")
  calculation   a table's (or a numeric passage's) figures ("What is the total of ... in the table ...?")
  multi_hop     two passages linked by a shared proper name, asked in one question
  visual        an image or chart unit, by its caption ("What does the chart of ... show?")
  unanswerable  invented names no passage contains: the right answer is a refusal

A type the collection cannot supply (no tables, no figures) is replaced by lookups, and the mix says so.

Replay format, one JSON object per line (only `question` is required):
  {"id": "q1", "question": "...", "collection": "reports", "type": "lookup", "route": "complex",
   "options": {"rerank": false}, "expected_pages": [{"document": "report.pdf", "page": 3}], "answerable": true}
`options` are QueryOptions fields of the proto; an expected page of -1 means "this document, no pages".
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from orchestrator.errors import ConfigurationError

QUESTION_TYPES: tuple[str, ...] = ("lookup", "comparison", "calculation", "multi_hop", "visual", "unanswerable")
DEFAULT_MIX: dict[str, float] = {
    "lookup": 0.30, "comparison": 0.15, "calculation": 0.15, "multi_hop": 0.15, "visual": 0.10, "unanswerable": 0.15,
}
ROUTES = ("simple", "moderate", "complex")
STOP_WORDS = frozenset(
    """a about above after again all also an and any are as at be because been before being below between both but by
    can could did do does doing down during each few for from further had has have having he her here hers him his how
    i if in into is it its itself just more most my no nor not now of off on once only or other our out over own same
    she should so some such than that the their them then there these they this those through to too under until up
    very was we were what when where which while who whom why will with would you your per into since within without
    year years new one two three first second last""".split()
)


def _query_option_fields() -> frozenset[str]:
    from orchestrator.api.protos import pb

    return frozenset(field.name for field in pb.QueryOptions.DESCRIPTOR.fields)


class ExpectedPage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    document: str
    page: int = Field(ge=-1)  # -1: the document has no pages (Markdown, text)


class WorkloadQuestion(BaseModel):
    """One question of a workload, as replayed from JSONL or generated."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    question: str = Field(min_length=1)
    id: str = ""
    collection: str = ""  # empty: the collection the command names
    type: str = "custom"
    route: Optional[str] = None  # a fixed route for this question (no router)
    options: dict[str, Any] = Field(default_factory=dict)
    expected_pages: tuple[ExpectedPage, ...] = ()
    answerable: bool = True

    @field_validator("route")
    @classmethod
    def _known_route(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and value not in ROUTES:
            raise ValueError(f"route must be one of {', '.join(ROUTES)}")
        return value

    @field_validator("options")
    @classmethod
    def _known_options(cls, value: dict[str, Any]) -> dict[str, Any]:
        unknown = set(value) - _query_option_fields()
        if unknown:
            raise ValueError(f"unknown query options: {', '.join(sorted(unknown))}")
        return value

    def query_options(self, overrides: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        """The options to send: the question's own, its route, then the run's overrides (an ablation's switches)."""
        options = dict(self.options)
        if self.route is not None:
            options["route"] = self.route
        options.update(overrides or {})
        return options


def load_jsonl(path: Path, collection: str = "") -> list[WorkloadQuestion]:
    """Questions from a JSONL file; blank lines and lines starting with # are skipped."""
    questions = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as error:
        raise ConfigurationError(f"cannot read workload {path}: {error}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            question = WorkloadQuestion.model_validate(json.loads(line))
        except (json.JSONDecodeError, ValidationError) as error:
            raise ConfigurationError(f"{path}:{number}: not a workload question: {error}") from None
        updates = {"id": question.id or f"q{number:05d}", "collection": question.collection or collection}
        questions.append(question.model_copy(update=updates))
    if not questions:
        raise ConfigurationError(f"workload {path} holds no question")
    return questions


def write_jsonl(path: Path, questions: Sequence[WorkloadQuestion]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(q.model_dump_json(exclude_defaults=True) + "\n" for q in questions))
    return path


# ---------------------------------------------------------------------------------------------- generator


@dataclass(frozen=True)
class Passage:
    """What the generator knows of one stored passage (from an evidence item)."""

    passage_id: str
    document: str
    page: int  # -1 without pages
    block_type: str  # text, table, image, chart, equation, page
    section: str
    text: str

    @property
    def order(self) -> tuple:
        """Where the seeded draw finds this passage: by content, so re-ingested bytes (new ids) draw the same."""
        return (self.document, self.page, self.block_type, self.section, self.text, self.passage_id)

    @property
    def expected(self) -> ExpectedPage:
        return ExpectedPage(document=self.document, page=self.page)


@dataclass(frozen=True)
class Mix:
    questions: list[WorkloadQuestion]
    requested: dict[str, int]  # questions asked for, per type
    produced: dict[str, int]  # questions made, per type
    substituted: dict[str, int]  # of the requested ones, made as lookups instead (the collection lacks the type)
    passages: int
    seed: int

    def describe(self) -> dict:
        return {"requested": self.requested, "produced": self.produced, "substituted": self.substituted,
                "passages": self.passages, "seed": self.seed, "questions": len(self.questions)}


_WORD = re.compile(r"[A-Za-z][A-Za-z\-']+|\d[\d,.]*")
_NAME = re.compile(r"\b[A-Z][a-z]+(?:\s+[A-Z][a-z]+)+\b")
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def content_words(text: str) -> list[str]:
    return [w for w in _WORD.findall(text) if w.lower() not in STOP_WORDS and len(w) > 2]


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n+", text) if len(s.split()) >= 6]


def key_phrase(rng: random.Random, passage: Passage, words: int = 4) -> str:
    """A few consecutive content words of one of the passage's sentences: specific enough to find it again."""
    sentences = _sentences(passage.text) or [passage.text]
    candidates = content_words(rng.choice(sentences)) or content_words(passage.text) or passage.text.split()
    if len(candidates) <= words:
        return " ".join(candidates)
    start = rng.randrange(0, len(candidates) - words + 1)
    return " ".join(candidates[start : start + words])


def _document_label(document: str) -> str:
    return Path(document).stem.replace("-", " ").replace("_", " ")


def _counts(total: int, mix: dict[str, float]) -> dict[str, int]:
    """Largest-remainder split of `total` questions over the mix's weights (deterministic)."""
    weights = {t: w for t, w in mix.items() if w > 0}
    unknown = set(weights) - set(QUESTION_TYPES)
    if unknown:
        raise ConfigurationError(f"unknown question types: {', '.join(sorted(unknown))}")
    scale = sum(weights.values())
    raw = {t: total * w / scale for t, w in weights.items()}
    counts = {t: int(v) for t, v in raw.items()}
    for t in sorted(raw, key=lambda t: (-(raw[t] - counts[t]), QUESTION_TYPES.index(t)))[: total - sum(counts.values())]:
        counts[t] += 1
    return {t: counts.get(t, 0) for t in QUESTION_TYPES}


def generate_mix(
    passages: Sequence[Passage], count: int, seed: int, collection: str = "", mix: Optional[dict[str, float]] = None
) -> Mix:
    """`count` questions over the passages, split by the mix's weights; the same passages and seed, the same questions."""
    if count < 1:
        raise ConfigurationError("a workload needs at least one question")
    pool = sorted({p.passage_id: p for p in passages if p.text.strip()}.values(), key=lambda p: p.order)
    if not pool:
        raise ConfigurationError("the collection has no passage to ask about (is it empty?)")
    rng = random.Random(seed)
    requested = _counts(count, mix or DEFAULT_MIX)
    text = [p for p in pool if p.block_type in ("text", "page") and len(content_words(p.text)) >= 6] or pool
    tables = [p for p in pool if len(_NUMBER.findall(p.text)) >= 2 and (p.block_type == "table" or len(_NUMBER.findall(p.text)) >= 3)]
    visuals = [p for p in pool if p.block_type in ("image", "chart")]
    vocabulary = {w.lower() for p in pool for w in _WORD.findall(p.text)}
    made: list[tuple[str, str, tuple[ExpectedPage, ...], bool]] = []
    substituted = {t: 0 for t in QUESTION_TYPES}

    def lookup() -> tuple[str, str, tuple[ExpectedPage, ...], bool]:
        p = rng.choice(text)
        return "lookup", f"What does {_document_label(p.document)} say about {key_phrase(rng, p)}?", (p.expected,), True

    def two_apart() -> Optional[tuple[Passage, Passage]]:
        a = rng.choice(text)
        others = [p for p in text if (p.document, p.page) != (a.document, a.page) or (a.page < 0 and p.passage_id != a.passage_id)]
        return (a, rng.choice(others)) if others else None

    for kind in QUESTION_TYPES:
        for _ in range(requested[kind]):
            item = None
            if kind == "lookup":
                item = lookup()
            elif kind == "comparison":
                pair = two_apart()
                if pair:
                    a, b = pair
                    item = (kind, f"Compare {key_phrase(rng, a, 3)} with {key_phrase(rng, b, 3)}.", _unique(a, b), True)
            elif kind == "calculation" and tables:
                p = rng.choice(tables)
                numbers = sorted(rng.sample(range(len(_NUMBER.findall(p.text))), 2))
                numbers = [_NUMBER.findall(p.text)[i] for i in numbers]
                subject = key_phrase(rng, p, 3)
                what = "in the table" if p.block_type == "table" else "in the passage"
                item = (kind, f"What is the total of {numbers[0]} and {numbers[1]} {what} about {subject}, and how do they compare?",
                        (p.expected,), True)
            elif kind == "multi_hop":
                item = _multi_hop(rng, text)
            elif kind == "visual" and visuals:
                p = rng.choice(visuals)
                noun = "chart" if p.block_type == "chart" else "figure"
                item = (kind, f"What does the {noun} about {key_phrase(rng, p, 4)} show?", (p.expected,), True)
            elif kind == "unanswerable":
                item = (kind, _invented_question(rng, vocabulary), (), False)
            if item is None:
                substituted[kind] += 1
                item = lookup()
            made.append(item)
    questions = [
        WorkloadQuestion(id=f"{kind}-{n:04d}", question=q, collection=collection, type=kind, expected_pages=pages, answerable=ok)
        for n, (kind, q, pages, ok) in enumerate(made)
    ]
    produced = {t: sum(1 for q in questions if q.type == t) for t in QUESTION_TYPES}
    return Mix(questions, requested, produced, {t: n for t, n in substituted.items() if n}, len(pool), seed)


def _unique(*passages: Passage) -> tuple[ExpectedPage, ...]:
    return tuple(dict.fromkeys(p.expected for p in passages))


def _multi_hop(rng: random.Random, text: Sequence[Passage]):
    """Two passages on different pages that name the same person, place or company, asked about together."""
    names: dict[str, list[Passage]] = {}
    for p in text:
        for name in sorted(set(_NAME.findall(p.text))):
            names.setdefault(name, []).append(p)
    linked = sorted(n for n, ps in names.items() if len({(p.document, p.page, p.passage_id) for p in ps}) >= 2)
    if not linked:
        return None
    name = rng.choice(linked)
    a, b = rng.sample(names[name], 2)
    question = f"How is {name} connected to {key_phrase(rng, b, 3)}, and what does that mean for {key_phrase(rng, a, 3)}?"
    return "multi_hop", question, _unique(a, b), True


_SYLLABLES = ("zor", "quen", "vel", "trax", "mib", "dru", "kos", "fal", "yth", "plen", "gor", "wix")
_METRICS = ("annual revenue", "headcount", "carbon emissions", "market share", "number of patents")


def _invented_question(rng: random.Random, vocabulary: set[str]) -> str:
    """A question about a company no passage names (checked against the collection's words)."""
    while True:
        name = "".join(rng.choice(_SYLLABLES) for _ in range(3)).capitalize()
        if name.lower() not in vocabulary:
            break
    return f"What was the {rng.choice(_METRICS)} of {name} Holdings in {rng.randint(1961, 1989)}?"


# ---------------------------------------------------------------------------------------------- harvest

PROBES = ("summary overview", "table figures total", "chart figure image", "results growth change", "people manager director")
# The visual stages a trained profile runs by default and the tiny profile does not (its page encoders and VLM have
# random weights, so they have no say there): the cost and ablation modes ask for them, so that what they measure
# is the cost of the whole pipeline, as in their runs before that default changed. Each route still decides.
VISUAL_STAGES: dict[str, Any] = {"page_images": True, "perception": "dpr"}
PROBE_OPTIONS = {"top_k": 30, "chunk_top_k": 30, "rerank": False, "page_images": False, "perception": "off",
                 "answerer": "extractive", "route": "simple"}


def passages_from_evidence(items) -> list[Passage]:
    """Evidence items (proto) as passages; page evidence (whole page images) has no text and is skipped."""
    out = []
    for item in items:
        if item.kind == "page" or not item.text.strip():
            continue
        pages = sorted({region.page for region in item.regions} or {item.page})
        out.append(Passage(item.passage_id, item.document_name, pages[0], item.block_type, item.section, item.text))
    return out


async def harvest(client, collection: str, probes_per_document: int = 3) -> list[Passage]:
    """Passages of a collection through its public API: probe queries built from every document's name and
    sections, plus generic probes (tables, figures, people), keep every evidence item they return."""
    documents = await client.list_documents(collection)
    queries = list(PROBES)
    for document in documents:
        queries.append(_document_label(document.name))
    found: dict[str, Passage] = {}

    async def probe(text: str) -> list[Passage]:
        async for event in client.query(collection, text, **PROBE_OPTIONS):
            if event.WhichOneof("event") == "evidence":
                return passages_from_evidence(event.evidence.items)
        return []

    for text in queries:
        for passage in await probe(text):
            found.setdefault(passage.passage_id, passage)
    # a second round from the sections found: reaches passages the first probes ranked too low
    sections = sorted({p.section.split(" > ")[-1] for p in found.values() if p.section})
    for text in sections[: probes_per_document * max(1, len(documents))]:
        for passage in await probe(text):
            found.setdefault(passage.passage_id, passage)
    return sorted(found.values(), key=lambda p: p.order)
