"""The router that asks the LLM (the hf profile's default), served by the real Triton from the tiny LLM's files:
its probabilities are the ones the LLM's next-token distribution gives after the routing prompt."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from tokenizers import Tokenizer

from orchestrator.models import contracts
from orchestrator.triton.client import TritonClient
from orchestrator.triton.launcher import TritonServer
from orchestrator.triton.models import TritonModels
from tests.compiler.test_compiler import CACHE
from thinkserve_backend.decoding import KVCacheDecoder
from thinkserve_backend.relevance import first_token_ids, label_probabilities, spellings
from thinkserve_build import export, onnx_tools, profiles, repository
from thinkserve_build.targets import CpuTarget
from thinkserve_build.artifacts import build
from thinkserve_build.checkpoints import resolve

pytestmark = pytest.mark.integration

QUESTIONS = ["What was revenue in 2023?", "Compare the margins of both segments and explain why they diverged after 2021."]


@pytest.fixture(scope="module")
def prompt_router(triton_settings, tmp_path_factory):
    spec = profiles.tiny().llm
    llm, _ = build("llm", spec, resolve(spec.checkpoint, CACHE), CACHE, lambda location, out: export.export_llm(location, spec, out))
    planned = CpuTarget().prompt_router(contracts.ROUTER, llm, profiles.PromptRouterSpec(), profiles.tiny().serving)
    folder = tmp_path_factory.mktemp("prompt-router-repo")
    repository.write([planned], folder)
    server = TritonServer(triton_settings.model_copy(update={"model_repository": folder}), (contracts.ROUTER,))
    server.start()
    yield server, planned, folder
    server.stop()


def expected_probabilities(planned, folder) -> np.ndarray:
    """The same arithmetic outside Triton: the prompt, one prefill, the labels' first tokens."""
    parameters = {key: value.string_value for key, value in planned.config.parameters.items()}
    version = folder / "router" / "1"
    tokenizer = Tokenizer.from_file(str(version / "tokenizer.json"))
    decoder = KVCacheDecoder(onnx_tools.session(version / parameters["decoder_file"]))

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False).ids

    labels = [first_token_ids(encode, spellings(label)) for label in contracts.ROUTE_LABELS]
    rows = []
    for question in QUESTIONS:
        ids = np.array([encode(parameters["prompt"].replace("{question}", question))], dtype=np.int64)
        rows.append(label_probabilities(decoder.prefill_logits(ids), labels)[0])
    return np.stack(rows)


def test_the_llm_router_answers_the_router_contract_with_the_llms_label_probabilities(prompt_router):
    server, planned, folder = prompt_router

    async def route():
        async with TritonClient(server.endpoints.grpc, default_timeout_s=60) as client:
            return await TritonModels(client).route(QUESTIONS)

    served = asyncio.run(route())
    assert served.shape == (2, len(contracts.ROUTE_LABELS)) and np.allclose(served.sum(axis=1), 1.0, atol=1e-5)
    assert np.allclose(served, expected_probabilities(planned, folder), atol=1e-5)
