"""LightRAG-style extraction by an LLM asked for strict JSON. Small models answer with fences, prose, trailing
commas, single quotes or JSON cut by max_tokens, so `parse_llm_extraction` is a tolerant parser of its own that
keeps every complete item and never raises."""

from __future__ import annotations

import json
import logging
import math
import re
from typing import Any, Awaitable, Callable, Sequence

from ...prompts import extraction_prompt
from .extraction import DEFAULT_ENTITY_TYPE, ENTITY_TYPES, Entity, Extraction, Relation, normalize_entity_name

log = logging.getLogger(__name__)

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


