"""The circuit breaker's states and messages, on a fake clock (it is pure logic; Triton's side is tested for
real in tests/integration/test_triton_faults.py)."""

from __future__ import annotations

import pytest

from orchestrator.errors import TritonUnavailableError
from orchestrator.triton.breaker import BreakerBoard, CircuitBreaker


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return FakeClock()


def breaker(clock, threshold=3, cooldown_s=2.0) -> CircuitBreaker:
    return CircuitBreaker("reranker", threshold, cooldown_s, clock)


def fail(b: CircuitBreaker, times: int, cause="Triton at 127.0.0.1:1 is unreachable: connection refused") -> None:
    for _ in range(times):
        b.record_failure(cause, b.allow())


def test_opens_after_threshold_consecutive_failures_and_fails_fast_naming_model_count_and_retry(clock):
    b = breaker(clock)
    fail(b, 2)
    assert b.state == "closed"
    b.allow()  # still lets calls through below the threshold
    fail(b, 1)
    assert b.state == "open"
    clock.now += 0.5
    with pytest.raises(TritonUnavailableError) as raised:
        b.allow()
    message = str(raised.value)
    assert message.startswith("Triton model 'reranker' is unavailable: circuit breaker open")
    assert "after 3 consecutive failures" in message
    assert "connection refused" in message  # the last cause
    assert "next trial call in 1.5 s" in message
    status = b.status()
    assert (status.state, status.rejected, status.times_opened, status.retry_in_s) == ("open", 1, 1, pytest.approx(1.5))


def test_a_success_in_between_resets_the_count(clock):
    b = breaker(clock)
    fail(b, 2)
    b.record_success(b.allow())
    fail(b, 2)
    assert b.state == "closed" and b.status().consecutive_failures == 2 and b.status().total_failures == 4


def test_half_open_lets_exactly_one_trial_through_and_its_success_closes(clock):
    b = breaker(clock)
    fail(b, 3)
    clock.now += 2.0
    assert b.state == "half_open"
    trial = b.allow()
    assert trial.trial
    with pytest.raises(TritonUnavailableError, match="a trial call is in flight"):
        b.allow()
    b.record_success(trial)
    assert b.state == "closed"
    assert not b.allow().trial


def test_a_failed_trial_opens_again_for_a_full_cooldown(clock):
    b = breaker(clock)
    fail(b, 3)
    clock.now += 2.0
    trial = b.allow()
    b.record_failure("Stub process 'reranker_score_0_0' is not healthy.", trial)
    assert b.state == "open" and b.status().times_opened == 2
    clock.now += 1.9
    with pytest.raises(TritonUnavailableError, match="Stub process 'reranker_score_0_0' is not healthy"):
        b.allow()
    clock.now += 0.1
    assert b.allow().trial


def test_a_neutral_trial_frees_the_slot_without_closing(clock):
    b = breaker(clock)
    fail(b, 3)
    clock.now += 2.0
    trial = b.allow()
    b.record_neutral(trial)  # e.g. the caller's deadline passed: nothing learnt about the model
    assert b.state == "half_open"
    assert b.allow().trial  # the next call is the trial


def test_a_late_failure_of_a_call_started_before_opening_does_not_reopen_a_half_open_breaker(clock):
    b = breaker(clock)
    stale = b.allow()
    fail(b, 3)
    clock.now += 2.0
    trial = b.allow()
    b.record_failure("late", stale)  # not the trial
    assert b.state == "half_open"
    b.record_success(trial)
    assert b.state == "closed"


def test_metadata_check_fails_fast_while_open_but_takes_no_trial(clock):
    b = breaker(clock)
    fail(b, 3)
    with pytest.raises(TritonUnavailableError, match="circuit breaker open"):
        b.check()
    clock.now += 2.0
    b.check()  # half-open: passes ...
    assert b.allow().trial  # ... and the trial slot is still free


def test_reset_closes_at_once(clock):
    b = breaker(clock)
    fail(b, 3)
    b.reset()
    assert b.state == "closed" and not b.allow().trial


def test_board_keeps_one_breaker_per_model_and_resets_all(clock):
    board = BreakerBoard(threshold=1, cooldown_s=5.0, clock=clock)
    assert board["llm"] is board["llm"]
    fail(board["llm"], 1)
    fail(board["vlm"], 1)
    snapshot = board.snapshot()
    assert list(snapshot) == ["llm", "vlm"] and {s.state for s in snapshot.values()} == {"open"}
    board.reset("llm")
    assert board["llm"].state == "closed" and board["vlm"].state == "open"
    board.reset()
    assert board["vlm"].state == "closed"


def test_threshold_below_one_is_refused(clock):
    with pytest.raises(ValueError):
        CircuitBreaker("m", 0, 1.0, clock)
