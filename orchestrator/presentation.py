"""Printing a streamed query for people (CLI `ask` and the demo): answer as it arrives, evidence, timings."""

from __future__ import annotations

import sys
import textwrap
from typing import Iterable, TextIO

from .api.protos import pb


class QueryPrinter:
    def __init__(self, question: str, out: TextIO = sys.stdout, evidence_chars: int = 160):
        self.out = out
        self.question = question
        self.evidence_chars = evidence_chars
        self.evidence: list = []

    def handle(self, event: "pb.QueryEvent") -> None:
        kind = event.WhichOneof("event")
        if kind == "evidence":  # the first event: the query was accepted
            self.out.write(f"\nQ: {self.question}\nA: ")
            self.evidence = list(event.evidence.items)
        elif kind == "delta":
            self.out.write(event.delta.text)
            self.out.flush()
        elif kind == "final":
            self._final(event.final, event.request_id)

    def _final(self, final: "pb.FinalAnswer", request_id: str) -> None:
        write = self.out.write
        write(f"\n   [{final.answer_source}, finish: {final.finish_reason}, request {request_id}]\n")
        if final.citations:
            write("   cites: " + ", ".join(f"[{c.evidence_rank}] {c.document_name}" for c in final.citations) + "\n")
        write("Evidence:\n")
        for item in self.evidence:
            where = item.document_name + (f" > {item.section}" if item.section else "")
            if item.page >= 0:
                where += f", page {item.page + 1}"
            snippet = textwrap.shorten(item.text, self.evidence_chars)
            write(f"  [{item.rank}] {item.score:.3f}  {where}\n       {snippet}\n")
        timings = "  ".join(f"{t.stage} {t.milliseconds:.1f}" for t in final.timings)
        write(f"Timings (ms): {timings}\n")
        usage = final.usage
        write(f"Usage: {usage.model_calls} model calls, {usage.prompt_tokens} prompt tokens, {usage.completion_tokens} completion tokens\n")
        self.out.flush()


def print_query(question: str, events: Iterable["pb.QueryEvent"], out: TextIO = sys.stdout) -> None:
    printer = QueryPrinter(question, out)
    for event in events:
        printer.handle(event)
