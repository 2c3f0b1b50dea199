import math

import pytest

from orchestrator.pipeline.fusion import (
    SOURCES,
    CandidateSignals,
    CandidateTable,
    FusionWeights,
    blend_rerank,
    fuse,
    reciprocal_ranks,
    sigmoid,
)

WEIGHTS = FusionWeights(semantic=0.5, lexical=0.2, structural=0.2, modality=0.1, method="weighted")
RRF = FusionWeights(semantic=0.5, lexical=0.2, structural=0.2, modality=0.1, method="rrf", rrf_k=60)


def candidates():
    return {
        7: CandidateSignals(semantic=0.8, lexical=1.4, structural=0.0, found_by={"dense", "sparse"}),
        3: CandidateSignals(semantic=0.4, lexical=0.0, structural=0.3, found_by={"graph"}),
        5: CandidateSignals(semantic=-0.2, lexical=0.6, structural=0.7, found_by={"sparse", "graph"}),
    }


def test_signals_are_clipped_to_the_unit_interval_then_averaged_with_their_weights():
    scored = fuse(candidates(), {7: "text", 3: "table", 5: "image"}, {}, WEIGHTS)
    by_row = {c.row: c for c in scored}
    # no modality preference: its weight leaves the mean, the others are divided by 0.9
    assert by_row[7].fused == pytest.approx((0.5 * 0.8 + 0.2 * 1.0 + 0.2 * 0.0) / 0.9)  # lexical clipped at 1
    assert by_row[3].fused == pytest.approx((0.5 * 0.4 + 0.2 * 0.0 + 0.2 * 0.3) / 0.9)
    assert by_row[5].fused == pytest.approx((0.5 * 0.0 + 0.2 * 0.6 + 0.2 * 0.7) / 0.9)  # negative cosine clipped
    # a signal is not rescaled by the best candidate: 0.7 stays 0.7 although no candidate has more
    assert (by_row[5].semantic, by_row[5].lexical, by_row[5].structural) == (0.0, 0.6, 0.7)
    assert [c.row for c in scored] == [7, 3, 5] and all(c.final == c.fused for c in scored)
    assert by_row[5].found_by == ("graph", "sparse")


def test_a_modality_preference_lifts_the_preferred_block_types():
    scored = fuse(candidates(), {7: "text", 3: "table", 5: "image"}, {"table": 1.0, "image": 0.5}, WEIGHTS)
    by_row = {c.row: c for c in scored}
    assert by_row[3].modality == 1.0 and by_row[5].modality == 0.5 and by_row[7].modality == 0.0
    assert by_row[3].fused == pytest.approx(0.5 * 0.4 + 0.2 * 0.3 + 0.1 * 1.0)
    assert by_row[7].fused == pytest.approx(0.5 * 0.8 + 0.2 * 1.0)


def test_switched_off_signals_weigh_nothing_and_ties_keep_row_order():
    only_lexical = FusionWeights(semantic=0.0, lexical=1.0, structural=0.0, modality=0.0, method="weighted")
    scored = fuse(
        {2: CandidateSignals(lexical=1.0), 1: CandidateSignals(lexical=1.0), 0: CandidateSignals(semantic=1.0)},
        {0: "text", 1: "text", 2: "text"}, {}, only_lexical,
    )
    assert [(c.row, c.fused) for c in scored] == [(1, 1.0), (2, 1.0), (0, 0.0)]
    assert fuse({}, {}, {}, WEIGHTS) == []


def test_the_lexical_signals_are_raised_to_their_exponent_before_weighing():
    squared = FusionWeights(semantic=1.0, lexical=0.5, structural=0.0, modality=0.0, page_lexical=0.5, lexical_exponent=2.0)
    scored = fuse(
        {1: CandidateSignals(semantic=0.5, lexical=0.3, page_lexical=0.4), 2: CandidateSignals(semantic=0.4, lexical=1.5, page_lexical=0.9)},
        {1: "text", 2: "text"}, {}, squared,
    )
    by_row = {c.row: c for c in scored}
    assert by_row[1].fused == pytest.approx((0.5 + 0.5 * 0.09 + 0.5 * 0.16) / 2.0)  # a partial match counts little
    assert by_row[2].fused == pytest.approx((0.4 + 0.5 * 1.0 + 0.5 * 0.81) / 2.0)  # clipped to 1 first, then squared
    assert (by_row[2].lexical, by_row[2].page_lexical) == (1.0, 0.9) and [c.row for c in scored] == [2, 1]  # reported as found


def test_reciprocal_rank_fusion_sums_each_signal_rank_over_the_candidates_it_found():
    scored = fuse(candidates(), {7: "text", 3: "table", 5: "image"}, {}, RRF)
    by_row = {c.row: c for c in scored}
    best = 0.9 / 61  # what a candidate first by every weighed signal would get: the fused score's 1.0
    # semantic: 7 first, 3 second, 5 not found (cosine clipped to 0); lexical: 7, then 5; structural: 5, then 3
    assert by_row[7].fused == pytest.approx((0.5 / 61 + 0.2 / 61) / best)
    assert by_row[3].fused == pytest.approx((0.5 / 62 + 0.2 / 62) / best)
    assert by_row[5].fused == pytest.approx((0.2 / 62 + 0.2 / 61) / best)
    assert [c.row for c in scored] == [7, 3, 5]
    # the signals themselves are reported as they were, whatever the method
    assert (by_row[5].semantic, by_row[5].lexical, by_row[5].structural) == (0.0, 0.6, 0.7)


def test_rrf_ranks_ties_together_and_page_scores_reach_every_candidate_on_the_page():
    assert reciprocal_ranks([0.5, 0.9, 0.0, 0.5, 0.1], 60).tolist() == pytest.approx([1 / 62, 1 / 61, 0.0, 1 / 62, 1 / 64])
    pages = FusionWeights(semantic=1.0, lexical=0.0, structural=0.0, modality=0.5, page_lexical=1.0, method="rrf", rrf_k=60)
    scored = fuse(
        {1: CandidateSignals(semantic=0.3, page_lexical=0.9), 2: CandidateSignals(semantic=0.6, page_lexical=0.9),
         3: CandidateSignals(semantic=0.5, page_lexical=0.2)},
        {1: "text", 2: "text", 3: "table"}, {"table": 1.0}, pages,
    )
    by_row = {c.row: c for c in scored}
    best = 2.5 / 61
    assert by_row[2].fused == pytest.approx((1 / 61 + 1 / 61) / best)  # rows 1 and 2 share their page's first rank
    assert by_row[1].fused == pytest.approx((1 / 63 + 1 / 61) / best)
    assert by_row[3].fused == pytest.approx((1 / 62 + 1 / 63 + 0.5 / 61) / best)  # a preferred table: modality at rank 1
    assert [c.row for c in scored] == [3, 2, 1] and by_row[3].page_lexical == 0.2


def test_the_reranker_blends_into_the_final_score():
    scored = fuse(candidates(), {7: "text", 3: "table", 5: "image"}, {}, WEIGHTS)
    reranked = blend_rerank(scored, [-4.0, 0.0, 3.0], weight=1.0)  # scores for rows 7, 3, 5
    assert [c.row for c in reranked] == [5, 3, 7]
    assert reranked[0].rerank == 3.0 and reranked[0].final == pytest.approx(1 / (1 + math.exp(-3)))
    half = blend_rerank(scored, [-4.0, 0.0, 3.0], weight=0.5)
    row7 = next(c for c in half if c.row == 7)
    assert row7.final == pytest.approx(0.5 * row7.fused + 0.5 * sigmoid(-4.0))
    unchanged = blend_rerank(scored, [-4.0, 0.0, 3.0], weight=0.0)
    assert [c.row for c in unchanged] == [7, 3, 5] and [c.final for c in unchanged] == [c.fused for c in scored]
    with pytest.raises(ValueError, match="2 rerank scores for 3 candidates"):
        blend_rerank(scored, [1.0, 2.0], 1.0)


def test_sigmoid_is_stable_at_the_extremes():
    assert sigmoid(0.0) == 0.5 and sigmoid(800.0) == 1.0 and sigmoid(-800.0) == 0.0


def test_a_limit_hands_out_the_best_candidates_and_the_table_keeps_every_cosine():
    table = CandidateTable.of(candidates())
    assert table.rows.tolist() == [7, 3, 5] and table.found_by.tolist() == [
        [True, False, False, True], [False, True, False, False], [False, True, False, True]]  # SOURCES order
    assert SOURCES == tuple(sorted(SOURCES))
    every = fuse(table, {7: "text", 3: "table", 5: "image"}, {}, WEIGHTS)
    assert fuse(candidates(), {7: "text", 3: "table", 5: "image"}, {}, WEIGHTS) == every  # a mapping or its table
    assert fuse(table, {}, {}, WEIGHTS, limit=2) == every[:2]
    assert fuse(table, {}, {}, WEIGHTS, limit=0) == []
    assert table.best_semantic() == 0.8  # the cosines as fusion reports them: clipped to [0, 1]
    assert CandidateTable.of({1: CandidateSignals(semantic=-0.3)}).best_semantic() == 0.0
    assert CandidateTable.of({}).best_semantic() == 0.0 and fuse(CandidateTable.of({}), {}, {}, WEIGHTS) == []
