"""OCR through Triton on real PDF pages that have a text layer: how right it reads, and how fast, against RapidOCR;
and pages/s through Triton against the same models in process, on slides and on text pages.

    thinkserve-bench ocr_quality [--dataset ../shared/benchmarks/mmlongbench-dev] [--pages 60] [--dpi 150]
                                     [--slides 24] [--rounds 1] [--concurrency 4] [--config FILE] [--set KEY=VALUE ...]
                                     [--output DIR] [--name NAME]

Pages with a text layer are rendered as ingest renders them for OCR (orchestrator.knowledge.parsing.pdf.render_page_png,
ingest.ocr_dpi) and read twice, on this machine, one engine after the other:
1. through the real tritonserver's `ocr` model (the product: PP-OCRv4 behind BLS, the word-space rule), pages in
   flight `--concurrency` at a time as ingest sends them;
2. by RapidOCR in this process (rapidocr_onnxruntime with its defaults: the same networks, its own pre- and
   post-processing, no word-space rule), one page at a time as its users call it.
Each is scored against the page's own text layer, alignment-free: every text-layer character whose centre lies
in an OCR line's box (grown 2 points) is that line's reference (assigned to the box whose middle is nearest when
boxes overlap), its runs of consecutive characters put in left-to-right order. Reported, by page type and in all:
character error rate with and without spaces (edits / reference characters over the lines that have a
reference), the share of the page's words of 4+ letters found whole in the OCR text, and detection coverage (the
share of text-layer characters inside some OCR box); then pages/s of each engine and their ratio.

Speed, by page type: `--slides` pages of the documents without a text layer on any page (slide decks exported as
pictures: what "auto" reads), evenly spaced, and the text-layer pages above, each group read through Triton (pages in
flight as ingest sends them) and in this process by the same code over the same ONNX graphs and reading settings
(thinkserve_backend.ocr over onnxruntime sessions made as the served models make them, a page at a time, each
network on every core), the two alternated in ABBA order over `--rounds`: pages/s of each and their ratio (what
serving through Triton costs or gains); the recogniser's batches as Triton's statistics count them.

Then the dataset's largest document without a text layer on any page (a slide deck exported as pictures) is
ingested end to end through the same Triton (MinerU, OCR of every page, passages, embeddings, commit: the
product's Ingestor with default settings): seconds, pages/s and the OCR stage's share.

Pages are chosen without looking at them: every document of the dataset with a text layer gives pages at evenly
spaced positions until `--pages` are taken. Page types come from the page itself: "slide" (landscape), "dense
text" (2,000+ characters), "figures" (an embedded image or 300+ vector paths), else "sparse text".
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import math
import os
import re
import sys
import tempfile
import time
import unicodedata
from pathlib import Path
from typing import Any, Optional

import numpy as np

from thinkserve_bench.machine import machine_facts
from thinkserve_bench.catalogue import UsageError
from thinkserve_bench.result_files import RESULTS, uncommitted_changes, write_and_show
from orchestrator.config import Settings
from orchestrator.knowledge.parsing.pdf import render_page_png
from orchestrator.triton.client import TritonClient
from orchestrator.triton.launcher import TritonServer
from orchestrator.triton.models import TritonModels

NAME = "ocr_quality"
DEFAULT_DATASET = Path("../shared/benchmarks/mmlongbench-dev")
GROW_PT = 2.0
WORD = re.compile(r"^\W+|\W+$")


def choose_pages(documents: list[Path], wanted: int) -> list[tuple[Path, int]]:
    """Evenly spaced pages with a text layer from every document that has some, until `wanted` are taken."""
    import pypdfium2 as pdfium

    with_text: list[tuple[Path, list[int]]] = []
    for path in documents:
        pdf = pdfium.PdfDocument(str(path))
        pages = [i for i in range(len(pdf)) if pdf[i].get_textpage().get_text_range().strip()]
        pdf.close()
        if pages:
            with_text.append((path, pages))
    per_document = max(1, math.ceil(wanted / max(1, len(with_text))))
    chosen = []
    for path, pages in with_text:
        step = len(pages) / per_document
        chosen += [(path, pages[int(k * step)]) for k in range(min(per_document, len(pages)))]
    return chosen[:wanted]


def page_facts(path: Path, index: int) -> dict[str, Any]:
    """The page's text-layer characters (text, centre x, centre y in PDF points, stream index), its words of 4+
    letters, crop box and type."""
    import pypdfium2 as pdfium
    import pypdfium2.raw as raw

    pdf = pdfium.PdfDocument(str(path))
    page = pdf[index]
    text = page.get_textpage()
    chars = []
    for i in range(text.count_chars()):
        character = chr(raw.FPDFText_GetUnicode(text.raw, i))
        if character.isspace() or character in "\x00\ufffe\uffff":
            continue
        left, bottom, right, top = text.get_charbox(i)
        if right > left or top > bottom:
            chars.append((character, (left + right) / 2, (bottom + top) / 2, i))
    full = text.get_text_range()
    width, height = page.get_size()
    box = page.get_cropbox()
    images = paths = 0
    for obj in page.get_objects():
        images += obj.type == raw.FPDF_PAGEOBJ_IMAGE
        paths += obj.type == raw.FPDF_PAGEOBJ_PATH
    nonspace = sum(not c.isspace() for c in full)
    kind = ("slide" if width > height else "dense text" if nonspace >= 2000
            else "figures" if images or paths >= 300 else "sparse text")
    pdf.close()
    return {"chars": chars, "words": words(full.replace("\ufffe", " ")), "crop": box, "width": width,
            "height": height, "kind": kind}


def normalized(text: str) -> str:
    return unicodedata.normalize("NFKC", text)


def words(text: str) -> list[str]:
    found = [WORD.sub("", w) for w in normalized(text).casefold().split()]
    return [w for w in found if sum(c.isalpha() for c in w) >= 4]


def score_page(facts: dict[str, Any], lines: list[tuple[str, np.ndarray]]) -> dict[str, float]:
    """Edits and reference sizes of one page's OCR `lines` (text, box corners as fractions of the page image)."""
    from rapidfuzz.distance import Levenshtein

    left, _, _, top = facts["crop"]
    width, height = facts["width"], facts["height"]
    boxes = np.array([
        (left + q[:, 0].min() * width, top - q[:, 1].max() * height, left + q[:, 0].max() * width, top - q[:, 1].min() * height)
        for _, q in lines
    ]).reshape(-1, 4)  # left, bottom, right, top in points
    chars = facts["chars"]
    totals = collections.Counter()
    owner = np.full(len(chars), -1)
    if len(chars) and len(boxes):
        cx = np.array([c[1] for c in chars])[:, None]
        cy = np.array([c[2] for c in chars])[:, None]
        inside = (cx >= boxes[:, 0] - GROW_PT) & (cx <= boxes[:, 2] + GROW_PT) & (cy >= boxes[:, 1] - GROW_PT) & (cy <= boxes[:, 3] + GROW_PT)
        strict = (cx >= boxes[:, 0]) & (cx <= boxes[:, 2]) & (cy >= boxes[:, 1]) & (cy <= boxes[:, 3])
        distance = np.abs(cy - (boxes[:, 1] + boxes[:, 3]) / 2) / np.maximum(boxes[:, 3] - boxes[:, 1], 1e-3)
        owner = np.where(inside.any(1), np.where(inside, distance, np.inf).argmin(1), -1)
        totals["covered"] = int(strict.any(1).sum())
    totals["characters"] = len(chars)
    for number, (hypothesis, _) in enumerate(lines):
        mine = sorted((chars[k] for k in np.flatnonzero(owner == number)), key=lambda c: c[3])
        runs: list[list[tuple]] = []
        for c in mine:
            if runs and c[3] == runs[-1][-1][3] + 1:
                runs[-1].append(c)
            else:
                runs.append([c])
        reference = " ".join("".join(c[0] for c in run) for run in sorted(runs, key=lambda run: min(c[1] for c in run)))
        hypothesis, reference = " ".join(normalized(hypothesis).split()), " ".join(normalized(reference).split())
        if not reference:
            continue
        totals["edits"] += Levenshtein.distance(hypothesis, reference)
        totals["reference"] += len(reference)
        totals["edits_no_space"] += Levenshtein.distance(hypothesis.replace(" ", ""), reference.replace(" ", ""))
        totals["reference_no_space"] += len(reference.replace(" ", ""))
    read = collections.Counter(WORD.sub("", w) for w in normalized(" ".join(t for t, _ in lines)).casefold().split())
    expected = collections.Counter(facts["words"])
    totals["words"] = sum(expected.values())
    totals["words_found"] = sum(min(n, read[w]) for w, n in expected.items())
    return dict(totals)


def rates(totals: collections.Counter) -> dict[str, Optional[float]]:
    def share(a: str, b: str) -> Optional[float]:
        return totals[a] / totals[b] if totals[b] else None

    return {"cer": share("edits", "reference"), "cer_no_space": share("edits_no_space", "reference_no_space"),
            "word_recall": share("words_found", "words"), "coverage": share("covered", "characters")}


async def read_through_triton(url: str, images: list[bytes], concurrency: int, timeout_s: float) -> tuple[list, float]:
    limit = asyncio.Semaphore(concurrency)
    async with TritonClient(url, timeout_s) as client:
        models = TritonModels(client)
        await models.read_text([images[0]], timeout_s)  # first-call costs out of the timing

        async def one(image: bytes):
            async with limit:
                [page] = await models.read_text([image], timeout_s)
            return [(text, box) for text, box in zip(page.lines, page.boxes)]

        started = time.monotonic()
        results = await asyncio.gather(*(one(image) for image in images))
        return results, time.monotonic() - started


def slide_pages(documents: list[Path], wanted: int) -> list[tuple[Path, int]]:
    """Evenly spaced pages of the documents with no text layer on any page, about as many from each."""
    from .page_baselines import pages_without_text_layer

    import pypdfium2 as pdfium

    decks = []
    for path in documents:
        pdf = pdfium.PdfDocument(str(path))
        pages = len(pdf)
        pdf.close()
        if pages and len(pages_without_text_layer(path)) == pages:
            decks.append((path, pages))
    if not decks or wanted <= 0:
        return []
    per_deck = max(1, math.ceil(wanted / len(decks)))
    chosen = [(path, int(k * pages / per_deck)) for path, pages in decks for k in range(min(per_deck, pages))]
    return chosen[:wanted]


class InProcessOcr:
    """The served pipeline's code over the model repository's own ONNX graphs and reading settings, in this process,
    a page at a time, each network on every core of the machine (the faster of one thread and all of them, measured
    on 2 cores: 12 slides in 14 s against 19-20 s): what Triton's serving is measured against. Served, each network
    runs on one thread per instance (pages overlap instead), so the repository's thread count is not this one."""

    def __init__(self, repository: Path):
        import json as json_module

        from thinkserve_backend import ocr
        from thinkserve_backend.sessions import cpu_session

        self.ocr = ocr
        parameters = _parameters(repository / "ocr" / "config.pbtxt")
        reading = json_module.loads(parameters["reading"])
        self.settings = ocr.OcrSettings(**{k: tuple(v) if isinstance(v, list) else v for k, v in reading.items()})
        self.alphabet = ocr.alphabet_of(json_module.loads((repository / "ocr" / "1" / parameters["alphabet_file"]).read_text(encoding="utf-8")))
        sessions = {}
        for name in ("ocr_detect", "ocr_classify", "ocr_recognize"):
            network = _parameters(repository / name / "config.pbtxt")
            sessions[name] = cpu_session(repository / name / "1" / network["onnx_file"], os.cpu_count() or 1)
        detect, classify, recognize = sessions["ocr_detect"], sessions["ocr_classify"], sessions["ocr_recognize"]

        async def run_detect(batch):
            return detect.run(["probability"], {"image": batch})[0]

        async def run_classify(batch):
            return classify.run(["probabilities"], {"image": batch})[0]

        async def run_recognize(batch):
            classes, probabilities, space = recognize.run(["classes", "probabilities", "space_probability"], {"image": batch})
            return classes, probabilities, space

        self.networks = ocr.Networks(run_detect, run_classify, run_recognize, int(parameters["network_batch"]))

    def read(self, image: bytes) -> list[tuple[str, np.ndarray]]:
        decoded = self.ocr.decode_image(image, self.settings.max_image_pixels, self.settings.max_side)
        lines = asyncio.run(self.ocr.read_image(decoded, self.networks, self.alphabet, self.settings))
        texts, boxes, _ = self.ocr.as_arrays(lines, decoded.shape[1], decoded.shape[0])
        return list(zip(texts, boxes))


def _parameters(config: Path) -> dict[str, str]:
    """A Triton model config's string parameters (config.pbtxt as the model compiler writes it)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    parsed = text_format.Parse(config.read_text(), model_config_pb2.ModelConfig())
    return {key: value.string_value for key, value in parsed.parameters.items()}


def read_in_process(engine: InProcessOcr, images: list[bytes]) -> tuple[list, float]:
    engine.read(images[0])  # first-call costs out of the timing
    started = time.monotonic()
    results = [engine.read(image) for image in images]
    return results, time.monotonic() - started


def speed(url: str, engine: InProcessOcr, groups: dict[str, list[bytes]], concurrency: int, rounds: int, timeout_s: float,
          progress) -> dict[str, Any]:
    """Pages/s of each page group through Triton and in process, ABBA over `rounds`; the recogniser's batches."""

    async def recognizer_batches() -> dict[str, int]:
        async with TritonClient(url, timeout_s) as client:
            statistics = await client.model_statistics("ocr_recognize")
        stats = statistics["model_stats"][0]
        return {"inferences": int(stats.get("inference_count", 0)), "executions": int(stats.get("execution_count", 0))}

    out: dict[str, Any] = {}
    for kind, images in groups.items():
        if not images:
            continue
        seconds = {"triton": [], "in_process": []}
        before = asyncio.run(recognizer_batches())
        for number in range(rounds):
            order = ("triton", "in_process") if number % 2 == 0 else ("in_process", "triton")
            for engine_name in order:
                progress(f"{kind} pages ({len(images)}) {engine_name.replace('_', ' ')}, round {number + 1}")
                if engine_name == "triton":
                    _, took = asyncio.run(read_through_triton(url, images, concurrency, timeout_s))
                else:
                    _, took = read_in_process(engine, images)
                seconds[engine_name].append(took)
        after = asyncio.run(recognizer_batches())
        rates = {name: len(images) * len(took) / sum(took) for name, took in seconds.items()}
        out[kind] = {"pages": len(images), "seconds": seconds, "pages_per_s": rates, "ratio": rates["triton"] / rates["in_process"],
                     "recognizer": {key: after[key] - before[key] for key in after}}
    return out


def image_only_deck(documents: list[Path]) -> Optional[Path]:
    """The document with the most pages of those with no text layer on any page."""
    from .page_baselines import pages_without_text_layer

    import pypdfium2 as pdfium

    decks = []
    for path in documents:
        pdf = pdfium.PdfDocument(str(path))
        pages = len(pdf)
        pdf.close()
        if len(pages_without_text_layer(path)) == pages:
            decks.append((pages, path))
    return max(decks)[1] if decks else None


async def ingest_deck(url: str, deck: Path, settings: Settings, work: Path) -> dict[str, Any]:
    from orchestrator.knowledge.ingest import Ingestor
    from orchestrator.knowledge.storage.registry import KnowledgeBase

    async with TritonClient(url, settings.triton.call_timeout_s) as client:
        ingestor = Ingestor(KnowledgeBase(work), TritonModels(client), settings.ingest, settings.tokenizer_file)
        result = await ingestor.ingest("deck", deck.name, deck.read_bytes(), timeout_s=settings.triton.call_timeout_s * 10)
    document = result.document
    return {"document": deck.name, "pages": document.pages, "seconds": result.seconds, "stages": result.stage_seconds,
            "ocr_pages": document.ocr_pages, "ocr_lines": document.ocr_lines, "passages": document.passages}


def read_with_rapidocr(images: list[bytes]) -> tuple[list, float]:
    import cv2
    from rapidocr_onnxruntime import RapidOCR

    engine = RapidOCR()
    decoded = [cv2.imdecode(np.frombuffer(image, np.uint8), cv2.IMREAD_COLOR) for image in images]
    engine(decoded[0])  # first-call costs out of the timing
    results = []
    started = time.monotonic()
    for image in decoded:
        found, _ = engine(image)
        height, width = image.shape[:2]
        results.append([(text, np.array(box, np.float32) / np.array([width, height], np.float32)) for box, text, _ in found or []])
    return results, time.monotonic() - started


def measure(settings: Settings, dataset: Path, wanted: int, dpi: float, concurrency: int, work: Path, progress,
            slides: int = 0, rounds: int = 1) -> dict[str, Any]:
    documents = sorted((dataset / "documents").glob("*.pdf"))
    deck = image_only_deck(documents)
    pages = choose_pages(documents, wanted)
    progress(f"{len(pages)} pages with a text layer from {len({p for p, _ in pages})} documents; rendering at {dpi:g} dpi")
    images = [render_page_png(path, index, dpi, settings.ingest.ocr_max_side)[0] for path, index in pages]
    facts = [page_facts(path, index) for path, index in pages]
    slide_list = slide_pages(documents, slides)
    slide_images = [render_page_png(path, index, dpi, settings.ingest.ocr_max_side)[0] for path, index in slide_list]
    progress("OCR through Triton")
    with TritonServer(settings.triton) as server:
        timeout_s = settings.triton.call_timeout_s * 10
        ours, ours_seconds = asyncio.run(read_through_triton(server.endpoints.grpc, images, concurrency, timeout_s))
        engine = InProcessOcr(settings.triton.model_repository)
        speeds = speed(server.endpoints.grpc, engine, {"slides": slide_images, "text pages": images}, concurrency, rounds,
                       timeout_s, progress)
        ingested = None
        if deck is not None:
            progress(f"ingesting {deck.name} end to end")
            ingested = asyncio.run(ingest_deck(server.endpoints.grpc, deck, settings, work / "deck"))
    progress("RapidOCR in this process")
    theirs, theirs_seconds = read_with_rapidocr(images)
    per_page = []
    for (path, index), fact, mine, reference in zip(pages, facts, ours, theirs):
        per_page.append({"document": path.name, "page": index, "kind": fact["kind"], "lines": len(mine),
                         "thinkserve": score_page(fact, mine), "rapidocr": score_page(fact, reference)})
    return {"pages": per_page, "dpi": dpi, "concurrency": concurrency,
            "seconds": {"thinkserve": ours_seconds, "rapidocr": theirs_seconds}, "deck": ingested,
            "slides": [{"document": path.name, "page": index} for path, index in slide_list], "speed": speeds,
            "reading": {k: list(v) if isinstance(v, tuple) else v for k, v in vars(engine.settings).items()}}


def summary(stats: dict[str, Any]) -> dict[str, Any]:
    kinds = sorted({p["kind"] for p in stats["pages"]})
    out: dict[str, Any] = {}
    for kind in [*kinds, "all"]:
        members = [p for p in stats["pages"] if kind in ("all", p["kind"])]
        out[kind] = {"pages": len(members), **{engine: rates(sum((collections.Counter(p[engine]) for p in members), collections.Counter()))
                                               for engine in ("thinkserve", "rapidocr")}}
    pages = len(stats["pages"])
    speed = {engine: pages / seconds for engine, seconds in stats["seconds"].items()}
    return {"by_kind": out, "pages_per_s": speed, "ratio": speed["thinkserve"] / speed["rapidocr"]}


def _pct(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def report(stats: dict[str, Any], command: str, wall_seconds: float) -> tuple[dict, str]:
    machine = machine_facts()
    result = summary(stats)
    lines = [
        "# OCR on real PDF pages with a text layer: through Triton against RapidOCR in process",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine['cpu']}, {machine['logical_cores']} logical cores, {machine['memory_gib']} GiB, GPU: "
        f"{machine['gpu']}, Python {machine['python']}  ",
        f"{len(stats['pages'])} pages rendered at {stats['dpi']:g} dpi; Triton read {stats['concurrency']} pages at a time. "
        f"Wall time {wall_seconds:.0f} s.",
        "",
        "| page type | pages | CER (ThinkServe / RapidOCR) | CER without spaces | words of 4+ letters found | text-layer characters inside a box |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for kind, row in result["by_kind"].items():
        ours, theirs = row["thinkserve"], row["rapidocr"]
        lines.append(
            f"| {kind} | {row['pages']} | {_pct(ours['cer'])} / {_pct(theirs['cer'])} | {_pct(ours['cer_no_space'])} / "
            f"{_pct(theirs['cer_no_space'])} | {_pct(ours['word_recall'])} / {_pct(theirs['word_recall'])} | "
            f"{_pct(ours['coverage'])} / {_pct(theirs['coverage'])} |"
        )
    speed = result["pages_per_s"]
    lines += [
        "",
        f"Speed on this machine: through Triton {speed['thinkserve']:.3f} pages/s, RapidOCR in process "
        f"{speed['rapidocr']:.3f} pages/s: ratio {result['ratio']:.2f}.",
        "",
    ]
    if stats.get("speed"):
        lines += [
            "Through Triton against the same graphs and code in this process (a page at a time), by page type; rounds "
            "in ABBA order, seconds per round:",
            "",
            "| pages | through Triton | in process | ratio | seconds (Triton; in process) | recogniser rows / executions |",
            "|---|---:|---:|---:|---|---:|",
        ]
        for kind, row in stats["speed"].items():
            rec = row["recognizer"]
            lines.append(
                f"| {row['pages']} {kind} | {row['pages_per_s']['triton']:.3f} pages/s | {row['pages_per_s']['in_process']:.3f} "
                f"pages/s | **{row['ratio']:.2f}** | {', '.join(f'{s:.1f}' for s in row['seconds']['triton'])}; "
                f"{', '.join(f'{s:.1f}' for s in row['seconds']['in_process'])} | {rec['inferences']} / {rec['executions']} |"
            )
        lines.append("")
    deck = stats.get("deck")
    if deck:
        stages = ", ".join(f"{stage} {seconds:.1f}" for stage, seconds in deck["stages"].items() if seconds >= 0.05)
        lines += [
            f"Ingest of {deck['document']}, {deck['pages']} pages without a text layer, end to end through the same "
            f"Triton: {deck['seconds']:.1f} s ({deck['pages'] / deck['seconds']:.2f} pages/s); {deck['ocr_pages']} pages "
            f"read by OCR ({deck['ocr_lines']} lines), {deck['passages']} passages. Stages (s): {stages}.",
            "",
        ]
    payload = {"benchmark": NAME, "command": command, "machine": machine, "uncommitted_changes": uncommitted_changes(),
               "wall_seconds": wall_seconds, "stats": stats, "summary": result}
    return payload, "\n".join(lines)


def declare_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", type=Path, default=DEFAULT_DATASET, help="folder with documents/*.pdf")
    parser.add_argument("--pages", type=int, default=60, help="pages with a text layer to read")
    parser.add_argument("--dpi", type=float, default=None, help="render resolution (default: ingest.ocr_dpi)")
    parser.add_argument("--slides", type=int, default=24, help="pages of image-only decks read for the speed comparison")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of the speed comparison (ABBA order)")
    parser.add_argument("--concurrency", type=int, default=None, help="pages in flight through Triton (default: ingest.ocr_concurrency)")
    parser.add_argument("--config", type=Path, help="settings file (TOML); default: the built-in tiny profile")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a setting over the config (repeatable)")
    parser.add_argument("--output", type=Path, default=RESULTS, help="results folder")
    parser.add_argument("--name", default=NAME, help="result file name")


def run_benchmark(args: argparse.Namespace, command: str) -> int:
    if any("=" not in item for item in args.set):
        raise UsageError("--set takes KEY=VALUE")
    settings = Settings.load(args.config, dict(item.split("=", 1) for item in args.set))
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="thinkserve-ocr-") as work:
        stats = measure(settings, args.dataset, args.pages, args.dpi or settings.ingest.ocr_dpi,
                        args.concurrency or settings.ingest.ocr_concurrency, Path(work),
                        lambda m: print(f"* {m}", file=sys.stderr, flush=True), args.slides, args.rounds)
    payload, markdown = report(stats, command, time.monotonic() - started)
    write_and_show(args.name, payload, markdown, args.output)
    return 0
