"""Per-model circuit breakers: stop hammering a model (or a whole Triton) that is down, fail fast instead.

Why: with Triton dead, every call would otherwise wait for a connection attempt or, with a dead python-backend
stub, for the backend's 1 s health check, and every query would pay that again and again while nothing can
succeed. After `threshold` consecutive unavailability failures a model's breaker opens: calls fail at once with
TritonUnavailableError naming the model, the failure count, the last cause and when the next trial is due.
After `cooldown_s` one trial call is let through (half-open); its success closes the breaker, its failure opens
it for another cooldown. The supervisor resets a model's breaker once it restarted Triton or reloaded the model,
so recovery does not wait for the cooldown.

Only unavailability counts (Triton unreachable, model not ready or unknown, stub dead). A model's own execution
error proves the model is there (it counts as a success) and a caller's deadline or cancellation says nothing
about the model (neutral). Pure logic with an injectable clock, so it is unit-tested without Triton.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Literal, Optional

from ..errors import TritonUnavailableError

State = Literal["closed", "open", "half_open"]
Clock = Callable[[], float]


@dataclass(frozen=True)
class BreakerStatus:
    """One model's breaker, for Health / Stats / metrics."""

    model: str
    state: State
    consecutive_failures: int
    total_failures: int  # unavailability failures since start
    times_opened: int
    rejected: int  # calls failed fast while open
    last_failure: str  # cause of the latest unavailability failure ("" if none)
    retry_in_s: float  # seconds until the next trial call is let through (0 unless open)


@dataclass(frozen=True)
class Permit:
    """Leave to make one call; `trial` marks the single call a half-open breaker lets through."""

    trial: bool = False


class CircuitBreaker:
    """closed -> open after `threshold` consecutive failures -> half-open after `cooldown_s` -> closed on success."""

    def __init__(self, model: str, threshold: int, cooldown_s: float, clock: Clock = time.monotonic):
        if threshold < 1:
            raise ValueError("threshold must be at least 1")
        self.model = model
        self.threshold = threshold
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._lock = threading.Lock()  # outcomes may be recorded from another thread (supervisor, to_thread)
        self._state: State = "closed"
        self._consecutive = 0
        self._total = 0
        self._opened = 0
        self._rejected = 0
        self._last_failure = ""
        self._retry_at = 0.0
        self._trial_in_flight = False

    @property
    def state(self) -> State:
        with self._lock:
            return self._current_state()

    def _current_state(self) -> State:
        if self._state == "open" and self._clock() >= self._retry_at:
            self._state, self._trial_in_flight = "half_open", False
        return self._state

    def allow(self) -> Permit:
        """A permit for one call, or TritonUnavailableError right away while the breaker is open."""
        with self._lock:
            state = self._current_state()
            if state == "closed":
                return Permit()
            if state == "half_open" and not self._trial_in_flight:
                self._trial_in_flight = True
                return Permit(trial=True)
            self._rejected += 1
            raise TritonUnavailableError(self._open_message(state))

    def check(self) -> None:
        """For a metadata call (config, statistics): fail fast while open, but take no trial slot, since the
        model's metadata is served even when its stub is dead and so proves nothing about inference."""
        with self._lock:
            state = self._current_state()
            if state == "open":
                self._rejected += 1
                raise TritonUnavailableError(self._open_message(state))

    def _open_message(self, state: State) -> str:
        if state == "open":
            when = f"the next trial call in {max(0.0, self._retry_at - self._clock()):.1f} s"
        else:
            when = "a trial call is in flight"
        return (
            f"Triton model '{self.model}' is unavailable: circuit breaker open after {self._consecutive} consecutive "
            f"failures (last: {self._last_failure}); failing fast, {when}"
        )

    def record_success(self, permit: Optional[Permit] = None) -> None:
        """The model answered (a result, or its own execution error): it is there."""
        with self._lock:
            self._state, self._consecutive, self._trial_in_flight = "closed", 0, False

    def record_failure(self, cause: str, permit: Optional[Permit] = None) -> None:
        """An unavailability failure: the threshold-th in a row, or a failed trial, opens the breaker."""
        with self._lock:
            self._consecutive += 1
            self._total += 1
            self._last_failure = cause
            state = self._current_state()
            trial_failed = state == "half_open" and permit is not None and permit.trial
            if (state == "closed" and self._consecutive >= self.threshold) or trial_failed:
                self._state, self._retry_at, self._trial_in_flight = "open", self._clock() + self.cooldown_s, False
                self._opened += 1

    def record_neutral(self, permit: Optional[Permit] = None) -> None:
        """The call ended without telling anything about the model (caller's deadline, cancellation)."""
        with self._lock:
            if permit is not None and permit.trial and self._state == "half_open":
                self._trial_in_flight = False  # the next call becomes the trial

    def reset(self) -> None:
        """Close the breaker (the supervisor brought the model back)."""
        with self._lock:
            self._state, self._consecutive, self._trial_in_flight = "closed", 0, False

    def status(self) -> BreakerStatus:
        with self._lock:
            state = self._current_state()
            return BreakerStatus(
                model=self.model,
                state=state,
                consecutive_failures=self._consecutive,
                total_failures=self._total,
                times_opened=self._opened,
                rejected=self._rejected,
                last_failure=self._last_failure,
                retry_in_s=max(0.0, self._retry_at - self._clock()) if state == "open" else 0.0,
            )


class BreakerBoard:
    """One breaker per model, created on first use, all with the same settings."""

    def __init__(self, threshold: int, cooldown_s: float, clock: Clock = time.monotonic):
        self.threshold = threshold
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._breakers: dict[str, CircuitBreaker] = {}
        self._lock = threading.Lock()

    def __getitem__(self, model: str) -> CircuitBreaker:
        with self._lock:
            breaker = self._breakers.get(model)
            if breaker is None:
                breaker = self._breakers[model] = CircuitBreaker(model, self.threshold, self.cooldown_s, self._clock)
            return breaker

    def reset(self, model: Optional[str] = None) -> None:
        """Close one model's breaker, or every breaker (Triton was restarted)."""
        with self._lock:
            breakers = list(self._breakers.values()) if model is None else [self._breakers.get(model)]
        for breaker in breakers:
            if breaker is not None:
                breaker.reset()

    def snapshot(self) -> dict[str, BreakerStatus]:
        with self._lock:
            breakers = list(self._breakers.values())
        return {b.model: b.status() for b in sorted(breakers, key=lambda b: b.model)}
