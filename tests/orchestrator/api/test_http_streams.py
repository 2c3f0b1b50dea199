"""Server-Sent Events as both HTTP endpoints stream them: a failure after the first event is one more event in
OpenAI's error shape before `[DONE]`, and the gateway call ends with that failure (so it is logged and counted)."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

from orchestrator.api.http_common import sse_stream
from orchestrator.errors import DeadlineExceededError


class Opened:
    """Records how the gateway call ended (what sse_stream hands to __aexit__)."""

    def __init__(self):
        self.ended_with = "not ended"

    async def __aexit__(self, kind, error, traceback):
        self.ended_with = error
        return False


async def read(stream) -> list:
    return [chunk async for chunk in stream]


def bodies_then(failure):
    async def bodies():
        yield {"route": {"label": "simple"}}
        if failure is not None:
            raise failure
        yield {"final": {"text": "7.4 million kroner"}}

    return bodies()


def test_events_then_done_and_the_call_ends_cleanly():
    opened = Opened()
    chunks = asyncio.run(read(sse_stream(opened, "req-1", bodies_then(None))))
    assert [json.loads(c.decode().removeprefix("data: ")) for c in chunks[:-1]] == [
        {"route": {"label": "simple"}}, {"final": {"text": "7.4 million kroner"}}]
    assert chunks[-1] == b"data: [DONE]\n\n" and opened.ended_with is None


@pytest.mark.parametrize("failure, code, message", [
    (DeadlineExceededError("the request's deadline passed"), "DEADLINE_EXCEEDED", "the request's deadline passed"),
    (RuntimeError("bug"), "INTERNAL", "internal error (request id req-2)"),  # no internals leak to the client
])
def test_a_failure_mid_stream_is_an_error_event_before_done(failure, code, message):
    opened = Opened()
    chunks = asyncio.run(read(sse_stream(opened, "req-2", bodies_then(failure))))
    error = json.loads(chunks[1].decode().removeprefix("data: "))["error"]
    assert (error["code"], error["message"]) == (code, message)
    assert chunks[2:] == [b"data: [DONE]\n\n"] and opened.ended_with is failure


def test_a_client_that_goes_away_ends_the_call_with_its_cancellation():
    opened = Opened()

    async def consume_one_then_leave():
        stream = sse_stream(opened, "req-3", bodies_then(None))
        await anext(stream)
        with contextlib.suppress(asyncio.CancelledError):
            await stream.athrow(asyncio.CancelledError())

    asyncio.run(consume_one_then_leave())
    assert isinstance(opened.ended_with, asyncio.CancelledError)
