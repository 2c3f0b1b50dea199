"""Deployment variants of the ablations: the no-dynamic-batching repository is hard links to the tiny repository
with only the configs rewritten (the original is never written), and a variant takes exactly the models whose
config differs from another build."""

from __future__ import annotations

import shutil

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from thinkserve_bench.variants import (NO_BATCHING, OLD_QUEUE_POLICY, QUEUE_POLICY, remove_block, variant_repositories,
                                       with_models_from)
from tests.conftest import require_repository


def test_remove_block_takes_nested_blocks_and_nothing_else():
    text = ('name: "m"\nmax_batch_size: 8\ndynamic_batching {\n  max_queue_delay_microseconds: 200\n'
            '  priority_queue_policy {\n    key: 1\n    value { timeout_action: REJECT }\n  }\n}\n'
            'parameters {\n  key: "dynamic_batching_note"\n  value { string_value: "{" }\n}\n')
    out = remove_block(text, "dynamic_batching")
    assert out == 'name: "m"\nmax_batch_size: 8\nparameters {\n  key: "dynamic_batching_note"\n  value { string_value: "{" }\n}\n'
    assert remove_block(out, "dynamic_batching") == out
    with pytest.raises(ValueError, match="unbalanced"):
        remove_block("dynamic_batching {\n  x: 1\n", "dynamic_batching")


def _config(path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def test_no_batching_repository_is_links_with_rewritten_configs():
    tiny = require_repository()
    originals = {p: p.read_text() for p in tiny.glob("*/config.pbtxt")}
    with variant_repositories(tiny, [NO_BATCHING], "tiny") as variants:
        variant = variants[NO_BATCHING]
        batched = sorted(p.parent.name for p, text in originals.items() if _config(p).HasField("dynamic_batching"))
        assert sorted(variant.changed) == batched and "text_embedder_encode" in batched
        for path in originals:
            copy = variant.path / path.parent.name / "config.pbtxt"
            expected = _config(path)
            expected.ClearField("dynamic_batching")
            assert _config(copy) == expected  # everything else as it was
            assert copy.stat().st_ino != path.stat().st_ino
        weights = tiny / "text_embedder_encode" / "1" / "encoder.onnx"
        assert (variant.path / "text_embedder_encode" / "1" / "encoder.onnx").stat().st_ino == weights.stat().st_ino
        folder = variant.path.parent
    assert not folder.exists()  # removed after the run
    assert {p: p.read_text() for p in tiny.glob("*/config.pbtxt")} == originals  # the original never written


def test_the_queue_policy_repository_adds_the_old_policy_to_every_batched_model_and_nothing_else():
    tiny = require_repository()
    originals = {p: p.read_text() for p in tiny.glob("*/config.pbtxt")}
    with variant_repositories(tiny, [QUEUE_POLICY], "tiny") as variants:
        variant = variants[QUEUE_POLICY]
        batched = sorted(p.parent.name for p in originals if _config(p).HasField("dynamic_batching"))
        assert sorted(variant.changed) == batched and "llm" in batched and "text_embedder_encode" in batched
        for path in originals:
            copy, expected = _config(variant.path / path.parent.name / "config.pbtxt"), _config(path)
            if expected.HasField("dynamic_batching"):
                policy = copy.dynamic_batching.default_queue_policy
                assert {name: getattr(policy, name) for name in OLD_QUEUE_POLICY} == OLD_QUEUE_POLICY
                assert policy.timeout_action == model_config_pb2.ModelQueuePolicy.REJECT
                copy.dynamic_batching.ClearField("default_queue_policy")
            assert copy == expected  # everything else as it was
    assert {p: p.read_text() for p in tiny.glob("*/config.pbtxt")} == originals  # the original never written


def test_an_ablations_run_starts_the_queue_policy_deployment_only_when_named():
    from thinkserve_bench.variants import INT8, wanted_variants

    assert wanted_variants("ablations", None) == [NO_BATCHING, INT8]
    assert wanted_variants("ablations", [QUEUE_POLICY, "no graph"]) == [QUEUE_POLICY]
    assert wanted_variants("ablations", ["no graph"]) == []
    assert wanted_variants("load", [QUEUE_POLICY]) == []


def test_models_whose_config_differs_are_taken_from_the_other_build(tmp_path):
    tiny = require_repository()
    other = tmp_path / "int8"
    shutil.copytree(tiny / "text_embedder_encode", other / "text_embedder_encode", ignore=shutil.ignore_patterns("*.onnx", "__pycache__"))
    (other / "text_embedder_encode" / "1" / "encoder.int8.onnx").write_bytes(b"int8")
    config = other / "text_embedder_encode" / "config.pbtxt"
    config.write_text(config.read_text().replace('"encoder.onnx"', '"encoder.int8.onnx"'))
    shutil.copytree(tiny / "reranker", other / "reranker")  # the same config: stays the baseline's
    taken = with_models_from(tiny, other, tmp_path / "variant")
    assert taken == ["text_embedder_encode"]
    assert (tmp_path / "variant" / "text_embedder_encode" / "1" / "encoder.int8.onnx").read_bytes() == b"int8"
    assert not (tmp_path / "variant" / "text_embedder_encode" / "1" / "encoder.onnx").exists()
    assert (tmp_path / "variant" / "reranker" / "config.pbtxt").stat().st_ino == (tiny / "reranker" / "config.pbtxt").stat().st_ino
    assert sorted(p.name for p in (tmp_path / "variant").iterdir()) == sorted(p.parent.name for p in tiny.glob("*/config.pbtxt"))


def test_self_started_deployments_take_free_ports_so_several_can_run(tmp_path):
    from thinkserve_bench.target import bench_settings_for
    from orchestrator.config import Settings

    settings = bench_settings_for(Settings(server={"port": 50051}, http={"port": 50052}), tmp_path)
    assert (settings.server.port, settings.http.port) == (0, 0) and settings.storage.data_dir == tmp_path
