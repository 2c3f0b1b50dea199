"""Admission, tokens and exposure rules: the logic behind the service's limits, checked exactly."""

from __future__ import annotations

import asyncio
import math

import pytest

from orchestrator.api.admission import AdmissionPool
from orchestrator.api.http_server import check_exposure
from orchestrator.api.security import ANONYMOUS, Principal, TokenAuthority, bearer_token, new_token
from orchestrator.config import AuthSettings, Settings
from orchestrator.errors import (
    ConfigurationError,
    DeadlineExceededError,
    InvalidRequestError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnauthenticatedError,
)
from orchestrator.pipeline.plan import QueryOptions

FAR = 1e18  # a deadline that never comes


def test_pool_runs_capacity_queues_depth_and_refuses_the_rest():
    async def scenario():
        pool = AdmissionPool("queries", capacity=2, queue_depth=1, setting="server.max_concurrent_queries")
        release = asyncio.Event()
        order = []

        async def job(name):
            async with pool.slot(ANONYMOUS, asyncio.get_running_loop().time() + 1e9):
                order.append(name)
                await release.wait()

        tasks = [asyncio.create_task(job(n)) for n in "abc"]
        await asyncio.sleep(0.01)
        assert pool.state().running == 2 and pool.state().waiting == 1 and order == ["a", "b"]
        with pytest.raises(ResourceExhaustedError, match="2 queries running and 1 waiting"):
            async with pool.slot(ANONYMOUS, FAR):
                pass
        release.set()
        await asyncio.gather(*tasks)
        assert order == ["a", "b", "c"] and pool.state().running == 0 and pool.rejected["queue_full"] == 1

    asyncio.run(scenario())


def test_a_waiter_whose_deadline_passes_leaves_the_queue_and_the_slot_goes_on():
    async def scenario():
        import time

        pool = AdmissionPool("queries", capacity=1, queue_depth=2, setting="s")
        release = asyncio.Event()

        async def holder():
            async with pool.slot(ANONYMOUS, FAR):
                await release.wait()

        async def patient():
            async with pool.slot(ANONYMOUS, FAR) as waited:
                return waited

        held = asyncio.create_task(holder())
        await asyncio.sleep(0.01)
        with pytest.raises(DeadlineExceededError, match="waiting for one of 1 queries slots"):
            async with pool.slot(ANONYMOUS, time.monotonic() + 0.05):
                pass
        later = asyncio.create_task(patient())
        await asyncio.sleep(0.01)
        release.set()
        waited = await later
        await held
        assert waited > 0 and pool.state() == pool.state().__class__(0, 0, 1, 2)

    asyncio.run(scenario())


def test_a_cancelled_waiter_gives_its_place_up():
    async def scenario():
        pool = AdmissionPool("queries", capacity=1, queue_depth=1, setting="s")
        release = asyncio.Event()

        async def holder():
            async with pool.slot(ANONYMOUS, FAR):
                await release.wait()

        held = asyncio.create_task(holder())
        await asyncio.sleep(0.01)
        waiting = asyncio.create_task(holder())
        await asyncio.sleep(0.01)
        waiting.cancel()
        await asyncio.sleep(0.01)
        assert pool.state().waiting == 0
        release.set()
        await held
        assert pool.state().running == 0

    asyncio.run(scenario())


def test_each_token_has_its_own_concurrency_limit():
    async def scenario():
        pool = AdmissionPool("queries", capacity=8, queue_depth=8, setting="s")
        narrow = Principal("narrow", frozenset({"*"}), False, 1)
        async with pool.slot(narrow, FAR):
            with pytest.raises(ResourceExhaustedError, match="token 'narrow' already has 1 requests"):
                async with pool.slot(narrow, FAR):
                    pass
            async with pool.slot(ANONYMOUS, FAR):  # others are not affected
                pass
        async with pool.slot(narrow, FAR):  # released: admitted again
            pass

    asyncio.run(scenario())


def test_tokens_authenticate_by_digest_and_scope_collections():
    alpha, alpha_digest = new_token()
    reader, reader_digest = new_token()
    authority = TokenAuthority(AuthSettings(tokens=(
        {"name": "alpha", "sha256": alpha_digest, "collections": ["a"], "write": True},
        {"name": "reader", "sha256": reader_digest, "collections": ["a", "b"]},
    )))
    principal = authority.authenticate(f"Bearer {alpha}")
    assert principal.name == "alpha" and principal.may_read("a") and not principal.may_read("b")
    authority.authorize(principal, "a", write=True)
    with pytest.raises(PermissionDeniedError, match="not granted collection 'b'"):
        authority.authorize(principal, "b")
    with pytest.raises(PermissionDeniedError, match="may read but not change"):
        authority.authorize(authority.authenticate(f"bearer {reader}"), "a", write=True)
    for header in ("", "Basic abc", f"Bearer {alpha}x", "Bearer"):
        with pytest.raises(UnauthenticatedError):
            authority.authenticate(header)
    assert bearer_token("Bearer  tok ") == "tok" and bearer_token("tok") == ""
    assert TokenAuthority(AuthSettings()).authenticate("") is ANONYMOUS


def test_a_server_off_loopback_without_tokens_refuses_to_start():
    with pytest.raises(ConfigurationError, match="server.host = '0.0.0.0' is reachable from the network"):
        check_exposure(Settings.load(None, {"server.host": "0.0.0.0"}))
    with pytest.raises(ConfigurationError, match="http.host"):
        check_exposure(Settings.load(None, {"http.host": "0.0.0.0"}))
    check_exposure(Settings.load(None, {"http.host": "0.0.0.0", "http.enabled": False}))
    _, digest = new_token()
    check_exposure(Settings.load(None, {"server.host": "0.0.0.0", "auth.tokens": [{"name": "ops", "sha256": digest}]}))


def test_tls_settings_go_in_pairs():
    with pytest.raises(ConfigurationError, match="tls_cert_file and server.tls_key_file go together"):
        Settings.load(None, {"server.tls_cert_file": "server.pem"})
    with pytest.raises(ConfigurationError, match="mTLS"):
        Settings.load(None, {"server.tls_client_ca_file": "ca.pem"})


@pytest.mark.parametrize("value", [math.nan, math.inf, -0.5])
def test_temperatures_that_are_not_finite_and_non_negative_are_refused(value):
    with pytest.raises(InvalidRequestError, match="temperature"):
        QueryOptions(temperature=value).check(Settings())
