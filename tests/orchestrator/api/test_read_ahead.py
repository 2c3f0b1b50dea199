"""read_ahead: a query's events produced by a task of their own while the transport writes the previous ones."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from orchestrator.api.read_ahead import read_ahead

REQUEST = contextvars.ContextVar("request", default="none")


async def numbers(count: int, made: list, fail_at: int = -1, cleaned: list = None):
    try:
        for number in range(count):
            if number == fail_at:
                raise ValueError(f"failed at {number}")
            made.append((number, REQUEST.get()))
            yield number
            await asyncio.sleep(0)
    finally:
        if cleaned is not None:
            await asyncio.sleep(0.01)  # a clean-up that awaits (a model call's cancellation)
            cleaned.append(True)


def test_items_come_in_order_and_are_made_while_the_consumer_waits():
    async def consume():
        made, got = [], []
        REQUEST.set("r-1")
        async for number in read_ahead(numbers(5, made)):
            got.append((number, len(made)))
            await asyncio.sleep(0.01)  # a message's write
        return made, got

    made, got = asyncio.run(consume())
    assert [number for number, _ in got] == [0, 1, 2, 3, 4]
    assert got[1][1] == 5  # all five were made while the first was being written
    assert {request for _, request in made} == {"r-1"}  # in the caller's context


def test_a_slow_consumer_holds_the_producer_back_at_the_depth():
    async def consume():
        made = []
        events = read_ahead(numbers(50, made), depth=3)
        first = await events.__anext__()
        await asyncio.sleep(0.05)
        held = len(made)
        await events.aclose()
        return first, held

    first, held = asyncio.run(consume())
    assert first == 0 and held <= 5  # 3 waiting in the queue, one being put, one handed out


def test_a_failure_comes_after_the_items_before_it():
    async def consume():
        got = []
        with pytest.raises(ValueError, match="failed at 3"):
            async for number in read_ahead(numbers(10, [], fail_at=3)):
                got.append(number)
        return got

    assert asyncio.run(consume()) == [0, 1, 2]


def test_a_consumer_that_stops_cancels_the_producer_and_waits_for_its_clean_up():
    async def consume():
        cleaned, made = [], []
        events = read_ahead(numbers(1000, made, cleaned=cleaned), depth=2)
        assert await events.__anext__() == 0
        await events.aclose()  # the client went away
        cleaned_at_close = list(cleaned)
        await asyncio.sleep(0.05)
        return cleaned_at_close, len(made)

    cleaned_at_close, made = asyncio.run(consume())
    assert cleaned_at_close == [True] and made < 10


def test_a_cancelled_consumer_cancels_the_producer():
    async def consume():
        cleaned = []

        async def slow():
            try:
                yield 1
                await asyncio.sleep(60)
                yield 2
            finally:
                cleaned.append(True)

        async def drain():
            async for _ in read_ahead(slow()):
                pass

        task = asyncio.ensure_future(drain())
        await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return cleaned

    assert asyncio.run(consume()) == [True]


def test_a_call_cancelled_while_a_message_is_written_cancels_the_producer_and_closes_its_events():
    """Real gRPC: the client stops reading, so the server's write of a large message waits on flow control; the
    client then cancels. grpc cancels its own task inside that write, outside read_ahead, which is left suspended
    (and kept, by a cycle through the call): the call's end (`ended`) stops the producer, and the events it read
    run their clean-up (a query's: its model streams cancelled, its admission slot given back)."""
    import grpc

    async def scenario() -> bool:
        stopped, kept = asyncio.Event(), []

        async def many():
            try:
                while True:
                    yield b"x" * 1_000_000
                    await asyncio.sleep(0)
            finally:
                stopped.set()

        async def handler(request, context):
            events = read_ahead(many(), depth=4, ended=context.add_done_callback)
            kept.append(events)  # as a cycle through the call kept it in the server (CI): never closed
            async for message in events:
                yield message

        server = grpc.aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "test.Stream", {"Many": grpc.unary_stream_rpc_method_handler(handler)}),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        try:
            call = channel.unary_stream("/test.Stream/Many")(b"")
            await call.read()  # one message, then no more reads: the server's writes wait
            await asyncio.sleep(0.5)
            call.cancel()
            try:
                await asyncio.wait_for(stopped.wait(), 5)
                return True
            except asyncio.TimeoutError:
                return False
        finally:
            await channel.close()
            await server.stop(None)

    assert asyncio.run(scenario())


def test_a_cancellation_the_events_lose_still_ends_them():
    """asyncio.wait_for in Python 3.11 loses a cancellation that meets its result (a token arriving as the client
    leaves): the events go on and yield again. The task ends them at their next item instead of running them to
    their end for a consumer that is gone (or waiting forever to put that item in its full queue: seen in CI, the
    LLM's stream left open and unread)."""

    async def consume():
        cleaned, produced = [], []

        async def losing():
            try:
                for n in range(3000):
                    try:
                        await asyncio.sleep(0.001)
                    except asyncio.CancelledError:
                        pass  # lost, as wait_for can
                    produced.append(n)
                    yield n
            finally:
                cleaned.append(True)

        events = read_ahead(losing(), depth=10_000)  # never full: the cancellation finds the task in the events
        await events.__anext__()
        await events.aclose()
        return list(cleaned), len(produced)

    cleaned, produced = asyncio.run(consume())
    assert cleaned == [True] and produced < 100
