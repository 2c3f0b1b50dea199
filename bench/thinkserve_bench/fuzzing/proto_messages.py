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
    "answerer": ["extractive", "llm"],
    "server_path": ["/etc/passwd", "samples/northwind-2024-annual-report.md", "."],
}


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


def _single(field: FieldDescriptor, depth: int) -> st.SearchStrategy:
    if field.message_type is not None:
        return messages(field.message_type, depth + 1)
    return scalar(field)


def messages(descriptor: Descriptor, depth: int = 0, max_depth: int = 3) -> st.SearchStrategy[Message]:
    """Messages of `descriptor`'s type with any subset of their fields set (nested ones up to max_depth)."""
    cls = GetMessageClass(descriptor)
    if depth > max_depth:
        return st.just(cls())
    optional: dict[str, st.SearchStrategy] = {}
    for field in descriptor.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key = scalar(field.message_type.fields_by_name["key"])
            value = _single(field.message_type.fields_by_name["value"], depth)
            optional[field.name] = st.dictionaries(key, value, max_size=4)
        elif field.is_repeated:
            optional[field.name] = st.lists(_single(field, depth), max_size=5)
        else:
            optional[field.name] = _single(field, depth)
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
    headers = messages(header)
    chunks = st.lists(st.binary(min_size=0, max_size=4096), max_size=4)

    def ordered(h, parts, shape):
        first = [cls(header=h)]
        rest = [cls(chunk=p) for p in parts]
        return {"header-first": first + rest, "no-header": rest, "two-headers": first + first + rest,
                "chunks-first": rest + first, "empty": []}[shape]

    shaped = st.builds(ordered, headers, chunks, st.sampled_from(["header-first", "header-first", "no-header",
                                                                  "two-headers", "chunks-first", "empty"]))
    return st.one_of(shaped, st.lists(messages(request), max_size=5))
