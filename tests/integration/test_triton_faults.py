"""Survival of Triton failures, with a real tritonserver killed for real (kill -9), never a mock.

The deployment here launches its own Triton (not the session's, which other tests share) with only the models
the tiny profile's query path calls for a Markdown document once its cross-encoder has a say
(retrieval.rerank_weight above 0): the text embedder and the reranker (the router decides by features, answers
are extractive, a Markdown document has no page images). The supervisor
restarts the server or reloads a model; the client's retries and circuit breakers keep requests from hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass

import grpc
import numpy as np
import pytest

from orchestrator.client import ThinkServeClient
from orchestrator.server.deployment import Deployment
from orchestrator.errors import ModelNotFoundError, TritonUnavailableError
from orchestrator.models import contracts
from orchestrator.triton.client import TritonClient
from orchestrator.triton.launcher import TritonServer, _free_port
from orchestrator.triton.supervisor import TritonSupervisor
from tests.conftest import SAMPLE_DOCUMENT, settings_with
from tests.deploy_checks import queried_families
from tests.integration.conftest import BackgroundLoop, event_of, repository_subset

pytestmark = pytest.mark.integration

QUERY_PATH_MODELS = [
    "text_embedder", "text_embedder_tokenize", "text_embedder_encode", "reranker", "reranker_tokenize", "reranker_score",
]
COLLECTION = "faults"
QUESTION = "How much did annual revenue grow in 2024?"
LATE_DOCUMENT = "# Harbour works\n\nThe harbour's new quay was finished in March 2024 by Fairport Construction.\n"
DEADLINE_S = 12.0  # each query's own deadline: none may take longer than this (plus transport slack)
WORKERS = 8


@dataclass
class Faulty:
    deployment: Deployment
    loop: BackgroundLoop
    address: str


@pytest.fixture(scope="module")
def faulty(triton_settings, tmp_path_factory):
    source = triton_settings.model_repository
    repository = repository_subset(source, tmp_path_factory.mktemp("faults-repo"), QUERY_PATH_MODELS)
    settings = settings_with(
        triton_settings.model_copy(update={"model_repository": repository, "supervise_interval_s": 0.5, "reload_timeout_s": 10}),
        tmp_path_factory.mktemp("faults-data"),
        # the LLM's and VLM's files are not in this repository: the orchestrator still counts in their tokens
        ingest={"tokenizer": source / "text_embedder_tokenize" / "1" / "tokenizer.json"},
        generation={"llm_tokenizer": source / "llm" / "1" / "tokenizer.json", "vlm_tokenizer": source / "vlm" / "1" / "tokenizer.json"},
        # an optional stage to fail: at the tiny profile's weight 0 the cross-encoder would not be called
        retrieval={"rerank_weight": 0.1},
    )
    loop = BackgroundLoop()
    deployment = Deployment(settings, (contracts.TEXT_EMBEDDER, contracts.RERANKER))
    address = loop.run(deployment.start(progress=lambda _: None))
    with ThinkServeClient(address, timeout_s=120) as client:
        client.ingest(COLLECTION, SAMPLE_DOCUMENT.read_bytes(), SAMPLE_DOCUMENT.name)
    yield Faulty(deployment, loop, address)
    loop.run(deployment.stop())
    loop.close()


@dataclass(frozen=True)
class Outcome:
    started: float  # monotonic
    seconds: float
    status: str  # OK or the gRPC status name
    detail: str  # the error's message, or the degraded reason
    degraded: bool = False
    models: frozenset[str] = frozenset()  # models in the query's cost report
    mode: str = ""  # the answer's retrieval mode: full | lexical


def ask(client: ThinkServeClient, **options) -> Outcome:
    started = time.monotonic()
    try:
        final = event_of(list(client.query(COLLECTION, QUESTION, **options)), "final")
    except grpc.RpcError as error:
        return Outcome(started, time.monotonic() - started, error.code().name, error.details() or "")
    models = frozenset(usage.model for usage in final.cost.models)
    return Outcome(started, time.monotonic() - started, "OK", final.degraded_reason, final.degraded, models, final.retrieval_mode)


def wait_for(condition, timeout_s: float, what: str, interval_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval_s)
    pytest.fail(f"{what} did not happen within {timeout_s:.0f} s")


def successes(statistics: dict) -> int:
    return int(statistics["model_stats"][0].get("inference_stats", {}).get("success", {}).get("count", 0))


def test_triton_metrics_are_relayed_on_the_http_port(faulty):
    """Triton listens on loopback only; its own metrics reach Prometheus through the orchestrator's port."""
    import httpx

    relayed = httpx.get(f"{faulty.deployment.http_address}/metrics/triton", timeout=10)
    assert relayed.status_code == 200 and 'nv_inference_count{model="text_embedder_encode"' in relayed.text
    # the dashboard's Triton families a CPU tritonserver serves (its GPU and TensorRT-LLM ones need a GPU)
    _, triton = queried_families()
    for family in sorted(name for name in triton if name.startswith("nv_inference_")):
        assert f"# TYPE {family} " in relayed.text, family


def test_kill_9_of_tritonserver_under_load_answers_in_lexical_mode_and_recovers_by_itself(faulty):
    """While Triton is dead and restarting, questions are answered in lexical mode (BM25, no model), flagged
    degraded with the cause; once it is back, full answers return without any intervention."""
    deployment, triton = faulty.deployment, faulty.deployment.triton
    client_before, endpoints_before = deployment.triton_client, triton.endpoints
    old_pid, old_prefix = triton.pid, triton.shm_prefix
    outcomes: list[Outcome] = []
    lock, stop = threading.Lock(), threading.Event()

    def load():
        with ThinkServeClient(faulty.address, timeout_s=DEADLINE_S) as client:
            while not stop.is_set():
                outcome = ask(client)
                with lock:
                    outcomes.append(outcome)
                if outcome.status != "OK":
                    time.sleep(0.05)  # a failed client pauses briefly, as a real one would

    workers = [threading.Thread(target=load, name=f"load-{i}", daemon=True) for i in range(WORKERS)]
    for worker in workers:
        worker.start()
    wait_for(lambda: sum(o.status == "OK" for o in outcomes) >= WORKERS, 60, "a first round of answers")
    with ThinkServeClient(faulty.address, timeout_s=DEADLINE_S) as client:
        stored = [(d.name, d.document_id) for d in client.list_documents(COLLECTION)]
        killed_at = time.monotonic()
        os.kill(old_pid, signal.SIGKILL)
        time.sleep(0.3)
        # a document sent while Triton is down fails naming the model it needs, and nothing of it is stored
        with pytest.raises(grpc.RpcError) as refused:
            client.ingest(COLLECTION, LATE_DOCUMENT.encode(), "late.md")
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE and "text_embedder" in refused.value.details()
        assert [(d.name, d.document_id) for d in client.list_documents(COLLECTION)] == stored
    time.sleep(max(0.0, 4.0 - (time.monotonic() - killed_at)))  # more queries keep coming while Triton is down
    stop.set()
    for worker in workers:
        worker.join(DEADLINE_S + 10)
    assert not [w.name for w in workers if w.is_alive()], "a request hung past its deadline"

    # Every request ended within its deadline, nearly all of them answered: in lexical mode while the embedder
    # was unreachable (flagged degraded, saying why), any other failure UNAVAILABLE naming Triton.
    after_kill = [o for o in outcomes if o.started + o.seconds >= killed_at]
    assert after_kill and max(o.seconds for o in outcomes) <= DEADLINE_S + 2
    failed = [o for o in after_kill if o.status != "OK"]
    for outcome in failed:
        assert outcome.status == "UNAVAILABLE" and "Triton" in outcome.detail, outcome
    assert len(failed) <= 0.05 * len(after_kill), failed
    lexical = [o for o in after_kill if o.mode == "lexical"]
    assert lexical, "the kill should have sent questions to lexical mode"
    for outcome in lexical:
        assert outcome.degraded and "lexical mode" in outcome.detail and "could not be embedded" in outcome.detail, outcome
    for outcome in after_kill:
        if outcome.status == "OK" and outcome.degraded:
            assert outcome.detail, "a degraded answer must say why"

    # No manual action: the supervisor restarts Triton on the same ports and queries succeed again.
    with ThinkServeClient(faulty.address, timeout_s=DEADLINE_S) as client:
        recovered = wait_for(lambda: (lambda o: o if o.status == "OK" and not o.degraded else None)(ask(client)), 90, "recovery")
    recovery_s = recovered.started + recovered.seconds - killed_at
    status = deployment.supervisor.status()
    assert recovered.mode == "full"
    with ThinkServeClient(faulty.address, timeout_s=60) as client:
        client.ingest(COLLECTION, LATE_DOCUMENT.encode(), "late.md")  # the same document, once the model is back
        assert {d.name for d in client.list_documents(COLLECTION)} == {name for name, _ in stored} | {"late.md"}
    print(f"\nTriton killed: {len(after_kill)} requests after the kill, {len(lexical)} in lexical mode, {len(failed)} failed; "
          f"first full answer {recovery_s:.1f} s after the kill "
          f"(restart took {status.last_restart_s:.1f} s from noticing the death)")
    assert status.restarts == 1 and "killed by SIGKILL" in status.last_failure
    assert triton.pid != old_pid and triton.endpoints == endpoints_before
    assert deployment.triton_client is client_before  # the same channel reconnected: nothing was rebuilt
    assert recovered.models >= {"text_embedder", "reranker"}
    # the dead server's stubs and shared-memory regions are gone
    with pytest.raises(ProcessLookupError):
        os.killpg(old_pid, 0)
    assert not glob.glob(f"/dev/shm/{old_prefix}*")


def test_kill_9_of_a_model_stub_is_detected_and_the_model_reloaded(faulty):
    deployment = faulty.deployment
    reloads_before = deployment.supervisor.status().reloads_by_model.get("reranker_score", 0)
    (stub,) = [s for s in deployment.triton.stub_processes() if s.model == "reranker_score"]
    os.kill(stub.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    wait_for(lambda: deployment.supervisor.status().reloads_by_model.get("reranker_score", 0) > reloads_before, 30, "the reload")
    reloaded_s = time.monotonic() - killed_at
    (new_stub,) = [s for s in deployment.triton.stub_processes() if s.model == "reranker_score"]
    assert new_stub.pid != stub.pid
    assert f"the python stub of {stub.instance} died" in deployment.supervisor.status().last_failure

    async def reranker_successes():
        return successes(await deployment.triton_client.model_statistics("reranker"))

    before = faulty.loop.run(reranker_successes())
    with ThinkServeClient(faulty.address, timeout_s=DEADLINE_S) as client:
        outcome = ask(client)
    assert outcome.status == "OK" and not outcome.degraded, outcome
    assert "reranker" in outcome.models  # the query's cost report ...
    assert faulty.loop.run(reranker_successes()) > before  # ... and Triton's own count: the reloaded model ran
    print(f"\nstub killed: model reloaded {reloaded_s:.1f} s later")


def kill_stub(deployment: Deployment, model: str) -> None:
    (stub,) = [s for s in deployment.triton.stub_processes() if s.model == model]
    os.kill(stub.pid, signal.SIGKILL)


def answered_with(address: str, model: str) -> Outcome:
    with ThinkServeClient(address, timeout_s=DEADLINE_S) as client:
        outcome = wait_for(lambda: (lambda o: o if o.status == "OK" else None)(ask(client)), 30, "an answer")
    assert not outcome.degraded and model in outcome.models, outcome
    return outcome


def test_a_hung_stub_is_reported_by_the_failed_call_and_the_model_reloaded(faulty):
    """A stub that hangs (SIGSTOP) is still in the process table, so only the failing call tells: "Stub process
    '<instance>' is not healthy" reaches the supervisor through the client's failure listener."""
    deployment, supervisor = faulty.deployment, faulty.deployment.supervisor
    before = supervisor.status().reloads_by_model.get("reranker_score", 0)
    (stub,) = [s for s in deployment.triton.stub_processes() if s.model == "reranker_score"]
    os.kill(stub.pid, signal.SIGSTOP)
    try:
        with ThinkServeClient(faulty.address, timeout_s=DEADLINE_S) as client:
            hurt = ask(client)  # the reranker is optional: skipped, the answer is degraded, and the stub reported
        wait_for(lambda: supervisor.status().reloads_by_model.get("reranker_score", 0) > before, 30, "the reload")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(stub.pid, signal.SIGCONT)
    assert hurt.status == "OK" and hurt.degraded and "Stub process 'reranker_score_0_0' is not healthy" in hurt.detail, hurt
    assert "a call to reranker failed: Stub process 'reranker_score_0_0' is not healthy" in supervisor.status().last_failure
    assert stub.pid not in {s.pid for s in deployment.triton.stub_processes()}
    answered_with(faulty.address, "reranker")


def test_a_failed_reload_is_tried_again_after_a_pause_and_brings_the_ensemble_back(faulty):
    """The reload itself can fail (here the model's ONNX file is corrupt when the stub dies): the supervisor
    logs Triton's cause, pauses (triton.restart_backoff_s, doubling) and tries again; when the model loads,
    the ensemble that went down with it is loaded again too."""
    deployment, supervisor = faulty.deployment, faulty.deployment.supervisor
    before = supervisor.status().reloads_by_model.get("reranker_score", 0)
    onnx = deployment.settings.triton.model_repository / "reranker_score" / "1" / "classifier.onnx"
    whole = onnx.with_name("classifier.onnx.whole")
    onnx.rename(whole)  # a hard link into the build: never write through it
    try:
        onnx.write_bytes(b"not an onnx model")
        kill_stub(deployment, "reranker_score")
        wait_for(lambda: "reloading model reranker_score failed (attempt 2, next in 2.0 s)" in supervisor.status().last_failure,
                 60, "a second failed reload")
        failure = supervisor.status().last_failure
    finally:
        whole.replace(onnx)
    assert "INVALID_PROTOBUF" in failure and "classifier.onnx" in failure  # Triton's own cause
    wait_for(lambda: supervisor.status().reloads_by_model.get("reranker_score", 0) > before, 60, "the reload")
    answered_with(faulty.address, "reranker")  # the ensemble is back


def test_a_stuck_reload_restarts_triton(faulty, caplog):
    """Triton 2.51 never answers the load of a python model whose stub fails to start (here: its model.py is
    gone) when an ensemble uses it, even once the file is back: after triton.reload_timeout_s the supervisor
    restarts the whole server."""
    caplog.set_level(logging.WARNING, logger="thinkserve.triton.supervisor")
    deployment, supervisor = faulty.deployment, faulty.deployment.supervisor
    restarts = supervisor.status().restarts
    log_path = deployment.triton.log_path
    code = deployment.settings.triton.model_repository / "reranker_score" / "1" / "model.py"
    hidden = code.with_name("model.py.hidden")
    code.rename(hidden)
    try:
        kill_stub(deployment, "reranker_score")
        wait_for(lambda: "Failed to preinitialize Python stub" in log_path.read_text(errors="replace"), 60, "the failed load")
    finally:
        hidden.rename(code)  # Triton's repository stays stuck all the same
    wait_for(lambda: supervisor.status().restarts > restarts, 90, "the restart")
    # a restart counts once the shared client's channel reaches the new server, past its reconnect backoff:
    # a call at that moment, which fails at once on a channel still backing off, succeeds
    assert faulty.loop.run(deployment.triton_client.server_ready(timeout_s=1.0))
    assert "reloading model reranker_score did not finish within 10 s (triton.reload_timeout_s)" in caplog.text
    assert "Triton's model repository is stuck; restarting Triton" in supervisor.status().last_failure
    answered_with(faulty.address, "reranker")


RERANKER_INPUTS = {"query": np.array([[b"revenue"]], dtype=np.object_), "passage": np.array([[b"revenue grew"]], dtype=np.object_)}


@pytest.fixture(scope="module")
def reranker_triton(triton_settings, model_repository, tmp_path_factory):
    """A small Triton of its own, with no supervisor: for the client's breaker, then as an 'external' server."""
    repository = repository_subset(
        model_repository, tmp_path_factory.mktemp("reranker-repo"), ["reranker", "reranker_tokenize", "reranker_score"]
    )
    server = TritonServer(triton_settings.model_copy(update={"model_repository": repository}), (contracts.RERANKER,))
    server.start()
    yield server
    server.stop()


def test_the_breaker_opens_for_a_dead_model_and_fails_fast_until_it_is_back(reranker_triton):
    """No supervisor here: the stub stays dead, each call pays the backend's stub health check (~1 s), until
    the breaker opens; then calls fail in milliseconds naming the model, until a trial after the cooldown."""
    server, inputs = reranker_triton, RERANKER_INPUTS

    async def scenario():
        async with TritonClient(server.endpoints.grpc, 10, breaker_threshold=3, breaker_cooldown_s=1.5) as client:
            await client.infer("reranker", inputs)
            (stub,) = [s for s in server.stub_processes() if s.model == "reranker_score"]
            os.kill(stub.pid, signal.SIGKILL)
            slow = []
            for _ in range(3):
                started = time.monotonic()
                with pytest.raises(TritonUnavailableError, match="Stub process 'reranker_score_0_0' is not healthy"):
                    await client.infer("reranker", inputs)
                slow.append(time.monotonic() - started)
            started = time.monotonic()
            with pytest.raises(TritonUnavailableError) as raised:
                await client.infer("reranker", inputs)
            fast = time.monotonic() - started
            message = str(raised.value)
            open_state = client.health_snapshot().breakers["reranker"]
            await asyncio.sleep(1.6)  # the cooldown: one trial goes through, fails, and the breaker opens again
            with pytest.raises(TritonUnavailableError, match="not healthy"):
                await client.infer("reranker", inputs)
            reopened = client.health_snapshot().breakers["reranker"]
            await client.reload_model("reranker_score")
            await asyncio.sleep(1.6)
            await client.infer("reranker", inputs)  # the trial succeeds: closed
            # a model Triton does not serve counts as unavailable too (ModelNotFoundError)
            for _ in range(3):
                with pytest.raises(ModelNotFoundError, match="Triton does not serve model 'llm'"):
                    await client.infer("llm", inputs)
            with pytest.raises(TritonUnavailableError, match="Triton model 'llm' is unavailable: circuit breaker open"):
                await client.infer("llm", inputs)
            return slow, fast, message, open_state, reopened, client.health_snapshot().breakers["reranker"]

    slow, fast, message, open_state, reopened, closed = asyncio.run(scenario())
    print(f"\ndead stub: calls took {', '.join(f'{s:.2f}' for s in slow)} s; with the breaker open {fast * 1000:.1f} ms")
    assert min(slow) > 0.2 and fast < 0.05
    assert "Triton model 'reranker' is unavailable: circuit breaker open after 3 consecutive failures" in message
    assert "next trial call in" in message and "Stub process 'reranker_score_0_0' is not healthy" in message
    assert (open_state.state, open_state.rejected) == ("open", 1)
    assert (reopened.state, reopened.times_opened) == ("open", 2)
    assert (closed.state, closed.consecutive_failures) == ("closed", 0)


def test_unavailable_calls_are_retried_within_the_budget_and_never_past_the_deadline():
    port = _free_port(exclude=set())  # nothing listens there: Triton is down

    async def scenario():
        async with TritonClient(f"127.0.0.1:{port}", retry_attempts=3, retry_backoff_s=0.1, breaker_threshold=100) as client:
            started = time.monotonic()
            with pytest.raises(TritonUnavailableError, match=f"Triton at 127.0.0.1:{port} is unreachable"):
                await client.infer("text_embedder", {"text": np.array([[b"x"]], dtype=np.object_)}, timeout_s=10)
            budget = (time.monotonic() - started, client.retries)
            started = time.monotonic()
            with pytest.raises(TritonUnavailableError):
                await client.infer("text_embedder", {"text": np.array([[b"x"]], dtype=np.object_)}, timeout_s=0.15)
            return budget, (time.monotonic() - started, client.retries - budget[1])

    (all_attempts_s, retries), (short_s, short_retries) = asyncio.run(scenario())
    assert retries == 2 and 0.3 <= all_attempts_s < 2.0  # 3 attempts, pauses 0.1 + 0.2 s
    assert short_retries == 1 and short_s < 0.3  # the 0.2 s pause would pass the 0.15 s deadline: no third attempt


def test_an_external_triton_is_watched_not_restarted_and_the_channel_reconnects_quickly(triton_settings, reranker_triton):
    """With triton.url the supervisor only watches readiness. When whoever owns that Triton restarts it after
    a long outage, the client's channel is back within its capped reconnect backoff (gRPC's default backoff
    would by then have grown to several seconds: 7.6 s measured after 15 s)."""
    server, inputs = reranker_triton, RERANKER_INPUTS

    async def scenario():
        async with TritonClient(server.endpoints.grpc, retry_attempts=1, reconnect_backoff_max_s=0.5) as client:
            supervisor = TritonSupervisor(triton_settings.model_copy(update={"supervise_interval_s": 0.2}), client)
            supervisor.start()
            await client.infer("reranker", inputs)
            ready_before = supervisor.status().triton_ready
            os.kill(server.pid, signal.SIGKILL)
            outage_ends = time.monotonic() + 12.0
            while time.monotonic() < outage_ends:  # calls keep failing: gRPC's backoff would keep growing
                with pytest.raises(TritonUnavailableError, match="is unreachable|circuit breaker open"):
                    await client.infer("reranker", inputs, timeout_s=1)
                await asyncio.sleep(0.2)
            down = supervisor.status()
            await asyncio.to_thread(server.restart)  # the owner brings it back, same ports
            restarted = time.monotonic()
            while True:
                try:
                    await client.infer("reranker", inputs, timeout_s=1)
                    break
                except TritonUnavailableError:
                    assert time.monotonic() - restarted < 10, "the channel never came back"
                    await asyncio.sleep(0.05)
            back_s = time.monotonic() - restarted
            await asyncio.sleep(0.5)
            up = supervisor.status()
            await supervisor.stop()
            return ready_before, down, back_s, up

    ready_before, down, back_s, up = asyncio.run(scenario())
    print(f"\nexternal Triton restarted after a 12 s outage: first call succeeded {back_s:.2f} s later")
    assert ready_before and down.mode == "external"
    assert not down.triton_ready and down.restarts == 0 and "not restarted here" in down.last_failure
    assert back_s < 1.5
    assert up.triton_ready and up.restarts == 0
