"""Hypothesis strategies for any protobuf message, built from its descriptor: every field of the .proto (a field
added later is fuzzed without a change here), scalars at and past their edges, unknown enum numbers, nested
messages, repeated fields and maps. Field names that matter to the server (collection, question, filename, ...)
also get values that reach past validation, so the generated requests exercise more than the first check.
"""

from __future__ import annotations

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st

from orchestrator.pipeline.plan import OPTION_CHOICES

_INT32 = (-(2**31), 2**31 - 1)
_UINT32 = (0, 2**32 - 1)
_INT64 = (-(2**63), 2**63 - 1)
_UINT64 = (0, 2**64 - 1)
_RANGES = {
    FieldDescriptor.TYPE_INT32: _INT32, FieldDescriptor.TYPE_SINT32: _INT32, FieldDescriptor.TYPE_SFIXED32: _INT32,
    FieldDescriptor.TYPE_UINT32: _UINT32, FieldDescriptor.TYPE_FIXED32: _UINT32,
    FieldDescriptor.TYPE_INT64: _INT64, FieldDescriptor.TYPE_SINT64: _INT64, FieldDescriptor.TYPE_SFIXED64: _INT64,
    FieldDescriptor.TYPE_UINT64: _UINT64, FieldDescriptor.TYPE_FIXED64: _UINT64,
}
# protobuf strings are UTF-8: lone surrogates cannot be serialised (the client would refuse them, not the server)
TEXT = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=120)
HOSTILE_TEXT = st.sampled_from([
    "", " ", "\x00", "../../etc/passwd", "/etc/passwd", "a/../../b", "C:\\Windows\\win.ini", "%00", "\u202e\u0645",
    "🙂" * 50, "x" * 5000, "\n" * 200, "SELECT * FROM documents; --", "{{7*7}}", "<script>alert(1)</script>",
    "NaN", "-1", "9" * 40, "\ufeff", "simple ", "SIMPLE",
])
# values that pass the first checks, so generated requests get further into the server
HINTS: dict[str, list] = {
    "collection": ["fuzz", "fuzz-ingest", "a" * 64, "a" * 65, "-x", "Fuzz"],
    "name": ["fuzz.md", "fuzz", "missing.md"],
    "filename": ["a.md", "b.txt", "c.pdf", "d.png", "e.zip", "f.jpg", "noext"],
    "media_type": ["application/pdf", "application/zip", "text/markdown", "text/plain", "image/png", "image/jpeg"],
    "question": ["How many robots did Acme sell?", "Who bought robots?"],
    "route": ["simple", "moderate", "complex"],
    "router": ["features", "model", "fixed"],
    "perception": ["dpr", "end_to_end", "off"],
    "answerer": ["extractive", "llm", "hybrid", "LLM"],
    "server_path": ["/etc/passwd", "samples/northwind-2024-annual-report.md", "."],
}


# values a server accepts, so that plausible requests (`requests`) get past validation into the work behind it
PLAUSIBLE: dict[str, list] = {
    "top_k": [1, 3, 5], "max_tokens": [4, 16], "temperature": [0.0, 0.7], "top_p": [0.5, 1.0], "seed": [0, 7],
    "chunk_top_k": [5, 10], "entity_top_k": [5, 20], "graph_hops": [0, 1, 2], "page_top_m": [5, 20], "page_top_k": [1, 3],
    "collection": ["fuzz", "fuzz-ingest"], "name": ["fuzz.md", "missing.md"], "question": HINTS["question"],
    "filename": ["a.md", "b.txt"], "media_type": ["text/markdown", "text/plain", ""],
    "lexical": [False],  # lexical mode refuses every option that calls a model; the hostile half sends it
    **{option: list(choices) for option, choices in OPTION_CHOICES.items()},  # route, router, perception, answerer
}


def plausible_scalar(field: FieldDescriptor) -> st.SearchStrategy:
    """A value the server is likely to accept: known good ones by field name, small numbers, known enum values."""
    if field.name in PLAUSIBLE:
        return st.sampled_from(PLAUSIBLE[field.name])
    if field.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if field.type == FieldDescriptor.TYPE_ENUM:
        return st.sampled_from([value.number for value in field.enum_type.values])
    if field.type in _RANGES:
        return st.integers(0, 10)
    if field.type in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        return st.floats(0.0, 1.0)
    return scalar(field)


def scalar(field: FieldDescriptor) -> st.SearchStrategy:
    kind = field.type
    if kind in _RANGES:
        low, high = _RANGES[kind]
        edges = sorted({low, high, 0, 1, -1 if low < 0 else 2, 2**31 - 1 if high > 2**31 else high, 10**6})
        values = st.one_of(st.sampled_from([e for e in edges if low <= e <= high]), st.integers(low, high),
                           st.integers(-3, 300))
        return values.filter(lambda v: low <= v <= high)
    if kind == FieldDescriptor.TYPE_FLOAT:
        return st.floats(width=32)
    if kind == FieldDescriptor.TYPE_DOUBLE:
        return st.floats()
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=2048)
    if kind == FieldDescriptor.TYPE_ENUM:
        known = [value.number for value in field.enum_type.values]
        return st.one_of(st.sampled_from(known), st.integers(-5, 1000))  # open enums keep unknown numbers
    strings = st.one_of(TEXT, HOSTILE_TEXT)
    if field.name in HINTS:
        strings = st.one_of(st.sampled_from(HINTS[field.name]), strings)
    return strings


def _single(field: FieldDescriptor, depth: int, plausible: bool) -> st.SearchStrategy:
    if field.message_type is not None:
        return messages(field.message_type, depth + 1, plausible=plausible)
    return plausible_scalar(field) if plausible else scalar(field)


def requests(descriptor: Descriptor) -> st.SearchStrategy[Message]:
    """Half anything the descriptor allows, half plausible: a fuzzer whose every request fails the first check
    never reaches the work behind it."""
    return st.one_of(messages(descriptor), messages(descriptor, plausible=True))


def messages(descriptor: Descriptor, depth: int = 0, max_depth: int = 3, plausible: bool = False) -> st.SearchStrategy[Message]:
    """Messages of `descriptor`'s type with any subset of their fields set (nested ones up to max_depth);
    `plausible`: every value one the server is likely to accept (plausible_scalar)."""
    cls = GetMessageClass(descriptor)
    if depth > max_depth:
        return st.just(cls())
    optional: dict[str, st.SearchStrategy] = {}
    for field in descriptor.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key = scalar(field.message_type.fields_by_name["key"])
            value = _single(field.message_type.fields_by_name["value"], depth, plausible)
            optional[field.name] = st.dictionaries(key, value, max_size=4)
        elif field.is_repeated:
            optional[field.name] = st.lists(_single(field, depth, plausible), max_size=5)
        else:
            optional[field.name] = _single(field, depth, plausible)
    return st.fixed_dictionaries({}, optional=optional).map(lambda values: _build(cls, values))


def _build(cls, values: dict) -> Message:
    message = cls()
    for name, value in values.items():
        field = message.DESCRIPTOR.fields_by_name[name]
        target = getattr(message, name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            for key, item in value.items():
                if isinstance(item, Message):
                    target[key].CopyFrom(item)
                else:
                    target[key] = item
        elif field.is_repeated:
            if field.message_type is not None:
                for item in value:
                    target.add().CopyFrom(item)
            else:
                target.extend(value)
        elif field.message_type is not None:
            target.CopyFrom(value)
        else:
            setattr(message, name, value)
    return message


def ingest_streams(header: Descriptor, request: Descriptor) -> st.SearchStrategy[list[Message]]:
    """What a client may stream to Ingest: a header then chunks, no header, two headers, chunks before it, a
    server path with chunks after it, or any generated sequence."""
    cls = GetMessageClass(request)
    headers = requests(header)
    chunks = st.lists(st.binary(min_size=0, max_size=4096), max_size=4)

    def ordered(h, parts, shape):
        first = [cls(header=h)]
        rest = [cls(chunk=p) for p in parts]
        return {"header-first": first + rest, "no-header": rest, "two-headers": first + first + rest,
                "chunks-first": rest + first, "empty": []}[shape]

    shaped = st.builds(ordered, headers, chunks, st.sampled_from(["header-first", "header-first", "no-header",
                                                                  "two-headers", "chunks-first", "empty"]))
    return st.one_of(shaped, st.lists(messages(request), max_size=5))
