"""The GPU runner's end-to-end part without a GPU, Triton or orchestrator: the questions and their routes, the closed
loop's window and its bound on stragglers, a unit's row, what a command carries (and the refusal over the goal),
and that the orchestrator imports with the GPU machine's packages and the pack's alone."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest

from orchestrator.api.protos import pb
from thinkserve_bench.gpu import end_to_end, pack, run_on_device
from thinkserve_bench.gpu.options import DEFAULT_COST
from thinkserve_bench.record import ERROR, OK, QueryRecord
from thinkserve_bench.result_files import read_json
from tests.conftest import ROOT

# ---------------------------------------------------------------- the questions


def test_the_cost_runs_questions_keep_the_route_its_router_gave_them_simple_first():
    cost = read_json(DEFAULT_COST)
    routed = end_to_end.routed_questions(cost)
    assert list(routed) == ["simple", "moderate", "complex"]
    assert {route: len(items) for route, items in routed.items()} == {"simple": 12, "moderate": 6, "complex": 6}
    recorded = {r["question_id"]: r["route"] for r in cost["result"]["configs"]["routed"]["records"]}
    for route, items in routed.items():
        for question in items:
            assert recorded[question.id] == route and question.query_options(end_to_end.QUERY_OPTIONS) == {
                "route": route, "answerer": "llm"}
    assert [len(items) for items in end_to_end.routed_questions(cost, per_route=2).values()] == [2, 2, 2]


def test_the_orchestrator_gets_the_runners_triton_and_room_for_the_largest_level(tmp_path):
    settings = end_to_end.deployment_settings("127.0.0.1:8001", tmp_path / "repo", "standin", tmp_path / "data", 32)
    assert settings.triton.url == "127.0.0.1:8001" and settings.tokenizer_file == tmp_path / "repo" / "text_embedder_tokenize" / "1" / "tokenizer.json"
    assert settings.server.max_concurrent_queries == 32 and settings.server.port == 0 and not settings.http.enabled
    assert settings.ingest.ocr == "off" and settings.storage.data_dir == tmp_path / "data"
    tiny = end_to_end.deployment_settings("127.0.0.1:8001", tmp_path, "tiny", tmp_path, 2)
    # the trained models' stages whatever the profile: the dry run goes through what the GPU run does
    assert (tiny.pages.run_by_default, tiny.perception.mode, tiny.answer.answerer) == (True, "dpr", "llm")


# ---------------------------------------------------------------- the closed loop


class FakeClient:
    """Answers each question after its own delay, with the route asked for and a final event."""

    def __init__(self, delays: dict[str, float]):
        self.delays = delays
        self.cancelled = 0

    async def query(self, collection, question, **options):
        try:
            await asyncio.sleep(self.delays[question])
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        yield pb.QueryEvent(route=pb.RouteDecision(label=options["route"]))
        final = pb.FinalAnswer(text="x", cost=pb.Cost(model_ms=4.0, orchestrator_ms=1.0))
        final.timings.add(stage="embed", milliseconds=2.0)
        yield pb.QueryEvent(final=final)


def _questions(*texts: str):
    from thinkserve_bench.workload import WorkloadQuestion

    return [WorkloadQuestion(question=text, id=text, route="simple") for text in texts]


def test_a_closed_window_gives_stragglers_a_bound_then_cancels_them():
    client = FakeClient({"fast": 0.02, "stuck": 30.0})
    began = time.monotonic()
    # the clients take the questions in turn, so both end up waiting on "stuck": one fast query ends in the window
    records, window = asyncio.run(end_to_end.closed_loop(client, _questions("stuck", "fast"), 2, 0.0, 0.3,
                                                         until=time.monotonic() + 5, straggler_s=0.2, min_completed=1))
    assert time.monotonic() - began < 2.0  # the stuck query was not waited for
    assert window["cancelled_at_close"] >= 1 and client.cancelled >= 1
    assert records and all(r.ok and r.question_id == "fast" and r.route == "simple" for r in records)
    unit = end_to_end.summarize("simple", 2, records, window, {"h200": 3.8})
    assert unit["completed"] == len(records) and unit["failed"] == 0 and unit["routes_taken"] == {"simple": len(records)}
    assert unit["queries_per_s"] == pytest.approx(len(records) / window["window_s"])
    assert unit["model_ms_p50"] == 4.0 and unit["stage_ms_p50"] == {"embed": 2.0}
    assert unit["cost"]["h200"]["usd_per_query"] == pytest.approx(3.8 / 3600 / unit["queries_per_s"])


def test_a_window_stretches_until_slow_queries_are_counted_but_not_past_its_bound():
    client = FakeClient({"slow": 0.4})
    records, window = asyncio.run(end_to_end.closed_loop(client, _questions("slow"), 1, 0.0, 0.1,
                                                         until=time.monotonic() + 5, straggler_s=0.1, min_completed=2))
    assert len(records) >= 2 and window["stretched"] and window["window_s"] < 2.0
    records, window = asyncio.run(end_to_end.closed_loop(FakeClient({"stuck": 30.0}), _questions("stuck"), 1, 0.0, 0.1,
                                                         until=time.monotonic() + 0.3, straggler_s=0.1))
    assert records == [] and window["window_s"] < 1.5 and window["cancelled_at_close"] == 1


def test_failures_are_counted_by_their_grpc_code():
    records = [QueryRecord("a", "lookup", "e2e", 0.0, status=OK),
               QueryRecord("b", "lookup", "e2e", 0.0, status="rejected", error="RESOURCE_EXHAUSTED: at capacity"),
               QueryRecord("c", "lookup", "e2e", 0.0, status="timeout", error="DEADLINE_EXCEEDED: Deadline Exceeded"),
               QueryRecord("d", "lookup", "e2e", 0.0, status=ERROR, error="the stream ended without a final event")]
    unit = end_to_end.summarize("complex", 8, records, {"window_s": 1.0, "cancelled_at_close": 0}, {})
    assert unit["errors_by_code"] == {"RESOURCE_EXHAUSTED": 1, "DEADLINE_EXCEEDED": 1, "error": 1}
    assert unit["completed"] == 1 and unit["failed"] == 3 and unit["queries_per_s"] == 1.0


# ---------------------------------------------------------------- what a command carries


def test_the_corpus_is_counted_apart_from_the_pack(tmp_path):
    (tmp_path / "pack" / pack.CORPUS).mkdir(parents=True)
    (tmp_path / "pack" / pack.ARCHIVE).write_bytes(b"x" * 1000)
    (tmp_path / "pack" / pack.CORPUS / "a.pdf.zip").write_bytes(b"y" * 300)
    (tmp_path / "tree" / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "tree" / "pkg" / "m.py").write_bytes(b"z" * 50)
    (tmp_path / "tree" / "pkg" / "__pycache__" / "m.pyc").write_bytes(b"z" * 999)
    sizes = pack.arrived_bytes(tmp_path / "tree", [tmp_path / "pack"])
    assert sizes == {"tree": 50, "pack": 1000, "corpus": 300, "total": 1350}
    carry = pack.command_carry(tmp_path / "tree", [tmp_path / "pack"])  # no .git: the arrived tree is walked
    assert carry["measured"] == "the arrived tree" and carry["fits_with_headroom"]
    assert "corpus 0.0" in pack.carry_line(carry)


def test_the_dry_run_refuses_a_carry_over_the_60_mib_goal(tmp_path):
    over = tmp_path / "pack"
    over.mkdir()
    with open(over / pack.ARCHIVE, "wb") as file:  # sparse: sizes count, no disk is used
        file.truncate(pack.CARRY_GOAL_BYTES)
    (over / pack.MANIFEST).write_text(json.dumps({"python": pack.DEVICE_PYTHON}))  # the GPU machine's pack
    code = run_on_device.main(["--pack", str(over), "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out"),
                               "--device", "cpu"])
    setup = json.loads((tmp_path / "out" / "gpu-setup.json").read_text())
    assert code == 1 and "over the 60 MiB goal" in setup["error"]
    carry = setup["steps"]["carry"]
    assert carry["measured"] == "git ls-files" and carry["total"] > pack.CARRY_GOAL_BYTES and not carry["fits_with_headroom"]
    assert not (tmp_path / "work").exists()  # refused before anything was unpacked
    (over / pack.MANIFEST).write_text(json.dumps({"python": "3.10"}))  # another pack than the GPU machine's: never travels
    code = run_on_device.main(["--pack", str(over), "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out2"),
                               "--device", "cpu"])
    setup = json.loads((tmp_path / "out2" / "gpu-setup.json").read_text())
    assert not setup["steps"]["carry"]["gpu_pack"] and "goal" not in setup["error"]  # went on: unpack refused the pack


# ---------------------------------------------------------------- the GPU machine's packages

# What the pack's driver/ and service/ folders hold, by import name (pack.DRIVER_DISTRIBUTIONS, SERVICE_DISTRIBUTIONS)
CARRIED = {"tritonclient", "rapidjson", "google", "pydantic", "pydantic_core", "annotated_types", "typing_inspection",
           "typing_extensions", "opentelemetry", "faiss", "pypdfium2", "pypdfium2_raw", "pypdfium2_cfg", "starlette",
           "uvicorn", "grpc_health", "grpc_reflection"}


def test_the_orchestrator_imports_with_the_machines_packages_and_the_packs_alone():
    """The deployment, its client and the end-to-end part import with nothing beyond the GPU machine's packages and
    the pack's (an import hook refuses everything else): what the end-to-end part runs there."""
    allowed = sorted(pack.DEVICE_IMPORTS | CARRIED | {"orchestrator", "thinkserve_bench", "thinkserve_build", "thinkserve_backend"})
    script = f"""
import importlib.abc, sys
ALLOWED = set({allowed!r})
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if top in ALLOWED or top in sys.stdlib_module_names or top.startswith("_"):
            return None
        raise ModuleNotFoundError(f"not on the GPU machine: {{name}}", name=name)
sys.meta_path.insert(0, Refuse())
import orchestrator.server.deployment, orchestrator.client, thinkserve_bench.target, thinkserve_bench.gpu.end_to_end
import thinkserve_bench.gpu.measurements
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


def test_the_service_packages_are_the_ones_the_orchestrator_lacks_there():
    assert set(pack.SERVICE_DISTRIBUTIONS) == {"faiss-cpu", "pypdfium2", "starlette", "uvicorn", "grpcio-health-checking",
                                               "grpcio-reflection"}
    assert not ({"faiss", "starlette", "uvicorn", "pypdfium2", "grpc_health"} & pack.DEVICE_IMPORTS)
