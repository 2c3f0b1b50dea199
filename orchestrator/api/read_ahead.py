"""A query's events produced ahead of the transport that sends them.

grpc.aio writes each message a streaming handler yields and waits for the write to finish before it asks for the
next one: a query would stand still for every event it streams (route, evidence, each answer delta) while its
message goes out. Read ahead, the query runs in a task of its own and goes on meanwhile; the transport takes
its events in order from a bounded queue (a slow client still holds the query back once `depth` are waiting).
The task ends with the call: when its consumer stops, and when the call ends, whatever state its consumer was
left in.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator, Callable, Optional, TypeVar

T = TypeVar("T")
_END = object()


async def read_ahead(
    events: AsyncIterator[T], depth: int = 32, ended: Optional[Callable[[Callable[[object], None]], None]] = None,
) -> AsyncIterator[T]:
    """The items of `events`, in order, iterated by a task of their own (made in the caller's context, so its
    request id and trace go with it). Its failure is raised here, after the items before it; a consumer that
    stops early (the client went away) cancels it, and its clean-up ends before this generator does.

    `ended`: registers a callback for the end of the transport's call (grpc's `context.add_done_callback`), which
    cancels the task too. A client that goes away while grpc writes a message cancels grpc's own task there,
    outside this generator, which is then left suspended and closed only when the garbage collector finds it:
    without the call's end the task would go on, holding its query's admission slot (seen in CI).

    A stopped task ends even if its cancellation is lost on the way (asyncio.wait_for in Python 3.11 drops one that
    meets its result): at the events' next item, instead of waiting to put it in the queue of a consumer that is
    gone, with the model streams under it open and unread."""
    queue: asyncio.Queue = asyncio.Queue(depth)
    stopped = False

    async def produce() -> None:
        try:
            async for item in events:
                if stopped:  # a cancellation the events caught, or that arrived as they yielded: end here anyway
                    break
                await queue.put((item, None))
        except Exception as error:  # handed to the consumer, which raises it where the transport maps it
            await queue.put((_END, error))
        else:
            await queue.put((_END, None))
        finally:  # cancelled while the events wait at a yield: leaving the loop does not close them, this does
            close = getattr(events, "aclose", None)
            if close is not None:
                await close()

    def stop(_: object = None) -> None:
        nonlocal stopped
        stopped = True
        if not producer.done() and not producer.cancelling():  # once: a second cancel would cut its clean-up short
            producer.cancel()

    producer = asyncio.ensure_future(produce())
    if ended is not None:
        ended(stop)
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
            stop()
            with contextlib.suppress(asyncio.CancelledError):
                await producer
