"""The OpenAPI description covers every HTTP route the server mounts, and its request schemas are the messages'
(a field added to the .proto, or a route added to the app, without the description fails here)."""

import re

import jsonschema
import pytest

from orchestrator.api.openai_http import openai_routes
from orchestrator.api.openapi import OPENAPI_PATH, describe
from orchestrator.api.protos import pb
from orchestrator.api.rest_http import from_json, rest_routes
from orchestrator.errors import InvalidRequestError


def _mounted() -> set[tuple[str, str]]:
    routes = [*openai_routes(None, lambda: []), *rest_routes(None, None, console=False)]
    found = set()
    for route in routes:
        path = re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)
        found |= {(method.lower(), path) for method in route.methods if method != "HEAD"}
    return found


def test_every_mounted_route_is_described_and_nothing_else():
    document = describe("test")
    described = {(method, path) for path, operations in document["paths"].items() for method in operations}
    assert described == _mounted()
    assert (("get", OPENAPI_PATH)) in described


def _resolved(document: dict, schema: dict) -> dict:
    """The schema with its $refs pointing into the document (jsonschema resolves them from there)."""
    return {**schema, "components": document["components"]}


def test_query_options_schema_has_every_field_and_refuses_unknown_ones():
    document = describe("test")
    options = document["components"]["schemas"]["QueryOptions"]
    assert set(options["properties"]) == set(pb.QueryOptions.DESCRIPTOR.fields_by_name)
    assert options["properties"]["seed"]["oneOf"][0]["pattern"] == "^[0-9]+$"  # uint64: a string in the JSON mapping
    body = {"question": "q", "options": {"top_k": 3, "seed": "18446744073709551615", "route": "simple", "sparse": False}}
    schema = document["paths"]["/api/v1/collections/{collection}/retrieve"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    jsonschema.validate(body, _resolved(document, schema))
    from_json({**body, "collection": "c"}, pb.QueryRequest())  # what the schema allows, the server parses
    bad = {"question": "q", "options": {"top_kk": 3}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, _resolved(document, schema))
    with pytest.raises(InvalidRequestError):
        from_json({**bad, "collection": "c"}, pb.QueryRequest())


def test_response_schemas_accept_what_the_server_writes():
    from orchestrator.api.rest_http import to_json

    document = describe("test")
    info = pb.CollectionInfo(name="c", documents=2, bytes=2**40)
    schema = {"$ref": "#/components/schemas/CollectionInfo"}
    jsonschema.validate(to_json(info), _resolved(document, schema))
    stats = pb.StatsResponse(pools=[pb.AdmissionPool(pool="queries", rejected={"queue_full": 3})],
                             models=[pb.ModelStats(name="m", batch_executions={4: 2}, queue_ms=float("nan"))])
    jsonschema.validate(to_json(stats), _resolved(document, {"$ref": "#/components/schemas/StatsResponse"}))
