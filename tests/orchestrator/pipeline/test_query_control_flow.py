"""The query pipeline's control flow, fast: degradation, deadlines, the LLM's fallback, the judger's loop.

Documents are ingested through the real Ingestor and asked through the QueryPipeline the server runs, with
the in-process model double (tests/model_double.py) in place of Triton. The same paths run against the real
Triton in tests/integration/test_query_pipeline.py (the LLM missing, the uncertainty loop, the page filter)
and tests/integration/test_service.py (deadlines).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from dataclasses import replace

import pytest

from orchestrator.api.read_ahead import read_ahead
from orchestrator.config import Settings
from orchestrator.errors import ModelExecutionError, TritonUnavailableError
from orchestrator.knowledge.ingest import Ingestor
from orchestrator.knowledge.storage.registry import KnowledgeBase
from orchestrator.pipeline.events import AnswerDeltaEvent, EvidenceEvent, FinalAnswerEvent, RouteEvent
from orchestrator.pipeline.plan import QueryOptions
from orchestrator.pipeline.query import QueryInput, QueryPipeline
from orchestrator.models.tokens import PlainTokenizer
from orchestrator.models import contracts
from orchestrator.models.protocol import GeneratorFacts
from tests.conftest import MODEL_REPOSITORY
from tests.model_double import CHATML_TEMPLATE, InProcessModels

COLLECTION = "reports"
DOCUMENTS = {
    "northwind.md": "# Northwind annual report\n\nNorthwind's revenue was 412 million euros in 2024, up from 380 million.\n\n"
                    "## Staff\n\nNorthwind employed 1,250 people at the end of the year.",
    "contoso.md": "# Contoso\n\nContoso opened three new warehouses in Lisbon, Porto and Faro during 2024.",
}
QUESTION = "What was Northwind's revenue in 2024?"


def settings(**overrides) -> Settings:
    return Settings.load(overrides={"triton": {"model_repository": str(MODEL_REPOSITORY)}, **overrides})


@pytest.fixture
def ask(tmp_path):
    """ask(options, models=..., settings=..., deadline_s=...) -> (events, final) after ingesting DOCUMENTS."""
    pipelines: list[QueryPipeline] = []

    def run(options: QueryOptions, models: InProcessModels | None = None, config: Settings | None = None,
            deadline_s: float = 30.0):
        models = models or InProcessModels()
        config = config or settings()
        knowledge = KnowledgeBase(tmp_path / f"data{len(pipelines)}")
        pipeline = QueryPipeline(config, models, knowledge, PlainTokenizer(config.tokenizer_file, "ingest.tokenizer"))
        pipelines.append(pipeline)
        failures, models.failures = models.failures, {}  # ingest with every model up, and at full speed
        delays, models.delays = models.delays, {}
        ingestor = Ingestor(knowledge, models, config.ingest, config.tokenizer_file)

        async def go():
            for name, text in DOCUMENTS.items():
                await ingestor.ingest(COLLECTION, name, text.encode())
            models.failures, models.delays, models.calls[:] = failures, delays, []
            return [event async for event in pipeline.run(QueryInput(COLLECTION, QUESTION, options), time.monotonic() + deadline_s)]

        events = asyncio.run(go())
        final = events[-1]
        assert isinstance(final, FinalAnswerEvent)
        return events, final

    yield run
    for pipeline in pipelines:
        pipeline.close()


def answer_text(events) -> str:
    return "".join(event.text for event in events if isinstance(event, AnswerDeltaEvent))


def test_the_llm_answer_streams_with_its_citation_and_cost(ask):
    models = InProcessModels()
    events, final = ask(QueryOptions(answerer="llm", route="simple"), models)
    assert (final.answer_source, final.degraded) == ("llm", False)
    assert final.text == models.answer and answer_text(events).strip() == models.answer
    assert final.citations[0].document_name == "northwind.md"  # [1] is the passage that holds the revenue
    llm = next(u for u in final.cost.usage if u.model == contracts.LLM.name)
    assert (llm.calls, llm.tokens_out) == (1, len(models.answer.split())) and llm.tokens_in > 0
    assert [e.__class__ for e in events[:2]] == [RouteEvent, EvidenceEvent]


@pytest.mark.parametrize("answerer", ["llm", "hybrid"])
def test_a_consumer_gone_mid_answer_ends_the_llms_stream_at_once_without_the_garbage_collector(tmp_path, answerer):
    """The transport reads the query ahead (read_ahead); the client leaves after the first delta, while the task
    waits to hand over more. Closing the consumer must end the LLM's stream before it returns, with the collector
    paused: left to the collector, the stream stays open and unread (the LLM's sends then block; seen in CI)."""
    models = InProcessModels(answer=" ".join(f"word{n} [1]." for n in range(200)), token_delay_s=0.001)
    config = settings()
    knowledge = KnowledgeBase(tmp_path / "data")
    pipeline = QueryPipeline(config, models, knowledge, PlainTokenizer(config.tokenizer_file, "ingest.tokenizer"))
    ingestor = Ingestor(knowledge, models, config.ingest, config.tokenizer_file)

    async def go() -> tuple[int, int]:
        for name, text in DOCUMENTS.items():
            await ingestor.ingest(COLLECTION, name, text.encode())
        run = pipeline.run(QueryInput(COLLECTION, QUESTION, QueryOptions(answerer=answerer, max_tokens=200)), time.monotonic() + 30)
        events = read_ahead(run, depth=2)
        async for event in events:
            if isinstance(event, AnswerDeltaEvent):
                break
        await asyncio.sleep(0.05)  # the task fills the queue and waits to put the next event
        open_before = models.open_streams
        await events.aclose()
        return open_before, models.open_streams

    enabled = gc.isenabled()
    gc.disable()
    try:
        open_before, open_after = asyncio.run(go())
    finally:
        if enabled:
            gc.enable()
        pipeline.close()
    assert (open_before, open_after) == (1, 0)


def test_a_reranker_that_is_down_is_skipped_and_the_answer_says_so(ask):
    models = InProcessModels(failures={contracts.RERANKER.name: TritonUnavailableError("reranker: connection refused")})
    events, final = ask(QueryOptions(answerer="llm", route="simple", rerank=True), models)
    assert final.answer_source == "llm" and final.degraded
    assert "rerank skipped: reranker: connection refused" in final.degraded_reason
    evidence = next(e for e in events if isinstance(e, EvidenceEvent))
    assert evidence.items[0].record.document_name == "northwind.md" and evidence.items[0].signals.rerank is None


def test_a_router_model_that_fails_falls_back_to_the_feature_router(ask):
    models = InProcessModels(failures={contracts.ROUTER.name: ModelExecutionError("router: out of memory")})
    events, final = ask(QueryOptions(router="model"), models)
    route = events[0]
    assert isinstance(route, RouteEvent) and route.decision.source == "features"
    assert "route skipped: router: out of memory" in final.degraded_reason
    assert contracts.ROUTER.name in models.calls  # it was asked


def test_a_reranker_slower_than_the_deadline_is_skipped_and_the_answer_still_comes(ask):
    models = InProcessModels(delays={contracts.RERANKER.name: 30.0})
    started = time.monotonic()
    _, final = ask(QueryOptions(route="simple", rerank=True), models, deadline_s=1.0)
    assert time.monotonic() - started < 10.0  # the query waited for its deadline, not for the reranker
    assert "rerank skipped: reranker: no answer within" in final.degraded_reason
    assert final.answer_source == "extractive" and "412 million euros" in final.text


def test_an_llm_that_breaks_midway_is_replaced_by_the_extractive_answer(ask):
    models = InProcessModels(fail_after_chunks=2)
    events, final = ask(QueryOptions(answerer="llm", route="simple"), models)
    assert final.answer_source == "extractive" and final.degraded
    assert "the LLM failed after 2 streamed parts: llm: the generation broke after 2 chunks" in final.degraded_reason
    assert "412 million euros" in final.text and final.citations[0].document_name == "northwind.md"
    streamed = answer_text(events)
    assert streamed.startswith("Northwind's revenue ") and "412 million euros" in streamed  # the two parts, then the fallback


def test_an_llm_too_slow_for_the_deadline_is_replaced_by_the_extractive_answer(ask):
    models = InProcessModels(token_delay_s=0.4)
    events, final = ask(QueryOptions(answerer="llm", route="simple", max_tokens=8), models, deadline_s=2.0)
    assert final.answer_source == "extractive"
    assert "the deadline would pass before the answer is complete" in final.degraded_reason
    assert "412 million euros" in final.text


def test_with_less_time_than_the_llm_reserve_the_llm_is_not_started(ask):
    config = settings(answer={"llm_reserve_s": 60.0})
    models = InProcessModels()
    _, final = ask(QueryOptions(answerer="llm", route="simple"), models, config)
    assert final.answer_source == "extractive" and "less than answer.llm_reserve_s (60.0 s)" in final.degraded_reason
    assert contracts.LLM.name not in models.calls


def test_an_llm_without_a_declared_context_cannot_be_prompted_and_the_extractive_answer_stands_in(ask):
    models = InProcessModels()

    async def undeclared(model):
        raise TritonUnavailableError(f"model {model} does not declare its context length: rebuild the model repository")

    models.generator_facts = undeclared
    _, final = ask(QueryOptions(answerer="llm", route="simple"), models)
    assert final.answer_source == "extractive" and "rebuild the model repository" in final.degraded_reason


def test_the_judger_stops_at_a_confident_probe(ask):
    models = InProcessModels(entropy=lambda prompt: 0.1)  # 0.1 x ln(4,099) = 0.83 nats, under the LLM's 2.0
    _, final = ask(QueryOptions(answerer="llm", route="complex"), models)
    loop = final.uncertainty
    assert loop.threshold == 2.0 and loop.iterations == 0 and not loop.uncertain
    assert loop.entropies[0] == pytest.approx(0.1 * 8.3185, rel=1e-3)
    assert final.answer_source == "llm" and not final.degraded


def test_the_decoupler_mines_details_until_the_probe_is_confident(ask):
    """A probe is uncertain until the decoupler's notes are in its prompt: one round, then confident."""
    models = InProcessModels(entropy=lambda prompt: 0.1 if "Details found in the evidence" in prompt else 0.5)
    _, final = ask(QueryOptions(answerer="llm", route="complex"), models)
    loop = final.uncertainty
    assert loop.iterations == 1 and not loop.uncertain and loop.details
    assert loop.entropies == pytest.approx((0.5 * 8.3185, 0.1 * 8.3185), rel=1e-3)
    prompts = [call.prompt for call in models.generations]
    assert len(prompts) == 4 and "List the details:" in prompts[1]  # probe, decoupler, probe, answer
    assert "Details found in the evidence" in prompts[-1]  # the summarizer reads the mined notes


def test_an_uncertain_probe_runs_every_decoupler_round_and_the_setting_overrides_the_model(ask):
    models = InProcessModels(entropy=lambda prompt: 0.5)
    _, final = ask(QueryOptions(answerer="llm", route="complex"), models)
    assert final.uncertainty.iterations == 2 and final.uncertainty.uncertain  # uncertainty.max_iterations
    models = InProcessModels(entropy=lambda prompt: 0.5)
    _, final = ask(QueryOptions(answerer="llm", route="complex"), models, settings(uncertainty={"threshold_nats": 5.0}))
    assert final.uncertainty.threshold == 5.0 and final.uncertainty.iterations == 0


def test_an_llm_without_a_calibrated_threshold_names_the_fix(ask):
    models = InProcessModels()
    models.facts[contracts.LLM.name] = replace(models.facts[contracts.LLM.name], judger_entropy_nats=None)
    _, final = ask(QueryOptions(answerer="llm", route="complex"), models)
    assert final.answer_source == "extractive"
    assert "judger_entropy_nats" in final.degraded_reason and "uncertainty.threshold_nats" in final.degraded_reason
    models.facts[contracts.LLM.name] = GeneratorFacts(2048, vocabulary=4099, chat_template=CHATML_TEMPLATE)
    _, final = ask(QueryOptions(answerer="llm", route="complex"), models, settings(uncertainty={"threshold_nats": 3.0}))
    assert final.answer_source == "llm" and final.uncertainty.threshold == 3.0


def test_only_the_judgers_probes_ask_for_entropies(ask):
    """The gpu target's engines stream entropies only when asked (they cost the vocabulary's logits per token): the
    probes ask, the decoupler and the answer do not, and the loop decides as with entropies always streamed."""
    models = InProcessModels(entropies_stream="asked", entropy=lambda p: 0.1 if "Details found in the evidence" in p else 0.5)
    _, final = ask(QueryOptions(answerer="llm", route="complex"), models)
    loop = final.uncertainty
    assert loop.measure == "entropy" and loop.iterations == 1 and not loop.uncertain
    assert loop.entropies == pytest.approx((0.5 * 8.3185, 0.1 * 8.3185), rel=1e-3)
    asked = [call.options.entropies for call in models.generations]
    assert asked == [True, False, True, False]  # probe, decoupler, probe, answer
    assert final.answer_source == "llm" and not final.degraded


def test_the_surprisal_judger_samples_its_probe_and_needs_no_entropies(ask):
    """uncertainty.measure = "surprisal": the probe is sampled at temperature 1 with a fixed seed and weighed by its
    mean -log p against the LLM's surprisal threshold; no request asks for entropies, and the answer keeps the
    request's own sampling settings."""
    def log_prob(prompt: str, options) -> float:
        sampled = options.temperature == 1.0 and options.top_p == 1.0 and options.seed == 0
        return -1.0 if "Details found in the evidence" in prompt else (-4.0 if sampled else -0.5)

    models = InProcessModels(entropies_stream="never", log_prob=log_prob)
    models.facts[contracts.LLM.name] = replace(models.facts[contracts.LLM.name], judger_surprisal_nats=3.0)
    _, final = ask(QueryOptions(answerer="llm", route="complex"), models, settings(uncertainty={"measure": "surprisal"}))
    loop = final.uncertainty
    assert loop.measure == "surprisal" and loop.threshold == 3.0
    assert loop.entropies == pytest.approx((4.0, 1.0)) and loop.iterations == 1 and not loop.uncertain
    probes = [call.options for call in models.generations if call.options.max_tokens == 16]
    assert probes and all(o.temperature == 1.0 and o.top_p == 1.0 and o.seed == 0 for o in probes)
    assert not any(call.options.entropies for call in models.generations)
    assert models.generations[-1].options.temperature == 0.0
    assert final.answer_source == "llm" and not final.degraded


def test_the_judger_names_what_a_stream_lacks_for_its_measure(ask):
    models = InProcessModels(entropies_stream="never")  # an engine built without --gather_generation_logits
    _, final = ask(QueryOptions(answerer="llm", route="complex"), models)
    assert final.answer_source == "extractive" and "without entropies" in final.degraded_reason
    assert "gather_generation_logits" in final.degraded_reason and "surprisal" in final.degraded_reason
    _, final = ask(QueryOptions(answerer="llm", route="complex"), models, settings(uncertainty={"measure": "surprisal"}))
    assert final.answer_source == "extractive" and "judger_surprisal_nats" in final.degraded_reason


@pytest.mark.parametrize("route", ["simple", "complex"])
def test_without_the_embedder_the_query_is_answered_in_lexical_mode_and_says_why(ask, route, caplog):
    """Retrieval started beside the embedder (its BM25 side, and on Complex the graph side waiting for the
    vectors) goes on without vectors: BM25 and the entities the question names find the passage, its sentence
    is chosen by shared words, and the answer is flagged degraded with the embedder's error."""
    models = InProcessModels(failures={contracts.TEXT_EMBEDDER.name: TritonUnavailableError("text_embedder: Triton is not reachable")})
    events, final = ask(QueryOptions(route=route), models)
    assert final.retrieval_mode == "lexical" and final.answer_source == "extractive"
    assert "412 million euros" in final.text and final.citations[0].document_name == "northwind.md"
    assert final.degraded and "lexical mode" in final.degraded_reason and "Triton is not reachable" in final.degraded_reason
    assert "shared words only" not in final.degraded_reason  # said once, as lexical mode
    evidence = next(event for event in events if isinstance(event, EvidenceEvent)).items
    assert evidence and all(item.signals.semantic == 0.0 and "dense" not in item.signals.found_by for item in evidence)
    assert models.calls == [contracts.TEXT_EMBEDDER.name] * models.calls.count(contracts.TEXT_EMBEDDER.name)
    time.sleep(0.2)  # what the pools still had to do
    assert [record for record in caplog.records if record.levelno >= logging.WARNING] == []


@pytest.mark.parametrize("route", ["simple", "complex"])
def test_without_the_embedder_and_no_lexical_fallback_the_query_fails_with_the_cause(ask, route, caplog):
    """retrieval.lexical_fallback off: the query reports the embedder's error and nothing else, and the work
    started beside the embedder ends quietly."""
    models = InProcessModels(failures={contracts.TEXT_EMBEDDER.name: TritonUnavailableError("text_embedder: Triton is not reachable")})
    with pytest.raises(TritonUnavailableError, match="text_embedder: Triton is not reachable"):
        ask(QueryOptions(route=route), models, settings(retrieval={"lexical_fallback": False}))
    time.sleep(0.2)  # what the pools still had to do
    assert [record for record in caplog.records if record.levelno >= logging.WARNING] == []


def test_an_embedder_slower_than_the_deadline_allows_gives_way_to_lexical_mode_in_time(ask):
    models = InProcessModels(delays={contracts.TEXT_EMBEDDER.name: 5.0})
    events, final = ask(QueryOptions(route="simple"), models, deadline_s=1.5)
    assert final.timings_ms["total"] < 1500  # the query did not wait for the embedder past its deadline
    assert final.retrieval_mode == "lexical" and "412 million euros" in final.text
    assert "did not answer within" in final.degraded_reason


def test_lexical_mode_asked_for_calls_no_model_and_is_not_degraded(ask):
    _, final = ask(QueryOptions(lexical=True, route="complex"))
    assert final.retrieval_mode == "lexical" and not final.degraded
    assert "412 million euros" in final.text and final.usage.model_calls == 0


def test_lexical_mode_refuses_what_no_passage_matches(ask, tmp_path):
    knowledge = KnowledgeBase(tmp_path / "refusal")
    config = settings()
    models = InProcessModels()
    pipeline = QueryPipeline(config, models, knowledge, PlainTokenizer(config.tokenizer_file, "ingest.tokenizer"))

    async def go():
        await Ingestor(knowledge, models, config.ingest, config.tokenizer_file).ingest(COLLECTION, "northwind.md", DOCUMENTS["northwind.md"].encode())
        return [event async for event in pipeline.run(
            QueryInput(COLLECTION, "Which glacier did the Zephyrian expedition survey?", QueryOptions(lexical=True)), time.monotonic() + 10)]

    try:
        final = asyncio.run(go())[-1]
    finally:
        pipeline.close()
    assert final.answer_source == "refusal" and final.retrieval_mode == "lexical"


@pytest.mark.parametrize("conflict", [{"answerer": "llm"}, {"answerer": "hybrid"}, {"rerank": True}, {"page_images": True}, {"router": "model"},
                                      {"perception": "dpr"}, {"dense": True}, {"uncertainty": True}])
def test_lexical_mode_refuses_options_that_ask_for_a_model(conflict):
    from orchestrator.errors import InvalidOptionError

    with pytest.raises(InvalidOptionError, match="lexical mode calls no model") as raised:
        QueryOptions(lexical=True, **conflict).check(settings())
    assert raised.value.param == next(iter(conflict))


LLAMA3_TEMPLATE = (  # Llama 3's header format, as its tokenizer ships it (abridged: no tools)
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


def test_every_prompt_is_in_the_format_the_model_declares(ask):
    """A Llama-format LLM gets Llama headers in the probe, the decoupler and the answer, never ChatML."""
    models = InProcessModels(entropy=lambda prompt: 0.5)
    models.facts[contracts.LLM.name] = replace(
        models.facts[contracts.LLM.name], chat_template=LLAMA3_TEMPLATE, chat_template_variables=(("bos_token", "<|begin_of_text|>"),)
    )
    _, final = ask(QueryOptions(answerer="llm", route="complex"), models)
    assert final.answer_source == "llm" and len(models.generations) == 6  # 3 probes, 2 decoupler rounds, the answer
    for call in models.generations:
        assert call.prompt.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou ")
        assert call.prompt.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n") and "<|im_start|>" not in call.prompt


def test_a_model_without_a_declared_chat_template_is_not_prompted_in_a_guessed_format(ask):
    models = InProcessModels()
    models.facts[contracts.LLM.name] = replace(models.facts[contracts.LLM.name], chat_template="")
    _, final = ask(QueryOptions(answerer="llm", route="simple"), models)
    assert final.answer_source == "extractive" and "declares no chat template" in final.degraded_reason
    assert not models.generations


def test_the_short_answer_is_given_only_where_the_settings_ask_for_it(ask):
    """Off by default (too often wrong on real PDFs to show unasked); on, the extractive answer's amount alone, cut
    from the quote of the citation it names, and the LLM's answer as its own."""
    _, default = ask(QueryOptions(route="simple"))
    assert default.answer_source == "extractive" and default.short_answer is None
    _, asked = ask(QueryOptions(route="simple"), config=settings(answer={"short_answer": True}))
    short = asked.short_answer
    assert (short.text, short.answer_type) == ("412 million euros", "money")
    assert asked.citations[short.citation].quote[short.start:short.end] == "412 million euros"
    models = InProcessModels()
    _, generated = ask(QueryOptions(answerer="llm", route="simple"), models, settings(answer={"short_answer": True}))
    assert (generated.short_answer.text, generated.short_answer.citation) == (models.answer.replace("[1]", "").strip(), -1)


def test_the_hybrid_answer_is_generated_from_the_extractive_sentences_and_quotes_the_one_it_rests_on(ask):
    """The LLM reads the chosen sentences numbered by their evidence, not the passages; its answer's citation
    quotes the sentence of the cited evidence it rests on."""
    models = InProcessModels(answer="412 million euros [1].")
    events, final = ask(QueryOptions(answerer="hybrid", route="simple"), models, settings(answer={"short_answer": True}))
    assert (final.answer_source, final.degraded, final.text) == ("hybrid", False, "412 million euros [1].")
    (call,) = models.generations
    assert "[1] Northwind's revenue was 412 million euros in 2024, up from 380 million." in call.prompt
    assert "Northwind annual report" not in call.prompt  # sentences, not the passage with its heading
    assert call.options.max_tokens == 32  # answer.hybrid_max_tokens
    (citation,) = final.citations
    assert citation.quote == "Northwind's revenue was 412 million euros in 2024, up from 380 million."
    assert final.short_answer.text == "412 million euros ." and final.short_answer.citation == -1
    assert answer_text(events) == "412 million euros [1]."


def test_a_hybrid_answer_citing_nothing_quotes_the_sentence_sharing_its_words(ask):
    _, final = ask(QueryOptions(answerer="hybrid", route="simple"), InProcessModels(answer="It was 412 million euros."))
    assert [c.quote for c in final.citations] == ["Northwind's revenue was 412 million euros in 2024, up from 380 million."]
    _, unrelated = ask(QueryOptions(answerer="hybrid", route="simple"), InProcessModels(answer="Nobody knows."))
    assert unrelated.answer_source == "hybrid" and unrelated.citations == ()
    models = InProcessModels(answer="The evidence does not contain the answer.")
    _, refused = ask(QueryOptions(answerer="hybrid", route="simple"), models)
    assert (refused.answer_source, refused.finish_reason) == ("hybrid", "refusal")


def test_a_hybrid_answer_whose_llm_fails_is_the_extractive_answer(ask):
    models = InProcessModels(failures={contracts.LLM.name: TritonUnavailableError("llm: connection refused")})
    _, final = ask(QueryOptions(answerer="hybrid", route="simple"), models)
    assert final.answer_source == "extractive" and "the LLM failed: llm: connection refused" in final.degraded_reason
    assert "412 million euros" in final.text and final.citations[0].quote.startswith("Northwind's revenue")
