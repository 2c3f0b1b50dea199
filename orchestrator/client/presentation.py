"""Printing a streamed query for people (CLI `ask` and the demo): route, answer as it arrives, evidence with
its signals, timings and cost."""

from __future__ import annotations

import sys
import textwrap
from typing import Iterable, TextIO

from ..api.protos import pb


class QueryPrinter:
    def __init__(self, question: str, out: TextIO = sys.stdout, evidence_chars: int = 160, signals: bool = True):
        self.out = out
        self.question = question
        self.evidence_chars = evidence_chars
        self.signals = signals
        self.evidence: list = []

    def handle(self, event: "pb.QueryEvent") -> None:
        kind = event.WhichOneof("event")
        if kind == "route":  # the first event: the query was accepted
            self._route(event.route)
        elif kind == "evidence":
            self.evidence = list(event.evidence.items)
            self.out.write("A: ")
        elif kind == "delta":
            self.out.write(event.delta.text)
            self.out.flush()
        elif kind == "final":
            self._final(event.final, event.request_id)

    def _route(self, route: "pb.RouteDecision") -> None:
        write = self.out.write
        write(f"\nQ: {self.question}\n")
        cues = [f"intent {route.intent}"]
        if route.entities:
            cues.append("entities " + ", ".join(route.entities))
        for name, count in (("visual refs", route.visual_references), ("constraints", route.constraints), ("dependency cues", route.dependency_cues)):
            if count:
                cues.append(f"{name} {count}")
        write(f"   route: {route.label} ({route.source}, score {route.complexity_score:.2f}: {'; '.join(cues)})\n")
        for sub in route.sub_questions:
            write(f"   sub-question: {sub}\n")

    def _final(self, final: "pb.FinalAnswer", request_id: str) -> None:
        write = self.out.write
        flags = ", lexical mode" if final.retrieval_mode == "lexical" else ""
        flags += f", DEGRADED: {final.degraded_reason}" if final.degraded else ""
        write(f"\n   [{final.answer_source}, finish: {final.finish_reason}{flags}, request {request_id}]\n")
        if final.HasField("short_answer"):
            write(f"Short answer ({final.short_answer.answer_type}): {final.short_answer.text}\n")
        if final.citations:
            cites = ", ".join(
                f"[{c.evidence_rank}] {c.document_name}" + (f" p.{c.page + 1}" if c.page >= 0 else "") + ocr_mark(c.regions)
                for c in final.citations
            )
            write(f"   cites: {cites}\n")
        if final.HasField("uncertainty"):
            u = final.uncertainty
            entropies = ", ".join(f"{h:.2f}" for h in u.entropies)
            write(f"   uncertainty: {u.evidence_used} evidence kept, {u.measure or 'entropy'} {entropies} nats (threshold {u.threshold:.2f}), {u.iterations} decoupler rounds\n")
        write("Evidence:\n")
        for item in self.evidence:
            where = item.document_name + (f" > {item.section}" if item.section else "")
            if item.page >= 0:
                where += f", page {item.page + 1}"
            if item.block_type != "text":
                where += f" [{item.block_type}]"
            where += ocr_mark(item.regions)
            write(f"  [{item.rank}] {item.score:.3f}  {where}\n")
            if self.signals:
                s = item.signals
                parts = [f"semantic {s.semantic:.2f}", f"lexical {s.lexical:.2f}", f"page lexical {s.page_lexical:.2f}",
                         f"graph {s.structural:.2f}", f"modality {s.modality:.2f}"]
                if s.HasField("rerank"):
                    parts.append(f"rerank {s.rerank:.2f}")
                if s.HasField("page_relevance"):
                    parts = [f"page similarity {s.page_similarity:.2f}", f"VLM P(yes) {s.page_relevance:.2f}"]
                write(f"       {', '.join(parts)}; found by {'+'.join(s.found_by)}\n")
            if item.text:
                write(f"       {textwrap.shorten(item.text, self.evidence_chars)}\n")
            if item.perception:
                write(f"       perceived: {textwrap.shorten(item.perception, self.evidence_chars)}\n")
        timings = "  ".join(f"{t.stage} {t.milliseconds:.1f}" for t in final.timings)
        write(f"Timings (ms): {timings}\n")
        cost = final.cost
        calls = ", ".join(f"{u.model}/{u.stage} x{u.calls} ({u.model_ms:.0f} ms)" for u in cost.models)
        write(f"Cost: {final.usage.model_calls} model calls: {calls}\n")
        write(f"      model time {cost.model_ms:.1f} ms, orchestrator's own time {cost.orchestrator_ms:.1f} ms\n")
        own = sorted(cost.orchestrator_ms_by_stage.items(), key=lambda item: -item[1])
        if own:
            write(f"      own time by stage (ms): {'  '.join(f'{stage} {ms:.1f}' for stage, ms in own)}\n")
        self.out.flush()


def ocr_mark(regions) -> str:
    """" (OCR, confidence 0.93)" when text of these regions was read from the page's image, "" when all of it is
    the document's own."""
    read = [region.ocr_confidence for region in regions if region.HasField("ocr_confidence")]
    return f" (OCR, confidence {min(read):.2f})" if read else ""


def print_query(question: str, events: Iterable["pb.QueryEvent"], out: TextIO = sys.stdout) -> None:
    printer = QueryPrinter(question, out)
    for event in events:
        printer.handle(event)
