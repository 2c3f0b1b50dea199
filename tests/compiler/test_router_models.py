"""The router without a trained head (the LLM asked, in its own chat format) and the router trained from a
user's labelled questions (`thinkserve-build train-router`), up to the ONNX graph Triton would serve."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from orchestrator import prompts
from orchestrator.models import contracts
from tests.compiler.test_compiler import CACHE
from tests.router_questions import labelled_questions
from thinkserve_build import cli, export, onnx_tools, profiles, train_router
from thinkserve_build.artifacts import build
from thinkserve_build.checkpoints import resolve
from thinkserve_build.targets import CpuTarget


def write_questions(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_the_prompt_router_serves_the_llms_files_with_the_question_in_its_chat_format(model_repository):
    profile = profiles.tiny()
    llm_spec = profile.llm
    llm, _ = build("llm", llm_spec, resolve(llm_spec.checkpoint, CACHE), CACHE, lambda location, out: export.export_llm(location, llm_spec, out))
    planned = CpuTarget().prompt_router(contracts.ROUTER, llm, profiles.PromptRouterSpec(), profile.serving)
    config = planned.config
    assert config.name == "router" and config.backend == "python" and planned.python_class.endswith("prompt_classifier:PromptClassifierModel")
    parameters = {key: value.string_value for key, value in config.parameters.items()}
    assert json.loads(parameters["labels"]) == list(contracts.ROUTE_LABELS)
    assert parameters["prompt"] == (
        f"<|im_start|>system\n{prompts.ROUTE_SYSTEM}<|im_end|>\n<|im_start|>user\nQuestion: {{question}}\n"
        "Is it simple, moderate or complex?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert set(planned.files) == {parameters["decoder_file"], "tokenizer.json"}  # the LLM's own files
    assert [t.name for t in config.output] == ["probabilities"] and list(config.output[0].dims) == [3]


def test_the_hf_profile_asks_the_llm_unless_a_trained_router_is_given():
    assert isinstance(profiles.hf().router, profiles.PromptRouterSpec)
    trained = profiles.hf().with_router_checkpoint("/models/my-router")
    assert trained.router == profiles.ClassifierSpec(profiles.Checkpoint(hub_id="/models/my-router"), max_length=256)


@pytest.mark.parametrize("line, error", [
    ("not json", "questions.jsonl:2: not JSON"),
    ('{"question": "Why?", "route": "hard"}', "questions.jsonl:2: \"route\" must be one of simple, moderate, complex, got 'hard'"),
    ('{"route": "simple"}', "questions.jsonl:2: needs a non-empty \"question\" string"),
])
def test_bad_training_lines_are_named(tmp_path, line, error):
    path = tmp_path / "questions.jsonl"
    path.write_text('{"question": "What was revenue?", "route": "simple"}\n' + line + "\n")
    with pytest.raises(ValueError, match=error.replace("(", r"\(").replace(")", r"\)")):
        train_router.read_questions(path)


def test_one_route_only_cannot_train_a_router(tmp_path):
    path = write_questions(tmp_path / "q.jsonl", [{"question": "What was revenue?", "route": "simple"}] * 5)
    with pytest.raises(ValueError, match="at least two routes"):
        train_router.read_questions(path)
    assert cli.main(["train-router", "--questions", str(path), "--base", "x", "--output", str(tmp_path / "o")]) == 1


def test_a_router_trained_on_labelled_questions_routes_new_ones_through_the_exported_graph(tmp_path):
    """The tiny profile's random-weight router checkpoint, fine-tuned on 120 generated questions (lr 1e-3: the
    pretrained-encoder default of 5e-5 is for encoders that already know language), then exported as a build
    would, answers questions it never saw with the route of their kind."""
    base = resolve(profiles.tiny().router.checkpoint, CACHE).location
    path = write_questions(tmp_path / "questions.jsonl", labelled_questions(40))
    assert cli.main(["train-router", "--questions", str(path), "--base", base, "--output", str(tmp_path / "router"),
                     "--epochs", "15", "--learning-rate", "1e-3"]) == 0
    report = json.loads((tmp_path / "router" / "training_report.json").read_text())
    assert report["examples"] == 120 and report["held_out"] == 12
    assert report["losses"][-1] < report["losses"][0] / 10 and report["held_out_accuracy"] >= 0.9

    spec = profiles.tiny().with_router_checkpoint(str(tmp_path / "router")).router
    (tmp_path / "onnx").mkdir()
    facts = export.export_classifier(str(tmp_path / "router"), spec, tmp_path / "onnx", contracts.ROUTE_LABELS, "probabilities", False)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "router"))
    unseen = labelled_questions(5, seed=99)
    encoded = tokenizer([row["question"] for row in unseen], padding=True, return_tensors="np")
    (probabilities,) = onnx_tools.run(tmp_path / "onnx" / facts["onnx_file"], {n: encoded[n] for n in facts["inputs"]}, ["probabilities"])
    assert np.allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
    assert [contracts.ROUTE_LABELS[i] for i in probabilities.argmax(axis=1)] == [row["route"] for row in unseen]
