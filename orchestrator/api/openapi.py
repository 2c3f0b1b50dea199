"""The HTTP endpoints' OpenAPI 3.0 description, served at GET /api/v1/openapi.json.

Generated, never written by hand: the JSON API's bodies are the protobuf messages in protobuf's JSON mapping, so
their schemas come from the messages' descriptors (a field added to the .proto appears here by itself); the
OpenAI-compatible endpoint's from the parameters openai_http accepts. Clients generate code from it, and the
fuzzing benchmark (thinkserve_bench.fuzzing) generates hostile requests from it with Schemathesis.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from . import openai_http
from .http_common import ERROR_TYPES
from .protos import pb

OPENAPI_PATH = "/api/v1/openapi.json"
_INT32 = {FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SFIXED32}
_UINT32 = {FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32}
_INT64 = {FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64,
          FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64}
_FLOATS = {FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE}
COLLECTION_NAME = {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]{0,63}$"}
_ERROR_STATUSES = sorted(ERROR_TYPES)


def _scalar(field: FieldDescriptor, request: bool) -> dict[str, Any]:
    """One value of a scalar field as protobuf's JSON mapping writes it (and, for requests, as ParseDict reads it)."""
    kind = field.type
    if kind in _INT32:
        return {"type": "integer", "format": "int32"}
    if kind in _UINT32:
        return {"type": "integer", "format": "int32", "minimum": 0}
    if kind in _INT64:  # 64-bit integers are strings in the JSON mapping; a request may also send a number
        unsigned = kind in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64)
        text = {"type": "string", "pattern": "^[0-9]+$" if unsigned else "^-?[0-9]+$"}
        number = {"type": "integer", "format": "int64", **({"minimum": 0} if unsigned else {})}
        return {"oneOf": [text, number]} if request else text
    if kind in _FLOATS:  # NaN and the infinities are strings in the mapping
        if request:
            return {"type": "number"}
        return {"oneOf": [{"type": "number"}, {"type": "string", "enum": ["NaN", "Infinity", "-Infinity"]}]}
    if kind == FieldDescriptor.TYPE_BOOL:
        return {"type": "boolean"}
    if kind == FieldDescriptor.TYPE_BYTES:
        return {"type": "string", "format": "byte"}
    if kind == FieldDescriptor.TYPE_ENUM:
        return {"type": "string", "enum": [value.name for value in field.enum_type.values]}
    return {"type": "string"}


def _field(field: FieldDescriptor, request: bool, components: dict) -> dict[str, Any]:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        value = field.message_type.fields_by_name["value"]
        return {"type": "object", "additionalProperties": _value(value, request, components)}
    single = _value(field, request, components)
    if field.is_repeated:
        return {"type": "array", "items": single}
    return single


def _value(field: FieldDescriptor, request: bool, components: dict) -> dict[str, Any]:
    if field.message_type is not None:
        return {"$ref": f"#/components/schemas/{message_schema(field.message_type, request, components)}"}
    return _scalar(field, request)


def message_schema(descriptor: Descriptor, request: bool, components: dict) -> str:
    """Adds the schema of `descriptor` (and of the messages it holds) to `components`; returns its name.
    A request refuses unknown fields (json_format.ParseDict does); a response names the fields always written
    (every field without presence: to_json prints defaults too)."""
    name = f"{descriptor.name}{'' if request else 'Out'}" if descriptor.name in _BOTH_WAYS else descriptor.name
    if name in components:
        return name
    components[name] = {}  # recursion guard
    properties = {field.name: _field(field, request, components) for field in descriptor.fields}
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if request:
        schema["additionalProperties"] = False
    else:
        schema["required"] = sorted(f.name for f in descriptor.fields if not f.has_presence or
                                    f.is_repeated)
    components[name] = schema
    return name


_BOTH_WAYS = {"QueryOptions"}  # messages that appear in requests and in responses (a response echoes the options)


def _json(ref: str) -> dict:
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}}


def _errors(*statuses: int) -> dict:
    return {str(status): {"description": ERROR_TYPES[status], "content": _json("Error")} for status in statuses}


def _operation(summary: str, ok: dict, statuses: tuple[int, ...], **extra) -> dict:
    return {"summary": summary, "responses": {"200": ok, **_errors(*statuses)}, **extra}


def _path_parameter(name: str, schema: dict) -> dict:
    return {"name": name, "in": "path", "required": True, "schema": schema}


def _chat_request(components: dict) -> dict:
    options = message_schema(pb.QueryOptions.DESCRIPTOR, True, components)
    text_part = {"type": "object", "required": ["type", "text"], "additionalProperties": False,
                 "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}}}
    message = {
        "type": "object", "required": ["role", "content"],
        "properties": {
            "role": {"type": "string", "enum": ["system", "developer", "user", "assistant"]},
            "content": {"oneOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": text_part}]},
        },
    }
    return {
        "type": "object", "required": ["model", "messages"], "additionalProperties": False,
        "properties": {
            "model": {"type": "string", "description": "the collection"},
            "messages": {"type": "array", "minItems": 1, "items": message},
            "stream": {"type": "boolean"},
            "max_tokens": {"type": "integer", "minimum": 1},
            "max_completion_tokens": {"type": "integer", "minimum": 1},
            "temperature": {"type": "number", "minimum": 0},
            "top_p": {"type": "number", "minimum": 0, "maximum": 1},
            "seed": {"type": "integer", "minimum": 0},
            "thinkserve": {"$ref": f"#/components/schemas/{options}"},
            **{name: {} for name in sorted(openai_http._INFORMATIONAL)},
        },
    }


def _embeddings_request() -> dict:
    return {
        "type": "object", "required": ["model", "input"], "additionalProperties": False,
        "properties": {
            "model": {"type": "string", "enum": [openai_http.EMBEDDING_MODEL]},
            "input": {"oneOf": [{"type": "string", "minLength": 1},
                                {"type": "array", "minItems": 1, "maxItems": openai_http.MAX_EMBEDDING_INPUTS,
                                 "items": {"type": "string", "minLength": 1}}]},
            "encoding_format": {"type": "string", "enum": ["float", "base64"]},
            "user": {"type": "string"},
        },
    }


def describe(version: str) -> dict:
    """The OpenAPI document of every HTTP route (the console's static files aside)."""
    components: dict[str, Any] = {
        "Error": {
            "type": "object", "required": ["error"],
            "properties": {"error": {"type": "object", "required": ["message", "type", "code"], "properties": {
                "message": {"type": "string", "minLength": 1}, "type": {"type": "string"},
                "param": {"type": "string", "nullable": True},
                "code": {"type": "string"}}}},
        },
    }
    ref = lambda message, request=False: message_schema(message.DESCRIPTOR, request, components)  # noqa: E731
    query_body = {
        "type": "object", "required": ["question"], "additionalProperties": False,
        "properties": {"question": {"type": "string"},
                       "options": {"$ref": f"#/components/schemas/{ref(pb.QueryOptions, True)}"}},
    }
    sse = {"description": "Server-Sent Events: one JSON object per event, then `[DONE]`",
           "content": {"text/event-stream": {"schema": {"type": "string"}}}}
    collection = _path_parameter("collection", {"type": "string"})
    name = _path_parameter("name", {"type": "string"})
    c = "/api/v1/collections/{collection}"
    paths = {
        "/api/v1/health": {"get": _operation("Health", {"description": "serving state", "content": _json(ref(pb.HealthResponse))}, (401, 403))},
        "/api/v1/stats": {"get": _operation("Stats", {"description": "pools, collections, Triton", "content": _json(ref(pb.StatsResponse))}, (401, 403))},
        "/api/v1/collections": {
            "get": _operation("ListCollections", {"description": "collections the token reads",
                                                  "content": _json(ref(pb.ListCollectionsResponse))}, (401, 403)),
            "post": _operation("CreateCollection", {"description": "created", "content": _json(ref(pb.CollectionInfo))},
                               (400, 401, 403, 409), requestBody={"required": True, "content": _json(ref(pb.CreateCollectionRequest, True))}),
        },
        c: {"delete": _operation("DeleteCollection", {"description": "deleted", "content": _json(ref(pb.CollectionInfo))},
                                 (400, 401, 403, 404), parameters=[collection])},
        f"{c}/documents": {"get": _operation("ListDocuments", {"description": "documents",
                                                               "content": _json(ref(pb.ListDocumentsResponse))},
                                             (400, 401, 403, 404), parameters=[collection])},
        f"{c}/documents/{{name}}": {
            "put": _operation("Ingest (the body is the file; the same name replaces)",
                              {"description": "ingest report", "content": _json(ref(pb.IngestReport))},
                              (400, 401, 403, 404, 429, 503, 504), parameters=[collection, name],
                              requestBody={"required": True, "content": {
                                  "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}),
            "get": _operation("GetDocument", {"description": "the document", "content": _json(ref(pb.DocumentInfo))},
                              (400, 401, 403, 404), parameters=[collection, name]),
            "delete": _operation("DeleteDocument", {"description": "deleted", "content": _json(ref(pb.DocumentInfo))},
                                 (400, 401, 403, 404), parameters=[collection, name]),
        },
        f"{c}/ingest": {"get": _operation("GetIngestProgress (the documents being ingested now)",
                                          {"description": "documents in flight", "content": _json(ref(pb.IngestProgressResponse))},
                                          (400, 401, 403), parameters=[collection])},
        f"{c}/query": {"post": _operation("Query", sse, (400, 401, 403, 404, 429, 503, 504), parameters=[collection],
                                          requestBody={"required": True, "content": {"application/json": {"schema": query_body}}})},
        f"{c}/retrieve": {"post": _operation("Retrieve", {"description": "evidence", "content": _json(ref(pb.RetrieveResponse))},
                                             (400, 401, 403, 404, 429, 503, 504), parameters=[collection],
                                             requestBody={"required": True, "content": {"application/json": {"schema": query_body}}})},
        f"{c}/pages/{{document_id}}/{{page}}": {"get": _operation(
            "A page's render (0-based page)", {"description": "the image", "content": {"image/*": {"schema": {"type": "string", "format": "binary"}}}},
            (400, 401, 403, 404), parameters=[collection, _path_parameter("document_id", {"type": "string"}),
                                              _path_parameter("page", {"type": "integer"})])},
        f"{c}/evidence/{{passage_id}}/image": {"get": _operation(
            "A multimodal unit's image", {"description": "the image", "content": {"image/*": {"schema": {"type": "string", "format": "binary"}}}},
            (400, 401, 403, 404), parameters=[collection, _path_parameter("passage_id", {"type": "string"})])},
        "/v1/chat/completions": {"post": _operation(
            "OpenAI-compatible chat completion (the model is the collection)",
            {"description": "a completion, or Server-Sent Events of chunks with `stream`",
             "content": {"application/json": {"schema": {"type": "object"}}, "text/event-stream": {"schema": {"type": "string"}}}},
            (400, 401, 403, 404, 429, 503, 504),
            requestBody={"required": True, "content": {"application/json": {"schema": _chat_request(components)}}})},
        "/v1/embeddings": {"post": _operation(
            "Text embeddings (the vectors retrieval uses)", {"description": "embeddings", "content": {"application/json": {"schema": {"type": "object"}}}},
            (400, 401, 403, 429, 503, 504),
            requestBody={"required": True, "content": {"application/json": {"schema": _embeddings_request()}}})},
        "/v1/models": {"get": _operation("The collections the token reads, as models",
                                         {"description": "models", "content": {"application/json": {"schema": {"type": "object"}}}}, (401, 403))},
        "/healthz": {"get": {"summary": "Liveness (503 while draining)", "responses": {
            "200": {"description": "serving", "content": {"application/json": {"schema": {"type": "object"}}}},
            "503": {"description": "draining", "content": {"application/json": {"schema": {"type": "object"}}}}}}},
        "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {
            "200": {"description": "exposition", "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
        "/metrics/triton": {"get": {"summary": "Triton's own Prometheus metrics, relayed", "responses": {
            "200": {"description": "exposition", "content": {"text/plain": {"schema": {"type": "string"}}}},
            "404": {"description": "an external Triton: not known", "content": {"text/plain": {"schema": {"type": "string"}}}},
            "503": {"description": "Triton's metrics unavailable", "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
        OPENAPI_PATH: {"get": {"summary": "This description", "responses": {
            "200": {"description": "OpenAPI 3.0", "content": {"application/json": {"schema": {"type": "object"}}}}}}},
    }
    return {
        "openapi": "3.0.3",
        "info": {"title": "ThinkServe HTTP API", "version": version,
                 "description": "The JSON API (/api/v1: the gRPC methods, protobuf's JSON mapping) and the "
                                "OpenAI-compatible endpoint (/v1). Errors are OpenAI-shaped."},
        "components": {"schemas": components,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{}, {"bearer": []}],
        "paths": paths,
    }
