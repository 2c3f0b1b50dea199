"""What a question asks for, and where a sentence holds a value of that kind.

The extractive answer reads the question's expected answer type (a number, an amount of money, a percentage, a
date, a person, an organisation, a place, or yes/no) from its wording, and gives as its short answer the value
of that type closest to the question's words in the best chosen sentence that holds one. Patterns, not a model: they cover the forms reports and papers write values in (digits with
units and scales, currency signs, month names, quarters and fiscal years, capitalised names) and say nothing
where the question asks for something else ("other": no type preferred, no short answer).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from ..knowledge.parsing.text import lexical_terms

ANSWER_TYPES = ("number", "money", "percentage", "date", "person", "organisation", "place", "yes_no", "other")

_SCALE = r"(?:\s*(?:thousand|million|billion|trillion|bn|mn|m|k)\b)?"
_AMOUNT = r"\d[\d,]*(?:\.\d+)?"
_MONTH = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|Sep(?:t(?:ember)?)?|"
          r"Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)")
_CAPITALISED = r"[A-Z][\w&'.-]*"
# one way to split any run of spaces (a "\s+ word? \s*" form backtracked exponentially on long capitalised tables)
_NAME = rf"{_CAPITALISED}(?:\s+(?:(?:of|and|&|de|du|van|von|the)\s+)?{_CAPITALISED})*"
_ORGANISATION_WORDS = (r"(?:Inc|Corp|Corporation|Company|Co|Ltd|LLC|Plc|PLC|Group|Holdings|University|Institute|"
                       r"Association|Bank|Foundation|Agency|Department|Ministry|Council|Commission|Center|Centre|"
                       r"Committee|Organization|Organisation|Society|Board|Party)\b\.?")
_NUMBER_WORDS = (r"\b(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|"
                 r"sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety|"
                 r"hundred|dozen)\b")

VALUE_PATTERNS: dict[str, re.Pattern] = {
    "percentage": re.compile(rf"[-+]?{_AMOUNT}\s*(?:%|percent\b|per cent\b|pct\b|percentage points?\b)", re.I),
    "money": re.compile(
        rf"(?:US\$|[$€£¥]|\b(?:USD|EUR|GBP|JPY|RMB|CNY)\s?)\s*{_AMOUNT}{_SCALE}"
        rf"|\b{_AMOUNT}{_SCALE}\s*(?:dollars|euros|pounds|yen|yuan|USD|EUR|GBP)\b", re.I),
    "date": re.compile(
        rf"\b{_MONTH}\.?\s+\d{{1,2}}(?:st|nd|rd|th)?,?\s+\d{{4}}\b|\b\d{{1,2}}\s+{_MONTH}\.?,?\s+\d{{4}}\b"
        rf"|\b{_MONTH}\.?,?\s+\d{{4}}\b|\b\d{{1,2}}/\d{{1,2}}/\d{{2,4}}\b|\b\d{{4}}-\d{{2}}-\d{{2}}\b"
        r"|\b(?:Q[1-4]|H[12])\s*(?:FY)?\s*'?\d{2,4}\b|\bFY\s*'?\d{2,4}\b|\b(?:1[6-9]|20)\d{2}s?\b"),
    "number": re.compile(rf"(?<![\w.]){_AMOUNT}{_SCALE}|{_NUMBER_WORDS}", re.I),
    "organisation": re.compile(rf"\b{_NAME}\s+{_ORGANISATION_WORDS}|\b[A-Z]{{2,6}}\b"),
    "person": re.compile(rf"\b(?:Mr|Mrs|Ms|Dr|Prof|Sir|President|CEO)\.?\s+{_NAME}|\b[A-Z][a-z]+(?:\s+[A-Z]\.)?\s+[A-Z][a-z]+\b"),
    "place": re.compile(rf"\b(?:in|at|from|to|across|near|of)\s+(?:the\s+)?({_NAME})"),
}

# Question openings, most specific first: (pattern over the casefolded question, expected type)
_FINANCIAL = (r"(?:liabilities|debt|equity|goodwill|cash(?: and cash equivalents)?|earnings per (?:ordinary )?share|"
              r"ebitda|assets|income|revenues?|sales|expenses?|capital expenditures?|dividends?)")
_QUESTION_TYPES: tuple[tuple[re.Pattern, str], ...] = tuple((re.compile(p), t) for p, t in (
    (r"\banswer in percentage\b|\bin percentage terms\b|\bpercent(?:age)? (?:change|point)", "percentage"),
    (r"\b(?:what|which) (?:is the |was the )?(?:percentage|percent|share|proportion|fraction)\b", "percentage"),
    # a figure to compute or read off: ratios and rates, rounded answers, pages
    (r"\bratio\b|\breturn on\b|\b(?:tax|growth|interest) rate\b|\bround (?:your|the) answer\b|\bdecimal places?\b"
     r"|\banswer in (?:millions|thousands|billions)\b|\bgive me an integer\b|\b(?:what|which) page\b", "number"),
    (r"\bhow much (?:percent|of a (?:share|percentage))|\bby what percent|\bwhat % ", "percentage"),
    (r"\bhow much\b.*\b(?:revenue|cost|price|pay|paid|spend|spent|earn|earned|income|profit|sales|fund|budget|"
     r"worth|dollars?|euros?|money|invest|salary|fee|debt|cash)\b", "money"),
    (r"\b(?:what|which) (?:was |is |were |are )?the (?:total )?(?:amount|revenue|cost|price|income|profit|net income|"
     r"sales|budget|value|spending)\b", "money"),
    (rf"\bwhat (?:is|was|are|were) (?:the )?(?:[\w.&-]+'s )?(?:fy ?'?\d{{2,4}} )?(?:(?:total|net|basic|diluted|long-term|"
     rf"current|gross|operating) )*{_FINANCIAL}\b", "money"),
    (r"\bhow (?:many|much|long|old|far|big|large|tall|often)\b", "number"),
    (r"\bwhat (?:is|was|are|were) the (?:number|total number|count|size|height|length|weight|age|score)\b", "number"),
    (r"^when\b|\bwhat (?:year|date|day|month|time)\b|\bwhich (?:year|date|day|month)\b|\bin what year\b", "date"),
    (r"^(?:who|whom|whose)\b|\bwhich (?:person|people|author|ceo|president|manager|director)\b", "person"),
    (r"\b(?:which|what) (?:company|companies|organi[sz]ation|agency|firm|bank|university|institution|brand)\b", "organisation"),
    (r"^where\b|\b(?:which|what) (?:country|countries|city|cities|state|region|continent|province|place|location)\b", "place"),
    (r"^(?:is|are|was|were|do|does|did|can|could|has|have|had|will|would|should|shall|may|must)\b", "yes_no"),
))
_NEGATIONS = frozenset({"not", "no", "never", "none", "neither", "nor", "without", "cannot"})


def expected_type(question: str) -> str:
    """The kind of value `question` asks for, one of ANSWER_TYPES ("other" where its wording says nothing)."""
    text = " ".join(question.casefold().split())
    for pattern, answer_type in _QUESTION_TYPES:
        if pattern.search(text):
            return answer_type
    return "other"


@dataclass(frozen=True)
class Value:
    text: str
    start: int  # character offsets in the sentence
    end: int


def values(sentence: str, answer_type: str) -> list[Value]:
    """The values of `answer_type` in `sentence`, in order (none for yes/no and other)."""
    pattern = VALUE_PATTERNS.get(answer_type)
    if pattern is None:
        return []
    found = []
    for match in pattern.finditer(sentence):
        group = match.lastindex if answer_type == "place" and match.lastindex else 0
        start, end = match.span(group)
        text = sentence[start:end].strip(" ,.;:")
        if text:
            start = sentence.index(text, start)
            found.append(Value(text, start, start + len(text)))
    if answer_type == "number":  # a year is a date, not an answer to "how many"
        found = [v for v in found if not re.fullmatch(r"(?:1[6-9]|20)\d{2}", v.text)] or found
    if answer_type == "money" and not found:  # statements' tables give amounts without a currency sign
        found = [v for v in values(sentence, "number") if any(c.isdigit() for c in v.text)
                 and not re.fullmatch(r"(?:1[6-9]|20)\d{2}", v.text)]
    return found


def question_numbers(question: str) -> frozenset[str]:
    """The numbers the question names (years, figures), as the lexical terms read them."""
    return frozenset(term for term in lexical_terms(question) if any(c.isdigit() for c in term))


def short_value(sentence: str, answer_type: str, question_terms: frozenset[str]) -> Optional[Value]:
    """The value of `answer_type` in `sentence` closest to the question's words there (the first when none occur),
    a value that merely repeats a number of the question left out; None when the sentence holds none."""
    found = values(sentence, answer_type)
    if not found:
        return None
    asked = {term for term in question_terms if any(c.isdigit() for c in term)}
    found = [v for v in found if not set(lexical_terms(v.text)) <= asked] or found
    positions = [m.start() for term in question_terms if not any(c.isdigit() for c in term)
                 for m in re.finditer(rf"\b{re.escape(term)}", sentence, re.I)]
    if not positions:
        return found[0]
    return min(found, key=lambda v: (min(abs(v.start - p) for p in positions), v.start))


def polarity(sentence: str, question_terms: frozenset[str], coverage: float, plain_at: float = 0.6) -> Optional[str]:
    """"yes" or "no" where the sentence states the question's matter plainly (at least `plain_at` of the question's
    weighted words in it: `coverage`), "no" when it negates it; None otherwise."""
    if coverage < plain_at:
        return None
    words = set(lexical_terms(sentence)) | {w for w in re.findall(r"[a-z]+", sentence.casefold()) if w in _NEGATIONS}
    negated = bool(words & _NEGATIONS) or "n't" in sentence.casefold()
    return "no" if negated else "yes"

