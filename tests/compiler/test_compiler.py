"""The model compiler: caching, the int8 embedder, and the hf profile sharing the tiny profile's code."""

import math
import os
from dataclasses import replace

from types import SimpleNamespace

import pytest

from orchestrator.models.chat_template import ChatTemplate
from tests.conftest import ROOT
from tests.model_double import CHATML
from thinkserve_build import artifacts, calibration, compiler, export, onnx_tools, profiles
from thinkserve_build.checkpoints import ResolvedCheckpoint, resolve

CACHE = ROOT / ".thinkserve" / "cache"


def test_unchanged_inputs_are_not_rebuilt_and_weights_are_linked_not_copied(model_repository, tmp_path):
    lines = []
    output = tmp_path / "repo"
    models = compiler.compile_repository(profiles.tiny(), output, CACHE, log=lines.append)
    assert sum("unchanged (cached)" in line for line in lines) == len(list(compiler._jobs(profiles.tiny(), print))), lines
    onnx = output / "text_embedder_encode" / "1" / "encoder.onnx"
    assert os.stat(onnx).st_ino == os.stat(model_repository / "text_embedder_encode" / "1" / "encoder.onnx").st_ino
    lines.clear()
    compiler.compile_repository(profiles.tiny(), output, CACHE, log=lines.append)
    assert f"{len(models)} models, 0 written, 0 removed" in lines[-1]


def test_the_fingerprint_follows_the_spec():
    checkpoint = ResolvedCheckpoint("somewhere", "id-1")
    fp32 = profiles.tiny().embedder
    assert artifacts.fingerprint("embedder", fp32, checkpoint) == artifacts.fingerprint("embedder", fp32, checkpoint)
    assert artifacts.fingerprint("embedder", fp32, checkpoint) != artifacts.fingerprint(
        "embedder", replace(fp32, precision="int8"), checkpoint
    )
    assert artifacts.fingerprint("embedder", fp32, checkpoint) != artifacts.fingerprint(
        "embedder", fp32, ResolvedCheckpoint("somewhere", "id-2")
    )


def test_int8_embedder_stays_close_to_fp32(model_repository, tmp_path):
    spec = replace(profiles.tiny().embedder, precision="int8")
    location = resolve(spec.checkpoint, CACHE).location
    facts = export.export_embedder(location, spec, tmp_path, log=lambda _: None)
    assert facts["precision"] == "int8" and facts["onnx_file"] == "encoder.int8.onnx"
    assert not (tmp_path / "encoder.onnx").exists()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(location)
    texts = ["Total revenue grew 18 percent.", "Who is the chief executive?", "Energy per instrument fell."]
    batch = dict(tokenizer(texts, padding=True, return_tensors="np"))
    int8 = onnx_tools.run(tmp_path / "encoder.int8.onnx", batch, ["embedding"])[0]
    fp32 = onnx_tools.run(model_repository / "text_embedder_encode" / "1" / "encoder.onnx", batch, ["embedding"])[0]
    assert onnx_tools.min_cosine(int8, fp32) >= 0.98


def test_hf_profile_runs_the_same_exporters_with_hub_checkpoints():
    tiny_jobs = list(compiler._jobs(profiles.tiny(), print))
    hf_jobs = list(compiler._jobs(profiles.hf().with_router_checkpoint("someone/router"), print))
    assert [(role, job.func) for role, _, job in tiny_jobs] == [(role, job.func) for role, _, job in hf_jobs]
    asking = [role for role, _, _ in compiler._jobs(profiles.hf(), print)]  # the router asks the LLM: no export of its own
    assert asking == [role for role, _, _ in tiny_jobs if role != "router"]
    for role, spec, _ in hf_jobs:
        if role == "ocr":  # PP-OCRv4's trained weights come from their PyPI package in every profile, hf's too
            assert spec.checkpoint == profiles.PP_OCR_V4 and resolve(spec.checkpoint, CACHE).identity.startswith("rapidocr")
            continue
        assert spec.checkpoint.hub_id
        resolved = resolve(spec.checkpoint, CACHE)  # a hub id resolves without downloading
        assert resolved.location == spec.checkpoint.hub_id and resolved.identity.startswith("hub:")


def test_unknown_profile_and_target_are_named():
    with pytest.raises(ValueError, match="unknown profile 'huge'"):
        profiles.load_profile("huge")
    from thinkserve_build.target_choice import select_target

    with pytest.raises(ValueError, match="unknown target 'tpu'"):
        select_target("tpu")


def test_cli_reports_errors_in_one_line(capsys):
    from thinkserve_build.cli import main

    assert main(["--profile", "tiny", "--target", "tpu", "--cache", str(CACHE), "--output", "/nonexistent/x"]) == 1
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "unknown target 'tpu'" in error


def test_exported_decoder_matches_pytorch_greedy_decoding(tmp_path):
    spec = profiles.tiny().llm
    location = resolve(spec.checkpoint, CACHE).location
    facts = export.export_llm(location, spec, tmp_path)  # raises ExportMismatchError on any divergence
    assert facts["eos_token_ids"] and facts["max_context"] == 2048
    assert (tmp_path / facts["decoder_file"]).is_file()
    assert 0 < facts["judger_entropy_nats"] < math.log(facts["vocab_size"])  # calibrated on the exported decoder
    assert 0 < facts["judger_surprisal_nats"] < 2 * math.log(facts["vocab_size"])  # on probes sampled at temperature 1


def test_the_orchestrators_rendering_of_the_tiny_llms_template_is_its_tokenizers(tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve(profiles.tiny().llm.checkpoint, CACHE).location)
    chat_format = export._chat_format(tokenizer, profiles.tiny().llm, "tiny-qwen2")
    chat = ChatTemplate(chat_format["chat_template"], chat_format["chat_template_variables"])
    turns = (("user", "Before?"), ("assistant", "Yes [1]."))
    messages = [{"role": "system", "content": "Rules."}, *({"role": r, "content": t} for r, t in turns), {"role": "user", "content": "Now?"}]
    assert chat("Rules.", "Now?", turns) == tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_a_generator_without_a_chat_template_needs_one_in_its_spec():
    bare = SimpleNamespace(chat_template=None, special_tokens_map={"eos_token": "</s>", "additional_special_tokens": ["<x>"]})
    with pytest.raises(ValueError, match="no chat template; give the profile's GeneratorSpec.chat_template"):
        export._chat_format(bare, profiles.tiny().llm, "some/base-model")
    spec = replace(profiles.tiny().llm, chat_template="{{ messages[-1]['content'] }}")
    assert export._chat_format(bare, spec, "some/base-model") == {
        "chat_template": "{{ messages[-1]['content'] }}", "chat_template_variables": {"eos_token": "</s>"},
    }


def test_the_judger_threshold_is_the_chosen_percentile_of_the_probes_mean_entropies_in_nats():
    prompts = calibration.probe_prompts(CHATML)
    assert len(prompts) == len(calibration.CALIBRATION) >= 16 and all("Evidence:\n[1]" in p for p in prompts)
    index = {prompt: i for i, prompt in enumerate(prompts)}
    vocabulary = 1000

    def probe(prompt: str) -> list[float]:  # the i-th probe's tokens average (i + 1) / 100 of ln(vocabulary)
        share = (index[prompt] + 1) / 100
        return [share - 0.01, share, share + 0.01]

    values = [(i + 1) / 100 * math.log(vocabulary) for i in range(len(prompts))]
    assert calibration.judger_threshold(probe, CHATML, vocabulary, 50) == pytest.approx(sorted(values)[len(values) // 2 - 1] / 2 + sorted(values)[len(values) // 2] / 2)
    assert calibration.judger_threshold(probe, CHATML, vocabulary, 100) == pytest.approx(max(values))


def test_the_surprisal_threshold_is_the_chosen_percentile_of_the_sampled_probes_mean_surprisal():
    index = {prompt: i for i, prompt in enumerate(calibration.probe_prompts(CHATML))}

    def sampled_probe(prompt: str) -> list[float]:  # the i-th probe's tokens average -(i + 1) / 10 nats
        mean = -(index[prompt] + 1) / 10
        return [mean - 0.05, mean, mean + 0.05]

    values = sorted((i + 1) / 10 for i in range(len(index)))
    assert calibration.surprisal_threshold(sampled_probe, CHATML, 1000, 100) == pytest.approx(values[-1])
    assert calibration.surprisal_threshold(sampled_probe, CHATML, 1000, 0) == pytest.approx(values[0])


def test_a_target_this_machine_cannot_serve_fails_in_one_line_before_any_export(capsys, monkeypatch):
    import torch

    from thinkserve_build.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["--profile", "tiny", "--target", "torch", "--device", "cuda", "--cache", str(CACHE), "--output", "/nonexistent/x"]) == 1
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "target torch on cuda needs a CUDA GPU" in error
    assert main(["--profile", "tiny", "--target", "gpu", "--device", "cpu", "--cache", str(CACHE), "--output", "/nonexistent/x"]) == 1
    assert "the gpu target serves on NVIDIA GPUs" in capsys.readouterr().err


def test_the_torch_target_takes_the_gpu_only_when_torch_sees_one(monkeypatch):
    import torch

    from thinkserve_build.target_choice import select_target

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert select_target("torch").device == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    chosen = select_target("torch")
    assert chosen.device == "cuda" and chosen.instance_kind == "gpu"


def test_the_judgers_calibration_runs_on_a_gpu_only_for_a_torch_checkpoint_where_torch_sees_one(monkeypatch):
    """On the GPU machine the 1.5B stand-in's 32 calibration probes took most of the build on the CPU; with the
    torch checkpoint written they run on the GPU (float32, the same loop). ONNX alone, or no GPU: on the CPU."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert export.calibration_device(frozenset({export.TORCH})).type == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert export.calibration_device(frozenset({export.TORCH, export.ONNX})).type == "cuda"
    assert export.calibration_device(frozenset({export.ONNX})).type == "cpu"
