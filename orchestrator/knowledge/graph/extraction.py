"""Entities and relations from one piece of evidence (a text chunk or a multimodal unit's description).

Two extractors give the same `Extraction`:

- `CooccurrenceExtractor`: model-free, like GraphRAG's "fast" indexing. Entities are capitalised phrases,
  acronyms and product codes found by a small deterministic heuristic (no spaCy/nltk models are available
  offline); two entities are related when they share a sentence. Cheap enough to run on every chunk.
- `LlmExtractor`: LightRAG-style extraction by an LLM asked for strict JSON. Small models answer with fences,
  prose, trailing commas, single quotes or JSON cut by max_tokens, so `parse_llm_extraction` is a tolerant
  parser of its own that keeps every complete item and never raises.

Names stay as written in the text; `normalize_entity_name` gives the hard-match key entities are merged on,
across chunks and documents (AutoThinkRAG's "hard-matching" entity merge).
"""

from __future__ import annotations

import json
import logging
import math
import re
import unicodedata
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable, Iterator, Optional, Sequence

from ...prompts import extraction_prompt
from ..parsing.documents import Block
from ..parsing.text import STOP_WORDS, split_sentences

log = logging.getLogger(__name__)

DEFAULT_ENTITY_TYPE = "concept"
ENTITY_TYPES = ("organization", "person", "location", "product", "event", "metric", "concept")
DESCRIPTION_CHARS = 300  # a co-occurrence description is the sentence, cut to about this length


@dataclass(frozen=True)
class Entity:
    name: str  # as written in the text
    type: str
    description: str


@dataclass(frozen=True)
class Relation:
    source: str  # entity names as written in the text
    target: str
    description: str
    keywords: str
    weight: float


@dataclass(frozen=True)
class Extraction:
    entities: list[Entity]
    relations: list[Relation]


# --------------------------------------------------------------------------------------------------------------
# The hard-match key


_ARTICLES = ("the ", "a ", "an ")


def normalize_entity_name(name: str) -> str:
    """The key entities merge on: "The  Bank of England," and "bank of england" are one entity.

    NFKC + casefold (full-width and ligature forms, "Straße" = "STRASSE"), whitespace collapsed, surrounding
    punctuation and quotes stripped, leading English articles dropped. "" means: not a usable name.
    """
    if not isinstance(name, str):
        return ""
    if name.isascii():  # NFKC leaves ASCII as it is and casefold is lower(): the router asks this for every word run
        return _without_articles(" ".join(name.lower().split()).strip(_ASCII_EDGE_JUNK))
    text = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", name).casefold())
    return _without_articles(_strip_punctuation(" ".join(text.split())))


def _without_articles(text: str) -> str:
    stripped = True
    while stripped:  # all of them, so that a key normalises to itself ("a the b" -> "b")
        stripped = False
        for article in _ARTICLES:
            if text.startswith(article) and len(text) > len(article):
                text, stripped = _strip_punctuation(text[len(article) :]), True
    return text


def _strip_punctuation(text: str) -> str:
    start, end = 0, len(text)
    while start < end and _is_edge_junk(text[start]):
        start += 1
    while end > start and _is_edge_junk(text[end - 1]):
        end -= 1
    return text[start:end]


def _is_edge_junk(char: str) -> bool:
    return char.isspace() or unicodedata.category(char).startswith("P")


_ASCII_EDGE_JUNK = "".join(chr(code) for code in range(128) if _is_edge_junk(chr(code)))


# --------------------------------------------------------------------------------------------------------------
# Model-free extraction


# Capitalised words that are not entities on their own: document furniture, months, days.
_NOT_ENTITIES = frozenset(
    """
    table tables figure figures fig chart charts equation equations section sections page pages appendix chapter
    note notes source sources image images exhibit
    january february march april may june july august september october november december
    monday tuesday wednesday thursday friday saturday sunday
    """.split()
)

# Common nouns and adjectives that often start a sentence of a report: capitalised there, they are not names.
_COMMON_INITIALS = frozenset(
    """
    revenue revenues sales profit profits net gross total average operating income earnings margin margins cost
    costs expenses spending growth demand supply market markets customer customers client clients product
    products service services production employees staff management results performance outlook guidance risk
    risks capital cash debt investment investments energy research development shares share dividend price
    prices inflation interest rates rate tax taxes data information analysis summary overview introduction
    conclusion conclusions background method methods approach model models system systems users user new
    first second third recent current annual quarterly full strong higher lower both several many most
    letter financial financials sustainability operations highlights strategy governance region regions country
    countries segment segments year years quarter item items name value values category type description unit
    amount key
    """.split()
)

# Time and discourse words that open sentences: capitalised there, never the first word of a name.
_OPENERS = frozenset(
    """
    later earlier meanwhile today yesterday tomorrow afterwards thereafter then now still also next last however
    moreover furthermore additionally overall together since once soon instead otherwise likewise thus hence
    """.split()
)

# Titles before a name: not part of the entity, and the name after one is a person.
_TITLES = frozenset("mr mrs ms miss dr prof professor sir dame ceo cfo coo cto".split())
_ORGANIZATION_WORDS = frozenset(
    """
    inc ltd llc plc corp corporation company co group holdings gmbh ag sa bank university institute association
    ministry department agency authority commission council foundation
    """.split()
)

# Units next to a number are measurements, not entities ("5 GB", "EUR 20", "3.5 GHz").
_UNITS = frozenset(
    """
    kg g mg t km m cm mm nm ms s h hz khz mhz ghz kb mb gb tb pb kw mw gw w kwh mwh gwh twh v mah usd eur gbp
    jpy cny chf bn mn k x pct percent tokens
    """.split()
)

# Words that glue a capitalised name together: "Bank of England", "Centre for Economic Research".
_CONNECTORS = frozenset("of for de du der van von da".split())

_TOKEN = re.compile(r"[^\W_](?:\w|[-&.'’](?=[^\W_]))*")
_MARKUP = re.compile(r"[*`]+")
_RESTARTS = frozenset(":;|(\"“‘•")


@dataclass(frozen=True)
class _Token:
    text: str
    start: int
    end: int
    shape: str  # "cap", "acronym", "code", "number", "lower"
    possessive: bool
    initial: bool  # where any word is capitalised: sentence start, after a colon, a table cell, a quote


@dataclass(frozen=True)
class _Candidate:
    name: str
    key: str
    type: str


class CooccurrenceExtractor:
    """Entities by a capitalisation heuristic, relations by sentence co-occurrence (GraphRAG's fast mode).

    Deterministic and model-free. Recall is limited to names the text capitalises (or writes as acronyms and
    product codes). Where any word is capitalised (a sentence start, after a colon, a table cell), a word that
    is a stop word, a common report word or a word the text also writes in lower case is not a name, unless
    the text capitalises it elsewhere too or a capitalised word follows it directly ("Northwind Traders"),
    and such a word is dropped before a name the text also uses on its own ("Later Contoso", "sold Contoso"):
    "Revenue grew" and "Outlook for Europe" do not make "Revenue" or "Outlook" entities, "Europe grew" keeps
    "Europe", and a first name stays with its surname ("Yara Falkenberg ... Falkenberg said"). A relation's weight is the number of sentences of the text the two entities share; its
    description is the first such sentence.
    """

    def __init__(self, min_chars: int = 2, max_words: int = 6, max_entities_per_sentence: int = 12):
        self.min_chars = min_chars
        self.max_words = max_words  # longer capitalised runs are headings in Title Case, not names
        self.max_entities_per_sentence = max_entities_per_sentence  # bounds the pairs of one long list line

    def extract(self, text: str) -> Extraction:
        sentences = split_sentences(text)
        cleaned = [_MARKUP.sub(lambda m: " " * len(m.group()), s) for s in sentences]
        tokenised = [_tokens(s) for s in cleaned]
        confirmed = {  # words the text capitalises where it did not have to
            t.text.casefold() for tokens in tokenised for t in tokens if t.shape == "cap" and not t.initial
        }
        common = _COMMON_INITIALS | {  # words the text also writes in lower case
            part for tokens in tokenised for t in tokens if t.shape == "lower" for part in t.text.split("-")
        }
        standalone = {  # words that start a name in the middle of a sentence ("sold Contoso")
            t.text.casefold()
            for sentence, tokens in zip(cleaned, tokenised)
            for k, t in enumerate(tokens)
            if not t.initial and _can_start(t) and not (_can_continue(tokens[k - 1]) and _glued(sentence, tokens[k - 1], t))
        }
        names: dict[str, dict[str, int]] = {}
        types: dict[str, str] = {}
        first_sentence: dict[str, int] = {}
        kept: list[list[str]] = []
        for number, (sentence, tokens) in enumerate(zip(cleaned, tokenised)):
            keys: list[str] = []
            for candidate in self._candidates(sentence, tokens, confirmed, common, standalone):
                forms = names.setdefault(candidate.key, {})
                forms[candidate.name] = forms.get(candidate.name, 0) + 1
                first_sentence.setdefault(candidate.key, number)
                if types.get(candidate.key, DEFAULT_ENTITY_TYPE) == DEFAULT_ENTITY_TYPE:
                    types[candidate.key] = candidate.type
                if candidate.key not in keys:
                    keys.append(candidate.key)
            kept.append(keys[: self.max_entities_per_sentence])

        display = {key: _most_frequent(forms) for key, forms in names.items()}
        entities = [Entity(display[key], types[key], _trim(sentences[first_sentence[key]])) for key in names]
        pairs: dict[tuple[str, str], list[Any]] = {}
        for number, keys in enumerate(kept):
            for i, left in enumerate(keys):
                for right in keys[i + 1 :]:
                    pair = (left, right) if left < right else (right, left)
                    if pair in pairs:
                        pairs[pair][2] += 1
                    else:
                        pairs[pair] = [left, right, 1, number]
        relations = [
            Relation(display[left], display[right], _trim(sentences[number]), "", float(count))
            for left, right, count, number in pairs.values()
        ]
        return Extraction(entities, relations)

    def _candidates(
        self, text: str, tokens: list[_Token], confirmed: set[str], common: frozenset[str], standalone: set[str]
    ) -> Iterator[_Candidate]:
        """The capitalised runs of one sentence that pass the rules above."""
        i = 0
        while i < len(tokens):
            token = tokens[i]
            if not _can_start(token):
                i += 1
                continue
            last, joined_by_of = i, False
            while (following := _extend(text, tokens, last, joined_by_of)) is not None:
                last, crossed_of = following
                joined_by_of = joined_by_of or crossed_of
            folded = token.text.casefold()
            if token.shape == "cap" and token.initial and folded not in confirmed:
                joined_directly = last > i and tokens[i + 1].shape != "lower"
                opener = folded in common or folded in _OPENERS or folded.endswith("ly")
                if (folded in common and not joined_directly) or (
                    # "Later Contoso" (and "sold Contoso" elsewhere): an opener, not a first name ("Yara Falkenberg")
                    joined_directly and opener and tokens[i + 1].text.casefold() in standalone
                ):
                    i += 1
                    continue
            run = tokens[i : last + 1]
            name = " ".join(text[run[0].start : run[-1].end].split())
            key = normalize_entity_name(name)
            if len(run) <= self.max_words and _long_enough(run, key, self.min_chars):
                yield _Candidate(name, key, _entity_type(tokens, i, run))
            i = last + 1


def _tokens(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    previous: Optional[_Token] = None
    for match in _TOKEN.finditer(text):
        word, start, end = match.group(), match.start(), match.end()
        possessive = False
        if len(word) > 2 and word[-2] in "'’" and word[-1] in "sS":
            word, end, possessive = word[:-2], end - 2, True
        shape = _shape(word)
        if previous is not None and _adjacent(text, previous, start) and _is_unit_pair(previous, shape, word):
            shape = "number"  # "5 GB": the unit is part of a measurement
            if previous.shape != "number":
                tokens[-1] = replace(previous, shape="number")
        initial = previous is None or any(c in _RESTARTS for c in text[previous.end : start])
        token = _Token(word, start, end, shape, possessive, initial)
        tokens.append(token)
        previous = token
    return tokens


def _is_unit_pair(previous: _Token, shape: str, word: str) -> bool:
    if previous.shape == "number" and word.casefold() in _UNITS:
        return True
    return shape == "number" and previous.text.casefold() in _UNITS  # "EUR 20"


def _shape(word: str) -> str:
    letters = [c for c in word if c.isalpha()]
    if not letters or word[0].isdigit():
        return "number"  # 2024, 12.5, 5kg, 3D, 10x
    has_digit = any(c.isdigit() for c in word)
    if all(c.isupper() for c in letters):
        return "code" if has_digit else ("acronym" if len(letters) >= 2 else "cap")
    if word[0].isupper():
        return "code" if has_digit else "cap"
    if any(c.isupper() for c in word[1:]) and word.casefold() not in _UNITS:
        return "code" if has_digit else "cap"  # iPhone, eBay
    return "lower"


def _can_start(token: _Token) -> bool:
    if token.shape not in ("cap", "acronym", "code"):
        return False
    folded = token.text.casefold()
    if token.shape == "cap" and (folded in STOP_WORDS or folded in _NOT_ENTITIES):
        return False
    return folded not in _TITLES


def _can_continue(token: _Token) -> bool:
    if token.shape not in ("cap", "acronym", "code"):
        return False
    folded = token.text.casefold()
    return folded not in _TITLES and not (token.shape == "cap" and folded in STOP_WORDS)


def _extend(text: str, tokens: list[_Token], last: int, joined_by_of: bool) -> Optional[tuple[int, bool]]:
    """The token that continues a capitalised run ending at `last`, and whether an "of"/"for" was crossed."""
    current = tokens[last]
    if current.possessive or last + 1 >= len(tokens):
        return None
    nxt = tokens[last + 1]
    gap = text[current.end : nxt.start]
    if gap.strip() == "&" and _can_continue(nxt):
        return last + 1, False
    if gap.strip():
        return None
    if _can_continue(nxt):
        return last + 1, False
    # Connectors: "Bank of England", "Bank of the West"; "and" only inside an "of" name
    # ("Department of Health and Social Care"), since "Northwind and Contoso" are two entities.
    folded = nxt.text.casefold()
    if folded in _CONNECTORS or (folded == "and" and joined_by_of):
        step = last + 2
        if folded in ("of", "for") and step < len(tokens) and tokens[step].text.casefold() == "the":
            if _adjacent(text, tokens[step - 1], tokens[step].start):
                step += 1
        if step < len(tokens) and _can_continue(tokens[step]) and all(
            _adjacent(text, tokens[k - 1], tokens[k].start) for k in range(last + 1, step + 1)
        ):
            return step, folded in ("of", "for")
    return None


def _glued(text: str, left: _Token, right: _Token) -> bool:
    """Nothing but spaces or an ampersand between two words of one name."""
    return not left.possessive and text[left.end : right.start].strip() in ("", "&")


def _adjacent(text: str, left: _Token, right_start: int) -> bool:
    return not left.possessive and not text[left.end : right_start].strip()


def _long_enough(run: Sequence[_Token], key: str, min_chars: int) -> bool:
    if len(key) < min_chars:
        return False
    if len(run) == 1 and run[0].shape == "code":
        return len(run[0].text) >= 3  # "Q3", "H1" are periods, "X200" a product
    if len(run) == 1 and run[0].shape == "cap":
        return len(run[0].text) >= 2
    return True


def _entity_type(tokens: list[_Token], start: int, run: Sequence[_Token]) -> str:
    """organization by a legal/institutional word, person after a title; "concept" otherwise."""
    if start > 0 and tokens[start - 1].text.casefold().rstrip(".") in _TITLES:
        return "person"
    words = [t.text.casefold().rstrip(".") for t in run]
    if words[-1] in _ORGANIZATION_WORDS or (len(words) > 2 and words[0] in _ORGANIZATION_WORDS and words[1] == "of"):
        return "organization"
    return DEFAULT_ENTITY_TYPE


def _most_frequent(forms: dict[str, int]) -> str:
    """The most frequent surface form; ties go to the first seen (dicts keep insertion order)."""
    return max(forms.items(), key=lambda item: item[1])[0]


def _trim(text: str, limit: int = DESCRIPTION_CHARS) -> str:
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(" ", 1)[0] or text[:limit]
    return cut.rstrip(",;:") + "…"


# --------------------------------------------------------------------------------------------------------------
# LLM extraction


Generate = Callable[[str, int], Awaitable[str]]

class LlmExtractor:
    """LightRAG-style extraction: one generation per chunk, parsed tolerantly.

    `generate(prompt, max_tokens)` is injected (the ingest pipeline renders the prompt with the LLM's chat template and streams it
    from Triton's LLM), so any generator, including a test's, can drive it. Errors of `generate` propagate:
    a failing model must not look like a chunk without entities.
    """

    def __init__(self, generate: Generate, max_tokens: int = 512):
        self.generate = generate
        self.max_tokens = max_tokens

    async def extract(self, text: str) -> Extraction:
        if not text.strip():
            return Extraction([], [])
        raw = await self.generate(extraction_prompt(text, ENTITY_TYPES), self.max_tokens)
        return parse_llm_extraction(raw)


_NAME_KEYS = ("name", "entity_name", "entity")
_TYPE_KEYS = ("type", "entity_type", "category", "kind")
_ENTITY_DESCRIPTION_KEYS = ("description", "entity_description", "desc", "summary")
_SOURCE_KEYS = ("source", "src", "src_id", "source_entity", "from", "head", "subject")
_TARGET_KEYS = ("target", "tgt", "tgt_id", "target_entity", "to", "tail", "object")
_RELATION_DESCRIPTION_KEYS = (
    "description", "relationship_description", "relation_description", "desc", "summary", "relation", "relationship",
)
_KEYWORD_KEYS = ("keywords", "relationship_keywords", "keyword", "tags")
_WEIGHT_KEYS = ("weight", "strength", "relationship_strength", "score", "confidence")
_CONTAINER_KEYS = ("entities", "relations", "relationships", "edges", "nodes")
_MAX_NAME_CHARS = 200
_MAX_DESCRIPTION_CHARS = 2000


def parse_llm_extraction(raw: str) -> Extraction:
    """The entities and relations in an LLM's answer, however malformed; never raises.

    Keeps every complete item (JSON cut by max_tokens loses only the item it was cut in), accepts fences,
    prose around the JSON, trailing commas, single quotes, comments, unquoted keys, LightRAG's field names;
    skips items without a usable name and self-relations; merges duplicates by the hard-match key; adds the
    endpoints of relations that the entity list lacks as "concept" entities.
    """
    try:
        return _parse_llm_extraction(raw)
    except Exception:  # a bug here must not fail an ingest; the fuzz test calls the unguarded function
        log.exception("could not parse an extraction answer; treating it as empty")
        return Extraction([], [])


def _parse_llm_extraction(raw: Any) -> Extraction:
    if isinstance(raw, (bytes, bytearray)):
        raw = raw.decode("utf-8", errors="replace")
    if not isinstance(raw, str):
        return Extraction([], [])
    entity_items, relation_items = _items(_json_values(raw))

    entities: dict[str, dict[str, Any]] = {}
    for item in entity_items:
        name = _text(_first(item, _NAME_KEYS), _MAX_NAME_CHARS)
        key = normalize_entity_name(name) if name else ""
        if not key:
            continue
        kind = " ".join(_text(_first(item, _TYPE_KEYS), 60).casefold().split()) or DEFAULT_ENTITY_TYPE
        description = _text(_first(item, _ENTITY_DESCRIPTION_KEYS), _MAX_DESCRIPTION_CHARS)
        merged = entities.get(key)
        if merged is None:
            entities[key] = {"name": name, "type": kind, "descriptions": [description] if description else []}
            continue
        if merged["type"] == DEFAULT_ENTITY_TYPE:
            merged["type"] = kind
        if description and description not in merged["descriptions"]:
            merged["descriptions"].append(description)

    relations: dict[tuple[str, str], dict[str, Any]] = {}
    for item in relation_items:
        source = _text(_first(item, _SOURCE_KEYS), _MAX_NAME_CHARS)
        target = _text(_first(item, _TARGET_KEYS), _MAX_NAME_CHARS)
        source_key, target_key = normalize_entity_name(source), normalize_entity_name(target)
        if not source_key or not target_key or source_key == target_key:
            continue
        for name, key in ((source, source_key), (target, target_key)):
            entities.setdefault(key, {"name": name, "type": DEFAULT_ENTITY_TYPE, "descriptions": []})
        description = _text(_first(item, _RELATION_DESCRIPTION_KEYS), _MAX_DESCRIPTION_CHARS)
        keywords = [k for k in (w.strip() for w in _text(_first(item, _KEYWORD_KEYS), 500).split(",")) if k]
        weight = _weight(_first(item, _WEIGHT_KEYS))
        pair = (source_key, target_key) if source_key < target_key else (target_key, source_key)
        merged = relations.get(pair)
        if merged is None:
            relations[pair] = {
                "source": entities[source_key]["name"], "target": entities[target_key]["name"],
                "descriptions": [description] if description else [], "keywords": keywords, "weight": weight,
            }
            continue
        # A repeated relation in one answer is the model repeating itself, not more evidence: keep the max.
        merged["weight"] = max(merged["weight"], weight)
        if description and description not in merged["descriptions"]:
            merged["descriptions"].append(description)
        merged["keywords"] += [k for k in keywords if k not in merged["keywords"]]

    return Extraction(
        [Entity(e["name"], e["type"], "\n".join(e["descriptions"])) for e in entities.values()],
        [
            Relation(r["source"], r["target"], "\n".join(r["descriptions"]), ", ".join(r["keywords"]), r["weight"])
            for r in relations.values()
        ],
    )


def _items(values: list[Any]) -> tuple[list[dict], list[dict]]:
    """Entity-like and relation-like objects anywhere in the parsed values, in document order.

    Classified by their keys, not by where they sit, so {"entities": [...]}, a bare list, LightRAG's field
    names and a wrapper object all work.
    """
    entities: list[dict] = []
    relations: list[dict] = []
    stack: list[Any] = list(reversed(values))
    while stack:
        value = stack.pop()
        if isinstance(value, list):
            stack.extend(reversed(value))
        elif isinstance(value, dict):
            if any(isinstance(value.get(k), (list, dict)) for k in _CONTAINER_KEYS):
                stack.extend(reversed([v for v in value.values() if isinstance(v, (list, dict))]))
            elif _is_scalar(_first(value, _SOURCE_KEYS)) and _is_scalar(_first(value, _TARGET_KEYS)):
                relations.append(value)
            elif _is_scalar(_first(value, _NAME_KEYS)):
                entities.append(value)
            else:
                stack.extend(reversed([v for v in value.values() if isinstance(v, (list, dict))]))
    return entities, relations


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


def _first(item: dict, keys: Sequence[str]) -> Any:
    for key in keys:
        value = item.get(key)
        if value is not None:
            return value
    return None


def _text(value: Any, limit: int) -> str:
    """A field as text: strings and numbers as they are, lists of them joined; anything else is absent."""
    if isinstance(value, bool) or value is None:
        return ""
    if isinstance(value, (int, float)):
        text = str(value) if math.isfinite(value) else ""
    elif isinstance(value, str):
        text = value
    elif isinstance(value, list):
        text = ", ".join(_text(v, limit) for v in value if isinstance(v, (str, int, float)) and not isinstance(v, bool))
    else:
        return ""
    text = " ".join(text.split())
    return text if len(text) <= limit else ""


def _weight(value: Any) -> float:
    """A positive finite weight; anything else (missing, "high", NaN, 0, negative) is 1.0."""
    if isinstance(value, bool):
        return 1.0
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return 1.0
    if isinstance(value, (int, float)) and math.isfinite(value) and value > 0:
        return float(value)
    return 1.0


_FENCE = re.compile(r"```[a-zA-Z]*\s*\n?(.*?)```", re.DOTALL)
_MAX_CANDIDATES = 64  # top-level values tried in one answer


def _json_values(raw: str) -> list[Any]:
    """Every JSON-like value in the text: strict JSON when it parses, else the tolerant parser's scan."""
    for candidate in [m.group(1) for m in _FENCE.finditer(raw)] + [raw]:
        try:
            value = json.loads(candidate.strip())
        except (ValueError, RecursionError):
            continue
        if isinstance(value, (dict, list)):
            return [value]
    values: list[Any] = []
    position = 0
    while len(values) < _MAX_CANDIDATES:
        start = _next_container(raw, position)
        if start < 0:
            break
        parser = _TolerantJson(raw, start)
        value, _ = parser.value(0)
        values.append(value)
        position = max(parser.position, start + 1)
    return values


def _next_container(text: str, position: int) -> int:
    brace, bracket = text.find("{", position), text.find("[", position)
    if brace < 0 or bracket < 0:
        return max(brace, bracket)
    return min(brace, bracket)


_MAX_DEPTH = 40
_NUMBER = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_BARE_KEY = re.compile(r"[^\s:=,{}\[\]\"']+")
_BARE_VALUE = re.compile(r"[^,{}\[\]\n]*")
_WORDS = {"true": True, "false": False, "null": None, "none": None, "undefined": None, "nan": math.nan}
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "/": "/", "\\": "\\", '"': '"', "'": "'"}
_CLOSERS = ",:}]\n\r"
_STRING_SPECIALS = {'"': re.compile(r'[\\"]'), "'": re.compile(r"[\\']")}


class _TolerantJson:
    """A forgiving JSON reader: values are returned with whether they were complete.

    At the end of the text, an array drops its unfinished last item and an object keeps the finished
    containers it holds, so a truncated answer yields exactly its complete items. A quote closes a string
    only when a delimiter follows it, so inner quotes and apostrophes ('Northwind's') survive.
    """

    def __init__(self, text: str, position: int = 0):
        self.text = text
        self.position = position

    def value(self, depth: int) -> tuple[Any, bool]:
        self._space()
        if self.position >= len(self.text):
            return None, False
        char = self.text[self.position]
        if char in "{[":
            if depth >= _MAX_DEPTH:
                return None, self._skip_container()
            return self._object(depth + 1) if char == "{" else self._array(depth + 1)
        if char in "\"'":
            return self._string()
        if char in ",:}]":
            return None, True  # a missing value
        return self._bare()

    def _object(self, depth: int) -> tuple[dict, bool]:
        text = self.text
        self.position += 1
        result: dict[str, Any] = {}
        while True:
            self._space()
            if self.position >= len(text):
                return result, False
            char = text[self.position]
            if char == "}":
                self.position += 1
                return result, True
            if char in ",:]=":
                self.position += 1
                continue
            if char in "{[":
                _, complete = self.value(depth)  # a value without a key: read past it
                if not complete:
                    return result, False
                continue
            if char in "\"'":
                key, complete = self._string()
                if not complete:
                    return result, False
            else:
                key = _BARE_KEY.match(text, self.position).group()
                self.position += len(key)
            self._space()
            if self.position >= len(text):
                return result, False
            if text[self.position] in ":=":
                self.position += 1
            elif text[self.position] in ",}":
                continue  # a key without a value
            value, complete = self.value(depth)
            if not complete:
                if isinstance(value, (dict, list)):
                    result[key] = value  # its finished items
                return result, False
            result[key] = value

    def _array(self, depth: int) -> tuple[list, bool]:
        text = self.text
        self.position += 1
        result: list[Any] = []
        while True:
            self._space()
            if self.position >= len(text):
                return result, False
            char = text[self.position]
            if char == "]":
                self.position += 1
                return result, True
            if char in ",:}":
                self.position += 1
                continue
            start = self.position
            value, complete = self.value(depth)
            if not complete:
                return result, False  # the item the text was cut in
            result.append(value)
            if self.position == start:
                self.position += 1

    def _string(self) -> tuple[str, bool]:
        text, quote = self.text, self.text[self.position]
        special = _STRING_SPECIALS[quote]
        self.position += 1
        parts: list[str] = []
        while True:
            match = special.search(text, self.position)
            if match is None:
                self.position = len(text)
                return "", False
            parts.append(text[self.position : match.start()])
            self.position = match.start()
            if match.group() == "\\":
                if self.position + 1 >= len(text):
                    self.position = len(text)
                    return "", False
                escaped = text[self.position + 1]
                if escaped == "u":
                    char, length = _unicode_escape(text, self.position)
                    parts.append(char)
                    self.position += length
                else:
                    parts.append(_ESCAPES.get(escaped, escaped))
                    self.position += 2
                continue
            after = self.position + 1
            while after < len(text) and text[after] in " \t":
                after += 1
            if after >= len(text) or text[after] in _CLOSERS:
                self.position += 1
                return "".join(parts), True
            parts.append(quote)  # an inner quote or apostrophe
            self.position += 1

    def _bare(self) -> tuple[Any, bool]:
        text = self.text
        number = _NUMBER.match(text, self.position)
        if number is not None:
            end = number.end()
            following = text[end : end + 1]
            if not following or following in _CLOSERS or following in " \t}":
                self.position = end
                if not following:
                    return None, False  # "0." at the very end may have been cut
                literal = number.group()
                return (int(literal) if re.fullmatch(r"-?\d+", literal) else float(literal)), True
        match = _BARE_VALUE.match(text, self.position)
        word = match.group()
        if not word:
            self.position += 1
            return None, True
        self.position = match.end()
        if self.position >= len(text):
            return None, False
        word = word.strip()
        folded = word.casefold()
        if folded in _WORDS:
            return _WORDS[folded], True
        if folded in ("infinity", "-infinity"):
            return None, True
        return word, True

    def _space(self) -> None:
        """Whitespace and comments (// line, /* block */) between tokens."""
        text = self.text
        while self.position < len(text):
            char = text[self.position]
            if char.isspace():
                self.position += 1
            elif text.startswith("//", self.position):
                end = text.find("\n", self.position)
                self.position = len(text) if end < 0 else end + 1
            elif text.startswith("/*", self.position):
                end = text.find("*/", self.position + 2)
                self.position = len(text) if end < 0 else end + 2
            else:
                return

    def _skip_container(self) -> bool:
        """Read past a container nested too deep (brackets counted, strings ignored): not worth keeping."""
        depth = 0
        text = self.text
        while self.position < len(text):
            char = text[self.position]
            self.position += 1
            if char in "{[":
                depth += 1
            elif char in "}]":
                depth -= 1
                if depth == 0:
                    return True
        return False


def _unicode_escape(text: str, position: int) -> tuple[str, int]:
    """A \\uXXXX escape (with a following low surrogate when it is a pair); invalid ones are kept literally."""
    digits = text[position + 2 : position + 6]
    if len(digits) < 4 or not all(c in "0123456789abcdefABCDEF" for c in digits):
        return "u", 2
    code = int(digits, 16)
    if 0xD800 <= code < 0xDC00 and text[position + 6 : position + 8] == "\\u":
        low_digits = text[position + 8 : position + 12]
        if len(low_digits) == 4 and all(c in "0123456789abcdefABCDEF" for c in low_digits):
            low = int(low_digits, 16)
            if 0xDC00 <= low < 0xE000:
                return chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)), 12
    if 0xD800 <= code < 0xE000:
        return "\ufffd", 6
    return chr(code), 6


# --------------------------------------------------------------------------------------------------------------
# Multimodal units


_VISUAL_LABELS = {"image": "Image", "table": "Table", "equation": "Equation", "chart": "Chart"}


def describe_fallback(block: Block, max_chars: int = 2000) -> str:
    """The tiny profile's description of a multimodal unit: what the page itself says about it.

    "Table: <caption>\\n<rows>\\n<footnote>" (the content is the table text, the equation's LaTeX, a chart's
    data when the parser gave any; images have none). It anchors the unit in the graph and the vector index
    when no VLM describes it, and the VLM's description is appended to it when one does.
    """
    if block.type not in _VISUAL_LABELS:
        raise ValueError(f"describe_fallback is for image, table, equation and chart blocks, not {block.type!r}")
    caption = " ".join(block.caption.split())
    lines = [f"{_VISUAL_LABELS[block.type]}: {caption}" if caption else _VISUAL_LABELS[block.type]]
    content = block.content.strip()
    if content:
        lines.append(content if len(content) <= max_chars else content[:max_chars].rstrip() + "…")
    footnote = " ".join(block.footnote.split())
    if footnote:
        lines.append(footnote)
    return "\n".join(lines)
