"""The gpu target's hand-over to TensorRT-LLM: what the converter of the pinned container reads from the checkpoints
the build puts in `<repository>.engines/`, and the checks build_engines.sh runs inside that container.

Nothing here runs TensorRT-LLM (it cannot be installed on these machines): the converter's reads are transcribed
from its sources (tests/backend/trtllm_recorded/converter_reads.json), and build_engines.sh's checks run here on
files shaped as the container's are."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from thinkserve_build import recipes, trtllm_engines
from thinkserve_build.trtllm_engines import EngineSpec

RECORDED = json.loads((ROOT / "tests" / "backend" / "trtllm_recorded" / "converter_reads.json").read_text())


def converter_reads(config: dict) -> dict:
    """What TensorRT-LLM 0.20's QWenConfig.from_hugging_face takes from a config.json loaded by transformers 4.x:
    the attribute when config.json has it, else transformers 4.x's Qwen2Config default (the attribute always
    exists there, so the converter's own getattr fallback never applies)."""
    defaults = RECORDED["transformers4_qwen2_defaults"]
    return {field: config.get(read["attribute"], defaults[read["attribute"]]) for field, read in RECORDED["reads"].items()}


@pytest.fixture(scope="module")
def qwen_rope_checkpoint(tmp_path_factory) -> Path:
    """The tiny decoder with Qwen's RoPE base (1,000,000), saved by this machine's transformers."""
    out = tmp_path_factory.mktemp("checkpoint") / "tiny-qwen2-rope"
    out.mkdir()
    recipes.RECIPES["tiny-qwen2-rope"](out)
    return out


def test_the_engines_checkpoint_carries_the_rope_base_the_pinned_converter_reads(qwen_rope_checkpoint, tmp_path):
    """transformers 5 saves the RoPE base under rope_parameters only; TensorRT-LLM 0.20's converter (on transformers
    4.x) then reads 10,000 instead of Qwen's 1,000,000: the engine builds and generates garbage. The checkpoint the
    build hands over must carry the setting where that converter reads it."""
    import transformers

    saved = json.loads((qwen_rope_checkpoint / "config.json").read_text())
    if int(transformers.__version__.split(".")[0]) >= 5:  # what made the hand-over wrong
        assert "rope_theta" not in saved and saved["rope_parameters"]["rope_theta"] == recipes.QWEN_ROPE_THETA
    spec = EngineSpec("llm_engine", "llm", qwen_rope_checkpoint, "qwen2", max_batch_size=2, max_seq_len=512)
    folder = trtllm_engines.write_engines_folder(tmp_path / "repo", [spec], "/engines")
    handed = json.loads((folder / "checkpoints" / "llm" / "config.json").read_text())
    assert converter_reads(handed) == {"rotary_base": recipes.QWEN_ROPE_THETA, "rotary_scaling": None}
    # the build's own checkpoint is left as it was (the engines folder holds hard links to the build cache)
    assert json.loads((qwen_rope_checkpoint / "config.json").read_text()) == saved
    # and build_engines.sh refuses a converted checkpoint whose RoPE base is not that one
    assert f"check_rope llm {recipes.QWEN_ROPE_THETA!r}" in (folder / "build_engines.sh").read_text()


def test_rope_scaling_and_a_conflicting_base_are_handed_over_or_refused():
    scaled = trtllm_engines.converter_config({"model_type": "qwen2", "rope_parameters": {
        "rope_theta": 1e6, "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}})
    assert converter_reads(scaled) == {"rotary_base": 1e6, "rotary_scaling": {
        "type": "yarn", "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}
    old = {"model_type": "qwen2", "rope_theta": 1e6, "rope_scaling": None}  # saved by transformers 4: unchanged
    assert trtllm_engines.converter_config(old) == old
    with pytest.raises(ValueError, match="rope_theta"):
        trtllm_engines.converter_config({"rope_theta": 1e4, "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}})
    with pytest.raises(ValueError, match="no RoPE base"):
        trtllm_engines.converter_config({"model_type": "qwen2"})


def _checks(tmp_path: Path) -> Path:
    """build_engines.sh's Python checks, as the script writes them beside itself."""
    spec = EngineSpec("llm_engine", "llm", _small_checkpoint(tmp_path), "qwen2", 2, 512)
    folder = trtllm_engines.write_engines_folder(tmp_path / "repo", [spec], "/engines")
    return folder / trtllm_engines.CHECKS_FILE


def _small_checkpoint(tmp_path: Path) -> Path:
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({"model_type": "qwen2", "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}}))
    (checkpoint / "model.safetensors").write_bytes(b"weights")
    return checkpoint


def test_build_engines_refuses_a_converted_checkpoint_with_another_rope_base(tmp_path):
    checks = _checks(tmp_path)
    converted = tmp_path / "converted.json"
    converted.write_text(json.dumps({"architecture": "QWenForCausalLM", "rotary_base": 10000.0}))
    result = subprocess.run([sys.executable, str(checks), "rope", str(converted), "1000000.0"], capture_output=True, text=True)
    assert result.returncode == 1 and "rotary_base 10000.0" in result.stderr and "1000000.0" in result.stderr
    converted.write_text(json.dumps({"architecture": "QWenForCausalLM", "rotary_base": 1000000.0}))
    assert subprocess.run([sys.executable, str(checks), "rope", str(converted), "1000000.0"]).returncode == 0


def test_build_engines_checks_the_names_the_configs_use_against_the_containers_backend(tmp_path):
    """The pinned release's own backend library decides: a parameter or input name it does not contain is refused
    before any engine is built; one it holds only inside a longer name (random_seed for seed) is refused too."""
    checks = _checks(tmp_path)
    library = tmp_path / "backends" / "tensorrtllm"
    library.mkdir(parents=True)
    names = trtllm_engines.backend_names()
    assert {"seed", "gpt_model_path", "enable_chunked_context", "return_generation_logits"} <= set(names)
    body = b"\0".join(name.encode() for name in names if name != "seed")
    (library / "libtriton_tensorrtllm.so").write_bytes(b"\x7fELF\0" + body + b"\0random_seed\0other\0")
    result = subprocess.run([sys.executable, str(checks), "names", str(library)], capture_output=True, text=True)
    assert result.returncode == 1 and re.search(r"seed.*random_seed", result.stderr), result.stderr
    (library / "libtriton_tensorrtllm.so").write_bytes(b"\x7fELF\0" + body + b"\0seed\0")
    result = subprocess.run([sys.executable, str(checks), "names", str(library)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_standin_decoders_use_qwens_rope_base():
    """The standin profile's LLM and VLM decoder carry their checkpoints' RoPE base, so the GPU runs see what the
    hf profile's Qwen models hand over."""
    from thinkserve_build.standins import standins

    class Tokenizer:
        @staticmethod
        def convert_tokens_to_ids(token: str) -> int:
            return {"<|im_end|>": 4097, "<|endoftext|>": 4096}[token]

    for role in ("llm", "vlm"):
        config = recipes._standin_text_config(standins("hf")[role].config, Tokenizer()).to_dict()
        assert converter_reads(trtllm_engines.converter_config(config))["rotary_base"] == 1_000_000.0, role


def test_the_recorded_converter_is_the_pinned_images():
    """The transcribed converter reads and the checks are for the release the Dockerfile pins: bumping the image
    means checking them again (and the build step checks the names in the container itself)."""
    pinned = re.search(r"^ARG TRITON_RELEASE=(\S+)$", (ROOT / "Dockerfile").read_text(), re.M).group(1)
    assert RECORDED["pinned_release"]["triton"] == pinned
    parameters = json.loads((ROOT / "tests" / "backend" / "trtllm_recorded" / "backend_parameters.json").read_text())
    assert parameters["pinned_release"] == RECORDED["pinned_release"]
