"""A query's events produced ahead of the transport that sends them.

grpc.aio writes each message a streaming handler yields and waits for the write to finish before it asks for the
next one: a query would stand still for every event it streams (route, evidence, each answer delta) while its
message goes out. Read ahead, the query runs in a task of its own and goes on meanwhile; the transport takes
its events in order from a bounded queue (a slow client still holds the query back once `depth` are waiting).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator, TypeVar

T = TypeVar("T")
_END = object()


async def read_ahead(events: AsyncIterator[T], depth: int = 32) -> AsyncIterator[T]:
    """The items of `events`, in order, iterated by a task of their own (made in the caller's context, so its
    request id and trace go with it). Its failure is raised here, after the items before it; a consumer that
    stops early (the client went away) cancels it, and its clean-up ends before this generator does."""
    queue: asyncio.Queue = asyncio.Queue(depth)

    async def produce() -> None:
        try:
            async for item in events:
                await queue.put((item, None))
        except Exception as error:  # handed to the consumer, which raises it where the transport maps it
            await queue.put((_END, error))
        else:
            await queue.put((_END, None))

    producer = asyncio.ensure_future(produce())
    try:
        while True:
            item, error = await queue.get()
            if item is _END:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        if not producer.done():
            producer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await producer
