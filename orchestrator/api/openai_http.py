"""The HTTP side: an OpenAI-compatible chat endpoint so existing chat front ends can ask a collection, text
embeddings, /metrics (Prometheus) and /healthz.

Mapping (stateless, one question per request):
- `model` is the collection (GET /v1/models lists the collections the token may read); an explicit
  `collection` field wins over it.
- The question is the text of the last `user` message: retrieval reads it alone. The system and developer
  messages and the earlier turns reach the LLM's prompt (after the evidence rules, never instead of them);
  the extractive answerer reads only the question, and the response's `thinkserve.conversation` says so.
- `max_tokens` / `max_completion_tokens`, `temperature`, `top_p` and `seed` map to the query options; every
  other QueryOptions field (route, rerank, graph, page_images, answerer, ...) goes in a `thinkserve` object.
  Parameters that cannot be honoured (`n` > 1, `stop`, `logprobs`, tools, a JSON `response_format`,
  penalties, ...) and unknown ones are a 400 naming them in `param`, never ignored.
- The answer's citations, short answer, route, degradation and request id come back in a `thinkserve` object, in the
  response (or the last stream chunk). `stream: true` sends Server-Sent Events, ending with `data: [DONE]`;
  `stream_options.include_usage` adds OpenAI's usage chunk before it.
- POST /v1/embeddings: the text embedder (model `text_embedder`), the one retrieval embeds questions with.
Errors are OpenAI-shaped (`{"error": {"message", "type", "param", "code"}}`: OpenAI's error types, the gRPC code
as `code`) with the HTTP status of the gRPC code; 429 and 503 carry `Retry-After`.
"""

from __future__ import annotations

import base64
import contextlib
import json
import time
from typing import Any, AsyncIterator, Optional

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import InvalidOptionError, InvalidRequestError, ThinkServeError
from ..observability.metrics import CONTENT_TYPE
from ..pipeline.events import AnswerDeltaEvent, FinalAnswerEvent, RouteEvent
from ..pipeline.plan import QueryOptions
from ..prompts import Conversation
from ..pipeline.query import QueryInput
from ..models import contracts
from .gateway import REQUEST_ID_HEADER, Call, Gateway, request_id_from
from .http_common import EventStream, client_timeout, error_response, failed_call, json_body, sse_stream

FINISH_REASONS = {"length": "length"}  # everything else ends as "stop"
MAX_EMBEDDING_INPUTS = 256
EMBEDDING_MODEL = contracts.TEXT_EMBEDDER.name
# Chat parameters accepted when they ask for what is done anyway (the default), refused with a 400 otherwise.
_DEFAULTS_ONLY = {
    "n": (None, 1), "stop": (None, [], ""), "logprobs": (None, False), "top_logprobs": (None, 0),
    "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0), "logit_bias": (None, {}),
    "tools": (None, []), "functions": (None, []), "tool_choice": (None, "none"), "function_call": (None, "none"),
    "store": (None, False), "modalities": (None, ["text"]), "audio": (None,), "prediction": (None,),
    "web_search_options": (None,),
}
_WHY_NOT = {
    "n": "one answer is generated per request", "stop": "stop sequences are not supported",
    "logprobs": "log-probabilities are served by the gRPC Query stream only",
    "top_logprobs": "log-probabilities are served by the gRPC Query stream only",
    "tools": "tool calls are not supported", "functions": "function calls are not supported",
    "tool_choice": "tool calls are not supported", "function_call": "function calls are not supported",
    "store": "completions are not stored", "modalities": "only text is generated",
}
_INFORMATIONAL = {"user", "metadata", "service_tier", "parallel_tool_calls", "reasoning_effort", "safety_identifier",
                  "prompt_cache_key"}  # accepted and not acted on: they change nothing a client can observe
_CHAT_FIELDS = {"model", "collection", "messages", "stream", "stream_options", "thinkserve", "max_tokens",
                "max_completion_tokens", "temperature", "top_p", "seed", "response_format"}


class ParameterError(InvalidRequestError):
    """A 400 that names the request field at fault (OpenAI's `param`)."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


def openai_routes(gateway: Gateway, collections, triton_metrics_url: str = "") -> list[Route]:
    """`collections`: () -> the names of every collection (the gateway scopes them to the token);
    `triton_metrics_url`: Triton's own Prometheus endpoint (loopback only), relayed at /metrics/triton."""

    async def chat_completions(request: Request) -> Response:
        request_id = request_id_from(request.headers.get(REQUEST_ID_HEADER, ""))
        try:
            body = await json_body(request)
            timeout = client_timeout(request)
            opened = gateway.call("ChatCompletions", request.headers.get("authorization", ""), request_id, timeout, request.headers)
            call = await opened.__aenter__()
        except ThinkServeError as error:
            return error_response(error, request_id)
        try:
            query, stream, include_usage = _query(body)
            events = gateway.query(call, query)
            if stream:
                first = await _first_event(events)  # errors before any output are still proper HTTP errors
                return EventStream(sse_stream(opened, request_id, _chunks(call, first, events, query, include_usage)), request_id)
            response = await _completion(call, events, query)
        except BaseException as error:
            return await failed_call(opened, error, request_id)
        await opened.__aexit__(None, None, None)
        return JSONResponse(response, headers={REQUEST_ID_HEADER: request_id})

    async def embeddings(request: Request) -> Response:
        request_id = request_id_from(request.headers.get(REQUEST_ID_HEADER, ""))
        try:
            body = await json_body(request)
            texts, encoding = _embedding_request(body)
            async with gateway.call("Embeddings", request.headers.get("authorization", ""), request_id, client_timeout(request),
                                    request.headers) as call:
                vectors, tokens = await gateway.embed(call, texts)
        except ThinkServeError as error:
            return error_response(error, request_id)
        except Exception:  # logged with the request id by gateway.call
            return error_response(None, request_id)
        data = [
            {"object": "embedding", "index": i,
             "embedding": base64.b64encode(vector.astype("<f4").tobytes()).decode() if encoding == "base64" else vector.tolist()}
            for i, vector in enumerate(vectors)
        ]
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return JSONResponse({"object": "list", "data": data, "model": EMBEDDING_MODEL, "usage": usage},
                            headers={REQUEST_ID_HEADER: request_id})

    async def models(request: Request) -> Response:
        request_id = request_id_from(request.headers.get(REQUEST_ID_HEADER, ""))
        try:
            async with gateway.call("ListModels", request.headers.get("authorization", ""), request_id, None) as call:
                names = call.principal.visible(collections())
        except ThinkServeError as error:
            return error_response(error, request_id)
        data = [{"id": name, "object": "model", "created": 0, "owned_by": "thinkserve"} for name in names]
        return JSONResponse({"object": "list", "data": data}, headers={REQUEST_ID_HEADER: request_id})

    async def metrics(request: Request) -> Response:
        return Response(gateway.metrics.exposition(), media_type=CONTENT_TYPE)

    async def triton_metrics(request: Request) -> Response:
        """Triton's metrics (queue and compute time, batch executions per model) through our port, since
        Triton itself never listens beyond loopback."""
        if not triton_metrics_url:
            return Response("Triton's metrics endpoint is not known (an external triton.url)\n", status_code=404)
        try:
            async with httpx.AsyncClient(timeout=5.0) as client:
                upstream = await client.get(triton_metrics_url)
        except httpx.HTTPError as error:
            return Response(f"Triton's metrics are unavailable: {error}\n", status_code=503)
        return Response(upstream.content, status_code=upstream.status_code, media_type=CONTENT_TYPE)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"draining": gateway.draining}, status_code=503 if gateway.draining else 200)

    return [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/metrics/triton", triton_metrics, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
    ]


# ---------------------------------------------------------------------- request


def _query(body: dict) -> tuple[QueryInput, bool, bool]:
    """(the query, stream, include_usage) of a chat completion request; a 400 naming the field otherwise."""
    _check_parameters(body)
    collection = body.get("collection") or body.get("model")
    if not isinstance(collection, str) or not collection:
        raise ParameterError("model", "name the collection in `model` (or `collection`); GET /v1/models lists them")
    question, conversation = _conversation(body.get("messages"))
    options: dict[str, Any] = {}
    param = {}  # option -> the request field it came from (OpenAI's `param` of an error)
    extra = body.get("thinkserve") or {}
    if not isinstance(extra, dict):
        raise ParameterError("thinkserve", "`thinkserve` must be an object of query options")
    options.update(extra)
    param.update((name, f"thinkserve.{name}") for name in extra)
    for source, target in (("max_completion_tokens", "max_tokens"), ("max_tokens", "max_tokens"),
                           ("temperature", "temperature"), ("top_p", "top_p"), ("seed", "seed")):
        if body.get(source) is not None:
            options[target], param[target] = body[source], source
    try:
        parsed = QueryOptions.parse(options)
    except InvalidOptionError as error:
        raise ParameterError(param.get(error.param, error.param), str(error)) from None
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ParameterError("stream", "`stream` must be true or false")
    stream_options = body.get("stream_options")
    if stream_options is not None and (not stream or not isinstance(stream_options, dict)
                                       or set(stream_options) - {"include_usage", "include_obfuscation"}):
        raise ParameterError("stream_options", "`stream_options` is an object ({\"include_usage\": true}) and needs `stream: true`")
    include_usage = bool((stream_options or {}).get("include_usage", False))
    return QueryInput(collection, question, parsed, conversation), stream, include_usage


def _check_parameters(body: dict) -> None:
    """Every field is one this endpoint honours, or one asking for what it does anyway."""
    for name, value in body.items():
        if name in _CHAT_FIELDS or name in _INFORMATIONAL:
            continue
        if name not in _DEFAULTS_ONLY:
            raise ParameterError(name, f"Unrecognized request argument supplied: {name}")
        if value not in _DEFAULTS_ONLY[name]:
            raise ParameterError(name, f"`{name}` = {json.dumps(value)[:80]} is not supported: "
                                       f"{_WHY_NOT.get(name, 'only its default is')}")
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        raise ParameterError("response_format", "only {\"type\": \"text\"} is supported: answers are cited prose")


def _embedding_request(body: dict) -> tuple[list[str], str]:
    """(texts, encoding format) of an embeddings request; a 400 naming the field otherwise."""
    for name in body:
        if name not in {"input", "model", "encoding_format", "dimensions", "user"}:
            raise ParameterError(name, f"Unrecognized request argument supplied: {name}")
    if body.get("model") != EMBEDDING_MODEL:
        raise ParameterError("model", f"the embedding model is {EMBEDDING_MODEL!r}, not {body.get('model')!r}")
    texts = body.get("input")
    texts = [texts] if isinstance(texts, str) else texts
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
        raise ParameterError("input", "`input` is a non-empty string or a list of them (token arrays are not accepted)")
    if len(texts) > MAX_EMBEDDING_INPUTS:
        raise ParameterError("input", f"{len(texts)} inputs; at most {MAX_EMBEDDING_INPUTS} per request")
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise ParameterError("encoding_format", "`encoding_format` is float or base64")
    if body.get("dimensions") is not None:
        raise ParameterError("dimensions", "the embedder's dimension is fixed: leave `dimensions` out")
    return texts, encoding


def _conversation(messages: Any) -> tuple[str, Conversation]:
    """The question (the last message, a user's) and what came before it: system and developer messages
    joined, user and assistant turns in order."""
    if not isinstance(messages, list) or not messages:
        raise ParameterError("messages", "`messages` must be a non-empty list")
    system, turns = [], []
    for number, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("system", "developer", "user", "assistant"):
            raise ParameterError(f"messages[{number}].role", f"role {role!r} is not supported (system, developer, user, assistant)")
        text = _text(message.get("content"), number)
        if role in ("system", "developer"):
            system.append(text)
        else:
            turns.append((role, text))
    if not turns or turns[-1][0] != "user":
        raise ParameterError("messages", "the last message must be the user's question")
    return turns[-1][1], Conversation("\n\n".join(system), tuple(turns[:-1]))


def _text(content: Any, number: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:  # content parts: text only
        if all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            return "\n".join(p["text"] for p in content)
        raise ParameterError(f"messages[{number}].content",
                             "only text content parts are supported (ingest images and PDFs into the collection)")
    raise ParameterError(f"messages[{number}].content", "a message's content must be text")


# ---------------------------------------------------------------------- response


async def _first_event(events: AsyncIterator):
    try:
        return await events.__anext__()
    except StopAsyncIteration:
        return None


async def _completion(call: Call, events: AsyncIterator, query: QueryInput) -> dict:
    route, final = "", None
    async for event in events:
        if isinstance(event, RouteEvent):
            route = event.decision.label
        elif isinstance(event, FinalAnswerEvent):
            final = event
    message = {"role": "assistant", "content": final.text}
    return {
        "id": f"chatcmpl-{call.request_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": query.collection,
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": FINISH_REASONS.get(final.finish_reason, "stop")}],
        "usage": _usage(final),
        "thinkserve": _extension(call, route, final, query),
    }


async def _chunks(call: Call, first, events: AsyncIterator, query: QueryInput, include_usage: bool) -> AsyncIterator[dict]:
    """Chunks as the answer streams. The final answer of record can differ from the streamed text (an LLM
    replaced by the extractive fallback mid-stream): the last chunk's `thinkserve.text` then holds it. With
    include_usage every chunk has `usage: null` and one more chunk, with no choices, carries the usage."""
    base = {"id": f"chatcmpl-{call.request_id}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": query.collection}

    def chunk(delta: dict, finish: Optional[str] = None, **extra) -> dict:
        body = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}], **extra}
        if include_usage:
            body.setdefault("usage", None)
        return body

    route = ""
    async with contextlib.aclosing(events):  # closed, not left to the collector (QueryPipeline.run says why)
        yield chunk({"role": "assistant", "content": ""})
        event = first
        while event is not None:
            if isinstance(event, RouteEvent):
                route = event.decision.label
            elif isinstance(event, AnswerDeltaEvent) and event.text:
                yield chunk({"content": event.text})
            elif isinstance(event, FinalAnswerEvent):
                finish = FINISH_REASONS.get(event.finish_reason, "stop")
                yield chunk({}, finish, thinkserve=_extension(call, route, event, query))
                if include_usage:
                    yield {**base, "choices": [], "usage": _usage(event)}
            event = await _first_event(events)


def _usage(final: FinalAnswerEvent) -> dict:
    prompt, completion = final.usage.prompt_tokens, final.usage.completion_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _extension(call: Call, route: str, final: FinalAnswerEvent, query: QueryInput) -> dict:
    extension = {
        "request_id": call.request_id,
        "text": final.text,
        "route": route,
        "answer_source": final.answer_source,
        "degraded": final.degraded,
        "degraded_reason": final.degraded_reason,
        "retrieval_mode": final.retrieval_mode,
        "citations": [
            {
                "evidence_rank": c.evidence_rank, "passage_id": c.passage_id, "document_name": c.document_name, "page": c.page,
                "regions": [{"page": s.page, "bbox": list(s.bbox)} for s in c.regions if s.page >= 0 and any(s.bbox)],
                "quote": c.quote,
            }
            for c in final.citations
        ],
        "timings_ms": final.timings_ms,
    }
    if final.short_answer is not None:  # the value asked for, with the quote (citation index) and span that hold it
        short = final.short_answer
        extension["short_answer"] = {"text": short.text, "answer_type": short.answer_type, "citation": short.citation,
                                     "start": short.start, "end": short.end}
    if query.conversation.system or query.conversation.turns:
        extension["conversation"] = (
            "read by the answering model" if final.answer_source in ("llm", "vlm")
            else f"not read: the {final.answer_source} answer comes from the last user message alone"
        )
    return extension
