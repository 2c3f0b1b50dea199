"""The torch target (model_repository/tiny-torch: the same checkpoints run by PyTorch inside Triton's python
backend, tensors passed by DLPack) served by the real tritonserver on the CPU: it passes the model tests the cpu
target passes, and its answers are the onnxruntime path's."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from orchestrator.models import contracts
from orchestrator.triton.launcher import TritonServer
from orchestrator.triton.models import GenerationOptions
from tests.conftest import ROOT
from tests.integration import test_models, test_ocr
from tests.integration.test_models import TEXTS, call, png
from tests.backend.test_images import page

pytestmark = pytest.mark.integration

TORCH_REPOSITORY = ROOT / "model_repository" / "tiny-torch"

# The model tests of the cpu target, run as they are against the torch target's server.
SHARED_MODEL_TESTS = [
    test_ocr.test_pages_sent_together_are_batched_and_read_as_alone,
    test_ocr.test_blank_pages_read_as_nothing_and_bad_images_are_named,
    test_models.test_every_public_model_is_ready,
    test_models.test_encoders_answer_with_the_contract_shapes_and_dtypes,
    test_models.test_embedder_matches_the_pytorch_reference,
    test_models.test_concurrent_requests_are_batched_by_triton,
    test_models.test_the_vlm_relevance_filter_batches_pages_and_matches_single_calls,
    test_models.test_the_vlm_relevance_filter_names_a_bad_image,
    test_models.test_llm_streams_tokens_with_log_probabilities,
    test_models.test_greedy_generation_is_deterministic_and_sampling_follows_the_seed,
    test_models.test_cancelling_a_stream_stops_generation_in_the_model,
    test_models.test_vlm_describes_an_image,
    test_models.test_model_errors_name_the_model_and_the_cause,
    test_models.test_prompt_beyond_the_context_is_refused_with_the_numbers,
]


@pytest.fixture(scope="module")
def torch_triton(triton_settings):
    if not (TORCH_REPOSITORY / "llm" / "config.pbtxt").is_file():
        pytest.fail(f"{TORCH_REPOSITORY} is not built: run `make models-torch` (make test does it)")
    server = TritonServer(triton_settings.model_copy(update={"model_repository": TORCH_REPOSITORY}))
    server.start()
    yield server
    server.stop()


def test_the_torch_repository_runs_pytorch_models():
    config = (TORCH_REPOSITORY / "text_embedder_encode" / "config.pbtxt").read_text()
    assert "torch_runner import TorchRunnerModel" in (TORCH_REPOSITORY / "text_embedder_encode" / "1" / "model.py").read_text()
    assert '"runtime"' in config and "KIND_CPU" in config
    assert (TORCH_REPOSITORY / "llm" / "1" / "model.safetensors").is_file()
    # nothing of it runs on onnxruntime but PP-OCR's graphs (PaddleOCR ships no PyTorch definition of them)
    assert {path.parent.parent.name for path in TORCH_REPOSITORY.glob("*/1/*.onnx")} == {"ocr_detect", "ocr_classify", "ocr_recognize"}


@pytest.mark.parametrize("model_test", SHARED_MODEL_TESTS, ids=lambda test: test.__name__.removeprefix("test_"))
def test_the_torch_target_passes_the_model_test(torch_triton, model_test):
    model_test(torch_triton)


def encoder_outputs(models):
    async def work():
        return {
            "embed": await models.embed(TEXTS),
            "rerank": await models.rerank(TEXTS[0], TEXTS[1:]),
            "route": await models.route(TEXTS[:2]),
            "relevance": await models.page_relevance(TEXTS[0], [png(seed=4), png(70, 150, seed=5)]),
            **{f"text_{f}": await models.embed_page_text(f, TEXTS) for f in contracts.PAGE_ENCODER_FAMILIES},
            **{f"image_{f}": await models.embed_page_images(f, [png(seed=1), png(64, 200, seed=2)])
               for f in contracts.PAGE_ENCODER_FAMILIES},
        }

    return work()


def test_every_encoder_answers_as_the_onnxruntime_path_does(triton, torch_triton):
    onnx, torch = call(triton, encoder_outputs), call(torch_triton, encoder_outputs)
    assert set(onnx) == set(torch)
    for name in onnx:
        assert onnx[name].shape == torch[name].shape and torch[name].dtype == np.float32, name
        assert np.allclose(onnx[name], torch[name], atol=1e-4), (name, np.abs(onnx[name] - torch[name]).max())


def generations(models):
    async def run(prompt, images=()):
        async with models.generate(prompt, GenerationOptions(max_tokens=12), images=list(images)) as stream:
            return [chunk async for chunk in stream]

    async def work():
        return (
            await run("<|im_start|>user\nWhat was the revenue?<|im_end|>\n<|im_start|>assistant\n"),
            await run("<image>\nWhat does this chart show?", images=[png(seed=7)]),
        )

    return work()


def test_generators_stream_the_onnxruntime_paths_tokens(triton, torch_triton):
    onnx, torch = call(triton, generations), call(torch_triton, generations)
    for expected, served in zip(onnx, torch):  # the LLM, then the VLM with an image
        assert [t for c in served for t in c.token_ids] == [t for c in expected for t in c.token_ids]
        assert "".join(c.text for c in served) == "".join(c.text for c in expected)
        assert np.allclose([p for c in served for p in c.log_probs], [p for c in expected for p in c.log_probs], atol=1e-3)
        assert served[-1].prompt_tokens == expected[-1].prompt_tokens and served[-1].finish_reason == expected[-1].finish_reason


def float_pixel_embeddings(family: str, pixels: np.ndarray) -> np.ndarray:
    """The float path in-process: the family's checkpoint (the torch target's files; the cpu target's graphs were
    exported from the same recipe) fed normalised float32 pixels, as the towers were fed before."""
    import torch
    from transformers import AutoModel

    from thinkserve_backend.torch_modules import pooled

    model = AutoModel.from_pretrained(str(TORCH_REPOSITORY / f"{contracts.page_image_encoder(family).name}_encode" / "1")).eval()
    with torch.no_grad():
        return torch.nn.functional.normalize(pooled(model.get_image_features(pixel_values=torch.from_numpy(pixels))), dim=-1).numpy()


def tower_config(repository, model: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse((repository / model / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())


@pytest.mark.parametrize("target", ["cpu", "torch"])
def test_page_images_sent_as_bytes_embed_as_float_pixels_do(request, target):
    """JPEG and PNG bytes through each page-image ensemble (uint8 pixels between its steps, normalised inside the
    tower: the cpu target's ONNX graph, the torch target's module) against the float-pixel path in-process."""
    from thinkserve_backend.images import ImagePreprocessing, normalise, pixels_of

    server = request.getfixturevalue("triton" if target == "cpu" else "torch_triton")
    repository = TORCH_REPOSITORY if target == "torch" else TORCH_REPOSITORY.parent / "tiny"
    images = [page("JPEG"), page("PNG", (700, 500)), png(seed=3), png(64, 200, seed=4)]
    served = call(server, lambda models: _embed_every_family(models, images))
    for family, (embeddings, sent) in served.items():
        name = contracts.page_image_encoder(family).name
        spec = ImagePreprocessing.from_json(tower_config(repository, f"{name}_preprocess").parameters["preprocessing"].string_value)
        tower = tower_config(repository, f"{name}_encode").input[0]
        assert (tower.name, tower.data_type) == ("pixels", model_config_pb2.TYPE_UINT8)
        assert sent.dtype == np.uint8 and sent.shape == (len(images), 3, spec.height, spec.width)  # 3 bytes a pixel
        # the very pixels the preprocess step sent, normalised as it did before, into the tower in fp32
        expected = float_pixel_embeddings(family, np.stack([normalise(pixels, spec) for pixels in sent]))
        assert embeddings.shape == expected.shape
        assert np.abs(embeddings - expected).max() <= 1e-5, (family, np.abs(embeddings - expected).max())
        # and the whole float path here, decoding included: both environments pin one Pillow (13.0 in Triton's
        # against the project's 12.3 resized by up to 9 levels where the aspect ratio changes: SigLIP 3.9e-3 apart)
        local = float_pixel_embeddings(family, np.stack([pixels_of(image, spec) for image in images]))
        assert np.abs(embeddings - local).max() <= 1e-5, (family, np.abs(embeddings - local).max())


async def _embed_every_family(models, images: list[bytes]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each family's embeddings of the images through its ensemble, and the pixels its preprocess step sends."""
    out = {}
    for family in contracts.PAGE_ENCODER_FAMILIES:
        name = contracts.page_image_encoder(family).name
        step = await models.client.infer(f"{name}_preprocess", {"image": np.array([[i] for i in images], dtype=np.object_)}, ["pixels"])
        out[family] = (await models.embed_page_images(family, images), step["pixels"])
    return out
