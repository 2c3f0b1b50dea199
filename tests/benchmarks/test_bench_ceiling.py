"""The ceiling's replay keeps the pipeline's concurrency per question, and its sweep runs until saturation but
never stops below the end-to-end best level (a ceiling measured where end to end had not peaked is no ceiling)."""

from __future__ import annotations

import pytest

from thinkserve_bench.modes.ceiling import Call, Plan, compare, sweep_stops


def _complex_plan() -> Plan:
    # as the final event reports a Complex query: grouped per (model, stage), in order of first call
    calls = [
        Call("router", "route", 1, 0, 1, 1),
        Call("text_embedder", "embed", 2, 12, 0, 1),
        Call("page_text_clip", "page_images", 1, 8, 0, 1),
        Call("page_text_siglip", "page_images", 1, 8, 0, 1),
        Call("reranker", "rerank", 12, 1600, 0, 1),
        Call("vlm_relevance", "vlm_filter", 11, 90, 0, 1),
        Call("vlm", "perception", 6, 400, 150, 3),
        Call("text_embedder", "answer", 16, 380, 0, 1),
    ]
    return Plan("q", calls, ["text."])


def test_the_schedule_follows_the_pipeline():
    plan = _complex_plan()
    assert plan.schedule() == [
        [[(False, [0])]],  # route first
        [[(False, [1]), (False, [4])],  # embed -> rerank ...
         [(True, [2, 3]), (False, [5])]],  # ... beside both page-text towers at once -> the VLM filter
        [[(True, [6])]],  # the perception calls at once
        [[(False, [7])]],  # the extractive answer
    ]
    assert plan.describe() == (
        "route:router -> [embed:text_embedder -> rerank:reranker] || "
        "[page_images:page_text_clip & page_images:page_text_siglip -> vlm_filter:vlm_relevance] -> "
        "perception:vlmx3 -> answer:text_embedder"
    )
    # an LLM answer: the uncertainty probes, then the answer stream, one after another
    llm = Plan("q", [Call("llm", "llm", 1, 900, 60, 1), Call("llm", "uncertainty", 2, 1800, 40, 2)], [])
    assert llm.schedule() == [[[(False, [1]), (False, [0])]]]


def test_the_sweep_goes_past_the_end_to_end_best_level_then_stops_at_saturation():
    def level(c, qps):
        return {"concurrency": c, "throughput_qps": qps}

    assert sweep_stops(None, level(1, 1.0), reach=4, gain=0.1) is None
    # flat from 2 to 4, but end to end peaked at 4: the ceiling must be measured there and beyond
    assert sweep_stops(level(2, 1.0), level(4, 1.0), reach=4, gain=0.1) is None
    assert "from concurrency 4 to 8" in sweep_stops(level(4, 1.0), level(8, 1.05), reach=4, gain=0.1)
    assert sweep_stops(level(4, 1.0), level(8, 1.2), reach=4, gain=0.1) is None


def test_compare_reports_the_fraction_and_flags_a_ceiling_below_end_to_end():
    load = {"best_closed_loop": {"throughput_qps": 0.8, "concurrency": 8},
            "closed_loop": [{"completed": 10, "server": {"m": {"compute_ms": 2000.0}},
                             "usage_per_query": {"completion_tokens": {"vlm": 150.0}}}]}
    ceiling = {"best_qps": 1.0, "levels": [{"completed": 20, "server": {"m": {"compute_ms": 3000.0}},
                                            "completion_tokens_per_question": {"vlm": 140.0}}]}
    out = compare(load, ceiling)
    assert out["fraction"] == pytest.approx(0.8) and not out["ceiling_below_end_to_end"]
    assert out["compute_s_per_query"]["replay_over_end_to_end"] == pytest.approx(0.15 / 0.2)
    assert out["completion_tokens_per_query"] == {"end_to_end": {"vlm": 150.0}, "replay": {"vlm": 140.0}}
    assert compare(load, {**ceiling, "best_qps": 0.5})["ceiling_below_end_to_end"]
    # paired windows (the same machine conditions) make the headline; the sweeps' ratio is kept beside it
    paired = compare(load, {**ceiling, "best_qps": 0.5, "paired": {"fraction": 0.9}})
    assert paired["fraction"] == 0.9 and paired["fraction_of_sweeps"] == pytest.approx(1.6)
    assert not paired["ceiling_below_end_to_end"]


def test_the_answer_stage_embeds_the_sentences_the_pipeline_would_shortlist():
    from thinkserve_bench.modes.ceiling import answer_sentences
    from orchestrator.knowledge.parsing.sentences import MAX_SENTENCE_CHARS

    rambling = " ".join(f"tok{i}" for i in range(200))  # a random-weight VLM's description: one long "sentence"
    evidence = ["Revenue grew by twelve percent in Europe. Too short. Revenue grew by twelve percent in Europe.",
                "The Leeds warehouse used less energy after the roof panels."]
    question = "How much did revenue grow in Europe?"
    # sentences sharing the question's words first, then evidence order; fragments dropped, repeats once
    assert answer_sentences(question, evidence, [rambling], 2) == [
        "Revenue grew by twelve percent in Europe.", "The Leeds warehouse used less energy after the roof panels."]
    # the description only when the evidence runs out, cut as the pipeline cuts it
    out = answer_sentences(question, evidence, [rambling], 16)
    assert len(out) == 3 and out[2].startswith("tok0 tok1") and len(out[2]) == MAX_SENTENCE_CHARS


def test_a_question_whose_capture_fails_is_left_out_of_the_replay():
    import asyncio
    from types import SimpleNamespace

    import grpc

    from thinkserve_bench.modes.ceiling import capture
    from thinkserve_bench.workload import WorkloadQuestion
    from orchestrator.errors import ThinkServeError

    class Orchestrator:  # the orchestrator client's query(): one stream per question
        async def query(self, collection, question, **options):
            if "missing" in question:
                raise grpc.aio.AioRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                           details="deadline of 30 s passed")
            yield SimpleNamespace(WhichOneof=lambda _: "final", final=SimpleNamespace(cost=SimpleNamespace(models=[
                SimpleNamespace(model="text_embedder", stage="embed", items=1, tokens_in=9, tokens_out=0, calls=1)])))

    session = SimpleNamespace(client=Orchestrator(), collection="bench")
    questions = [WorkloadQuestion(id="q1", question="what is here"), WorkloadQuestion(id="q2", question="missing one")]
    plans, errors = asyncio.run(capture(session, questions, {}))
    assert [p.question for p in plans] == ["what is here"] and plans[0].calls[0].model == "text_embedder"
    assert errors == ["q2: DEADLINE_EXCEEDED: deadline of 30 s passed"]
    with pytest.raises(ThinkServeError, match="could not learn any question"):
        asyncio.run(capture(session, questions[1:], {}))
