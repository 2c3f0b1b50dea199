"""Model-free extraction, like GraphRAG's "fast" indexing: entities are capitalised phrases, acronyms and product
codes found by a small deterministic heuristic (no spaCy/nltk models are available offline); two entities are
related when they share a sentence. Cheap enough to run on every chunk."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Iterator, Optional, Sequence

from ..parsing.text import STOP_WORDS, split_sentences
from .extraction import DEFAULT_ENTITY_TYPE, DESCRIPTION_CHARS, Entity, Extraction, Relation, normalize_entity_name

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


