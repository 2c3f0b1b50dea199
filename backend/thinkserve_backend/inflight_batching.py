"""In-flight (continuous) batching: every running generation advances by one token per forward pass, and requests
join and leave the running batch at token boundaries.

One scheduler thread owns the batch decoder (torch_batch_decoding.BatchDecoder) and loops: admit waiting requests
into free rows (their prompts prefilled together), then one decode step for every running row. Each step's tokens
are chosen per request (its own sampling settings and seeded generator, decoding.SequenceProgress) and handed to
the request's `emit` at once, so tokens stream as produced. A cancelled request leaves within the cancellation
check's interval and its row is free for the next waiting one. What bounds the work: the decoder's rows (sequences decoded together, each with
a KV cache of the model's context) and `max_waiting`; past that a request is refused (GenerationQueueFull) instead
of queued without end.

Why not transformers' own ContinuousBatchingManager: it takes token ids only (a VLM's prompt is embeddings with
image features spliced in), samples from one torch seed shared by all requests, and returns neither entropies
nor per-request seeds; the uncertainty judger and reproducible sampling need all three.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Optional

from .decoding import GenerationStep, SequenceProgress
from .sampling import RowSampling


# How a refusal for want of capacity begins (after the model's name): the orchestrator's Triton client reads it as
# backpressure (orchestrator.errors.ModelBusyError), not as a model that is down or broken.
BUSY_MARKER = "busy: "


class GenerationQueueFull(RuntimeError):
    """Every row is busy and `max_waiting` requests already wait: the caller should retry later."""


@dataclass
class BatchedGeneration:
    """One request as the batcher serves it."""

    prompt: object  # ids [1, n] (int64) or embeddings [1, n, d]: what the decoder's prefill takes
    progress: SequenceProgress
    emit: Callable[[GenerationStep], None]  # each step in order (on the delivery thread); the last has finish_reason
    fail: Callable[[BaseException], None]  # the generation cannot go on (the model raised); nothing follows
    is_cancelled: Callable[[], bool] = lambda: False
    # set by the delivery thread when `emit` raised (the request's stream is gone): the row is freed at the next step
    undeliverable: bool = field(default=False, init=False)
    cancel_checked_at: float = field(default=0.0, init=False)


@dataclass
class _Row:
    generation: BatchedGeneration
    position: int  # tokens in the row's cache: where the next input token goes
    last_token: int = -1


class _Delivery:
    """Hands steps to their requests on a thread of its own, in the order they were made, so the scheduler's next
    forward pass does not wait for each response to reach Triton (a message to its process per response). The
    queue is bounded: a scheduler that runs ahead of delivery waits instead of piling steps up. When delivery falls
    behind (`merge_backlog` items queued), a request's queued steps go out as one response holding all their tokens
    (as the contract allows: the tokens since the last response), so the number of messages per token falls exactly
    when they are the bottleneck. A lone request's step with nothing queued is handed over on the caller's thread
    (`inline`): one request gains nothing from the hand-off and pays two thread switches a token for it."""

    _STOP = object()

    def __init__(self, name: str, bound: int, merge_backlog: int):
        self._queue: queue.Queue = queue.Queue(maxsize=bound)
        self._merge_backlog = merge_backlog
        self._pending = 0  # queued or being handed over; only the scheduler's thread adds
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name=f"{name}-delivery", daemon=True)
        self._thread.start()

    def emit(self, generation: "BatchedGeneration", step: GenerationStep, inline: bool = False) -> None:
        self._hand(generation.emit, generation, step, inline)

    def fail(self, generation: "BatchedGeneration", error: BaseException) -> None:
        self._hand(generation.fail, generation, error, inline=False)

    def _hand(self, handler, generation, item, inline: bool) -> None:
        with self._lock:
            inline = inline and self._pending == 0  # nothing queued that this could overtake
            if not inline:
                self._pending += 1
        if inline:
            _deliver(handler, generation, item)
        else:
            self._queue.put((handler, generation, item))

    def close(self, timeout_s: float) -> None:
        with self._lock:
            self._pending += 1
        self._queue.put((None, None, self._STOP))
        self._thread.join(timeout_s)

    def _loop(self) -> None:
        while True:
            items = [self._queue.get()]
            if self._queue.qsize() >= self._merge_backlog:
                while True:
                    try:
                        items.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
            for handler, generation, item in merged(items):
                if item is self._STOP:
                    return
                _deliver(handler, generation, item)
            with self._lock:
                self._pending -= len(items)


def _deliver(handler, generation: "BatchedGeneration", item) -> None:
    try:
        handler(item)
    except Exception:
        generation.undeliverable = True


def merged(items: list[tuple]) -> list[tuple]:
    """(handler, generation, item) in order, each request's consecutive unfinished steps joined into one."""
    out: list[tuple] = []
    last: dict[int, int] = {}  # a generation's latest entry in `out`
    for handler, generation, item in items:
        index = last.get(id(generation))
        previous = out[index][2] if index is not None else None
        if isinstance(item, GenerationStep) and isinstance(previous, GenerationStep) and not previous.finish_reason:
            out[index] = (handler, generation, joined(previous, item))
            continue
        if generation is not None:
            last[id(generation)] = len(out)
        out.append((handler, generation, item))
    return out


def joined(first: GenerationStep, then: GenerationStep) -> GenerationStep:
    """Two successive steps of one generation as one: the text and tokens of both, the later one's count and end."""
    return GenerationStep(
        text=first.text + then.text,
        token_ids=first.token_ids + then.token_ids,
        log_probs=first.log_probs + then.log_probs,
        normalized_entropy=first.normalized_entropy + then.normalized_entropy,
        completion_tokens=then.completion_tokens,
        finish_reason=then.finish_reason,
    )


@dataclass(frozen=True)
class BatcherState:
    running: int
    waiting: int
    rows: int
    max_waiting: int


def inline_lone_steps_by_default(device) -> bool:
    """Whether a lone request's steps are sent from the scheduler's thread unless configured (the served model's
    `inline_delivery`): on the CPU only. There it saved two thread switches a token (one stream's time between
    tokens 5.9 -> 3.3-3.9 ms through Triton). On a GPU the scheduler's thread waits for the device through most of a
    step, free of the GIL, so sending from the delivery thread can overlap the next step; sent inline, the send and
    the step add up: on the H200 one stream's tokens took 6.8 ms through Triton against 4.2 in process
    (2026-11-30). The GPU default is that reasoning, not yet measured there."""
    return device.type == "cpu"


class InflightBatcher:
    def __init__(
        self,
        decoder,
        max_waiting: int,
        max_prefill_tokens: int,
        name: str = "generator",
        on_state: Optional[Callable[[BatcherState], None]] = None,
        cancel_check_interval_s: float = 0.05,
        inline_lone_steps: bool = True,
    ):
        """`decoder`: a BatchDecoder (slots, prefill, decode, choose, move_row). `max_prefill_tokens`: prompts prefilled in
        one pass hold at most this many positions, padding included (one prompt is always admitted). A running
        request is asked whether it was cancelled at most every `cancel_check_interval_s` (asking Triton is a
        message to its process: per token and row it cost as much as sending the token). `inline_lone_steps`: a
        lone request's step is sent from this scheduler's thread (_Delivery); off, every step goes to the delivery
        thread, whose sending then overlaps the next step (the served model turns it off on a GPU)."""
        self.decoder = decoder
        self.max_waiting = max_waiting
        self.max_prefill_tokens = max_prefill_tokens
        self.name = name
        self._on_state = on_state
        self.cancel_check_interval_s = cancel_check_interval_s
        self.inline_lone_steps = inline_lone_steps
        # a full step of every row may queue before delivery counts as behind
        self._delivery = _Delivery(name, bound=4 * decoder.slots, merge_backlog=2 * decoder.slots)
        self._waiting: deque[BatchedGeneration] = deque()
        self._running: list[_Row] = []
        self._condition = threading.Condition()
        self._closing = False
        self._published: Optional[BatcherState] = None
        self._thread = threading.Thread(target=self._loop, name=f"{name}-batcher", daemon=True)
        self._thread.start()

    # -------------------------------------------------------------- any thread

    def submit(self, generation: BatchedGeneration) -> None:
        """Queue a request for the next free row; GenerationQueueFull when too many wait already."""
        with self._condition:
            if self._closing:
                raise RuntimeError(f"{self.name} is shutting down")
            if len(self._waiting) >= self.max_waiting:
                raise GenerationQueueFull(
                    f"{BUSY_MARKER}{len(self._running)} generations running and {len(self._waiting)} waiting "
                    f"(max_waiting_generations {self.max_waiting}); retry later"
                )
            self._waiting.append(generation)
            self._condition.notify()

    def state(self) -> BatcherState:
        with self._condition:
            return BatcherState(len(self._running), len(self._waiting), self.decoder.slots, self.max_waiting)

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop: running and waiting generations end with finish_reason "cancelled"."""
        with self._condition:
            self._closing = True
            self._condition.notify()
        self._thread.join(timeout_s)

    # -------------------------------------------------------------- the scheduler's thread

    def _loop(self) -> None:
        while True:
            with self._condition:
                while not self._closing and not self._waiting and not self._running:
                    self._condition.wait()
                if self._closing:
                    abandoned = [row.generation for row in self._running] + list(self._waiting)
                    self._running.clear()
                    self._waiting.clear()
                    break
                admitted = self._admit()
            try:
                if admitted:
                    self._prefill(admitted)
                if self._running:
                    self._decode()
            except Exception as error:  # a defect of ours, not the model's: fail what runs, keep serving
                self._abandon_running(error)
            self._publish()
        for generation in abandoned:
            self._emit(generation, generation.progress.cancelled())
        self._delivery.close(timeout_s=30.0)
        self._publish()

    def _admit(self) -> list[BatchedGeneration]:
        """Waiting requests for the free rows, oldest first, within the prefill bound (called holding the lock)."""
        admitted: list[BatchedGeneration] = []
        longest = 0
        while self._waiting and len(self._running) + len(admitted) < self.decoder.slots:
            length = max(longest, self._waiting[0].progress.prompt_length)
            if admitted and length * (len(admitted) + 1) > self.max_prefill_tokens:
                break
            admitted.append(self._waiting.popleft())
            longest = length
        return admitted

    def _prefill(self, admitted: list[BatchedGeneration]) -> None:
        starting = []
        for generation in admitted:
            if generation.is_cancelled():
                self._emit(generation, generation.progress.cancelled())
            elif generation.progress.budget == 0:
                self._emit(generation, generation.progress.exhausted())
            else:
                starting.append(generation)
        if starting:
            self._start(starting)

    def _start(self, starting: list[BatchedGeneration]) -> None:
        """Prefill `starting` into the rows after the running ones. If the model refuses the group, each prompt is
        tried alone, so only the one it cannot take fails (the running rows are untouched either way)."""
        first_row = len(self._running)
        try:
            logits = self.decoder.prefill(first_row, [g.prompt for g in starting])
        except Exception as error:
            if len(starting) == 1:
                self._fail(starting[0], error)
            else:
                for generation in starting:
                    self._start([generation])
            return
        self._running += [_Row(g, g.progress.prompt_length) for g in starting]
        self._advance(range(first_row, len(self._running)), logits)

    def _decode(self) -> None:
        now = time.monotonic()
        cancelled = [index for index, row in enumerate(self._running) if self._cancelled(row.generation, now)]
        for index in cancelled:
            self._emit(self._running[index].generation, self._running[index].generation.progress.cancelled())
        self._release(cancelled)
        if not self._running:
            return
        try:
            logits = self.decoder.decode([r.last_token for r in self._running], [r.position for r in self._running])
        except Exception as error:  # the batch's caches are lost with it: every running generation fails
            failed, self._running = self._running, []
            for row in failed:
                self._fail(row.generation, error)
            return
        for row in self._running:
            row.position += 1
        self._advance(range(len(self._running)), logits)

    def _advance(self, indices: range, logits) -> None:
        """The tokens of rows `indices` chosen from their logits [len(indices), vocab], emitted; finished rows freed."""
        rows = [self._running[i] for i in indices]
        sampling = [
            RowSampling(r.generation.progress.params.temperature, r.generation.progress.params.top_p, r.generation.progress.uniform())
            for r in rows
        ]
        finished = []
        for index, row, choice in zip(indices, rows, self.decoder.choose(logits, sampling)):
            step = row.generation.progress.after(choice)
            row.last_token = choice.token_id
            self._emit(row.generation, step)
            if step.finish_reason:
                finished.append(index)
        self._release(finished)

    def _abandon_running(self, error: BaseException) -> None:
        failed, self._running = self._running, []
        for row in failed:
            self._fail(row.generation, RuntimeError(f"the generation scheduler failed: {type(error).__name__}: {error}"))

    def _release(self, indices: list[int]) -> None:
        """Free the rows `indices`: the last running row moves into each hole, so rows 0..n-1 stay the running ones."""
        for index in sorted(indices, reverse=True):
            last = len(self._running) - 1
            if index != last:
                self.decoder.move_row(last, index, self._running[last].position)
                self._running[index] = self._running[last]
            self._running.pop()

    def _cancelled(self, generation: BatchedGeneration, now: float) -> bool:
        """Whether a running request is gone: its stream could not take a step, or (asked at most every
        cancel_check_interval_s) it was cancelled."""
        if generation.undeliverable:
            return True
        if now - generation.cancel_checked_at < self.cancel_check_interval_s:
            return False
        generation.cancel_checked_at = now
        try:
            return generation.is_cancelled()
        except Exception:
            return True

    def _emit(self, generation: BatchedGeneration, step: GenerationStep) -> None:
        self._delivery.emit(generation, step, inline=self.inline_lone_steps and len(self._running) <= 1)

    def _fail(self, generation: BatchedGeneration, error: BaseException) -> None:
        self._delivery.fail(generation, error)

    def _publish(self) -> None:
        if self._on_state is None:
            return
        state = self.state()
        if state != self._published:
            self._published = state
            try:
                self._on_state(state)
            except Exception:
                pass
