"""Document bytes -> blocks -> text passages + multimodal units (the evidence) and chunks (what the entity
extractor reads) -> entities and relations -> vectors -> one commit.

The stages that wait on Triton (descriptions, extraction with the LLM, every embedding) send their inputs in
batches, several requests in flight at once, so Triton's dynamic batcher sees full batches; parsing and page
rendering run in worker threads (MinerU in a subprocess), so several documents ingested together overlap
parsing with model work. Only the commit takes the collection's write lock.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import re
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Awaitable, Callable, Iterator, Optional, Sequence

import numpy as np

from ..config import IngestSettings
from ..errors import InvalidRequestError
from ..models import contracts
from ..models.chat_template import chat_template_of
from ..models.protocol import GenerationOptions, Models
from ..prompts import INGEST_SYSTEM, description_request
from ..models.tokens import PlainTokenizer
from .graph.cooccurrence import CooccurrenceExtractor
from .graph.extraction import Extraction, describe_fallback, normalize_entity_name
from .graph.llm_extraction import LlmExtractor
from .ingest_progress import DocumentProgress, IngestProgress, ProgressFigures
from .parsing import sources
from .parsing.chunking import Span, TextChunk, chunk_blocks
from .parsing.content_list import read_content_list
from .parsing.documents import Block, ParsedDocument
from .parsing.mineru import FLASH_PARSER_MEMORY_MB, MineruOptions, MineruParser
from .parsing.page_ocr import DocumentOcr, OcrOptions, OcrReport, PageImages, PageReading
from .parsing.page_ranges import parse_pages
from .parsing.passages import Passage, passages_of
from .parsing.sections import block_sections
from .parsing.pdf import inspect_pdf, page_object_counts, render_page_png, render_pages, text_layer_characters
from .parsing.text_source import decode_text, parse_text
from .storage.registry import KnowledgeBase
from .storage.segments import DocumentRecord, EntityMention, EvidenceRecord, PageRecord, RelationMention, Segment


@dataclass(frozen=True)
class IngestResult:
    collection: str
    document: DocumentRecord
    already_present: bool  # the same bytes are in the collection already (under `document.name`)
    replaced: Optional[DocumentRecord]  # the earlier version of a document of the same name
    seconds: float
    stage_seconds: dict[str, float] = field(default_factory=dict)
    visible: bool = True  # queries see the document (False when the caller did not wait for it)
    progress: Optional[ProgressFigures] = None  # the server's ingest once this document was done


class _Stages:
    """Wall time per ingest stage, for the report and the ingest benchmark; each stage of the document's own line of
    work is told to its progress as it begins (`aside`: one that runs beside them, as page rendering does)."""

    def __init__(self, progress: Optional[DocumentProgress] = None):
        self.seconds: dict[str, float] = {}
        self.progress = progress

    @contextlib.contextmanager
    def timed(self, stage: str, aside: bool = False) -> Iterator[None]:
        if self.progress is not None and not aside:
            self.progress.stage(stage)
        started = time.monotonic()
        try:
            yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.monotonic() - started


class Ingestor:
    def __init__(
        self, knowledge: KnowledgeBase, models: Models, settings: IngestSettings, tokenizer_file: Path,
        embed_relations: bool = False,
    ):
        """`embed_relations`: embed the relations too (retrieval.relation_seeds reads them; nothing else does,
        and a document names several times more relations than passages)."""
        self.knowledge = knowledge
        self.models = models
        self.settings = settings
        self.embed_relations = embed_relations
        self.tokenizer = PlainTokenizer(tokenizer_file, "ingest.tokenizer")
        self.parser = MineruParser(mineru_options(settings))
        self.cooccurrence = CooccurrenceExtractor()
        self.ocr = DocumentOcr(models, ocr_options(settings))
        self.progress = IngestProgress()  # pages done of pages total, OCR's pages: the report's and the metrics' figures

    async def ingest(
        self, collection: str, filename: str, data: bytes, media_type: str = "", timeout_s: Optional[float] = None,
        wait_visible: bool = True,
    ) -> IngestResult:
        """Add `data` as document `filename`; the same name with other bytes replaces the stored version.
        Returns once queries see it, or without `wait_visible` once its commit is durable (a bulk load's
        commits are then published together instead of one build each)."""
        started = time.monotonic()
        name = filename.strip()
        if not name:
            raise InvalidRequestError("a document needs a name (the filename field is empty)")
        source = sources.detect(name, data, media_type)
        document_id = hashlib.sha256(data).hexdigest()[:24]
        target = self.knowledge.collection(collection, create=True)
        if (present := _present(target.head().documents, document_id)) is not None:
            return IngestResult(collection, present, True, None, time.monotonic() - started,
                                visible=_present(target.snapshot.documents, document_id) is not None)

        staging = target.staging_folder()
        progress = self.progress.begin(name, collection)
        stages = _Stages(progress)
        try:
            parsed, ocr = await self._parse(source, name, data, staging, stages, timeout_s, progress)
            progress.pages(parsed.page_count or 1)
            progress.parsed(parsed.page_count or 1)
            progress.warn(*parsed.warnings)
            segment = await self._build_segment(parsed, ocr, source, name, document_id, len(data), staging, stages, timeout_s)
            progress.warn(*segment.document.warnings)
            async with target.write_lock:
                if (present := _present(target.head().documents, document_id)) is not None:
                    target.discard_staging(staging)
                    progress.done()
                    return IngestResult(collection, present, True, None, time.monotonic() - started,
                                        visible=_present(target.snapshot.documents, document_id) is not None,
                                        progress=self.progress.figures())
                with stages.timed("commit"):
                    replaced = await asyncio.to_thread(target.commit, segment, staging)
                generation = target.head().generation
        except BaseException:
            target.discard_staging(staging)
            progress.failed()
            raise
        progress.done()
        if wait_visible:
            with stages.timed("publish"):  # read-your-writes: the next query sees the document, at full speed
                await target.visible(generation)
        return IngestResult(collection, segment.document, False, replaced, time.monotonic() - started, stages.seconds,
                            visible=target.snapshot.generation >= generation, progress=self.progress.figures())

    async def _parse(
        self, source: sources.SourceKind, name: str, data: bytes, staging: Path, stages: _Stages, timeout_s: Optional[float],
        progress: DocumentProgress,
    ) -> tuple[ParsedDocument, OcrReport]:
        """Parse into blocks whose assets live under staging/assets, with page renders under staging/pages; then
        the text OCR reads on the pages and in the figures the parser found none in (page_ocr). A PDF's pages
        without a text layer are read while MinerU parses."""
        work = staging / "work"
        work.mkdir()
        try:
            if source.kind in (sources.MARKDOWN, sources.TEXT):
                progress.pages(1)
                with stages.timed("parse"):
                    return parse_text(decode_text(data, name), markdown=source.kind == sources.MARKDOWN), OcrReport()
            if source.kind == sources.CONTENT_LIST:
                archive = work / "upload.zip"
                archive.write_bytes(data)
                with stages.timed("parse"):
                    content_list = await asyncio.to_thread(sources.unpack_content_list, archive, work / "unpacked", name)
                    origin = await asyncio.to_thread(sources.find_origin, content_list)
                    origin_pages = await asyncio.to_thread(self._origin_pages, origin, name) if origin else None
                    parsed = await asyncio.to_thread(read_content_list, content_list, page_count=origin_pages)
                progress.pages(max(parsed.page_count, 1))
                parsed = _adopt_assets(parsed, staging)
                if origin is not None and self.settings.page_images:
                    parsed.page_images = await self._origin_page_images(origin, origin_pages or 1, parsed, staging, stages)
                images = None
                if origin is not None and parsed.page_count <= (origin_pages or 1):
                    images = self._pdf_pages(origin) if origin.suffix.lower() == ".pdf" else _whole_image(origin)
                return await self._read_text(parsed, images, staging, stages, timeout_s, progress)
            suffix = ".pdf" if source.kind == sources.PDF else (".png" if source.media_type == "image/png" else ".jpg")
            original = work / _local_name(name, suffix)  # parsers name the file in their messages
            original.write_bytes(data)
            renders: asyncio.Future | None = None
            early: Optional[PageReading] = None
            parsing: Optional[asyncio.Future] = None
            images = self._pdf_pages(original) if source.kind == sources.PDF else _whole_image(original)
            progress.pages(1)
            if source.kind == sources.PDF:
                pages = await asyncio.to_thread(inspect_pdf, original)
                if pages > self.settings.max_pages:
                    raise InvalidRequestError(
                        f"{name!r} has {pages} pages; the limit is ingest.max_pages = {self.settings.max_pages}"
                    )
                progress.pages(pages)
                if self.settings.page_images:  # rendering overlaps MinerU's parse
                    renders = asyncio.ensure_future(self._render(original, staging / "pages", stages))
            try:
                with stages.timed("parse"):
                    if source.kind == sources.PDF:
                        parsing = asyncio.ensure_future(asyncio.to_thread(self._parse_pdf, original, work / "mineru"))
                        if self.settings.ocr != "off":  # the pages that are only pictures are read meanwhile
                            layer = await asyncio.to_thread(text_layer_characters, original)
                            before = self.ocr.pages_before_parsing(layer)
                            progress.ocr_planned(len(before))
                            if self.settings.ocr == "auto" and before:
                                progress.warn(f"{_pages(len(before))} of {len(layer)} have no text layer: OCR reads them")
                            early = self.ocr.start(before, images, timeout_s, progress.ocr_page)
                        parsed = await parsing
                    else:
                        parsed = await asyncio.to_thread(self.parser.parse, original, work / "mineru")
            except BaseException:
                # let the parse, render and OCR threads finish before the staging folder goes
                if parsing is not None:
                    await asyncio.gather(parsing, return_exceptions=True)
                if early is not None:
                    await early.cancel()
                if renders is not None:
                    await asyncio.gather(renders, return_exceptions=True)
                raise
            parsed = _adopt_assets(parsed, staging)
            if renders is not None:
                parsed.page_images = await renders
            elif source.kind == sources.IMAGE and self.settings.page_images:
                (staging / "pages").mkdir(exist_ok=True)
                page = staging / "pages" / f"page-0000{suffix}"
                shutil.copyfile(original, page)
                parsed.page_images = [page]
            return await self._read_text(parsed, images, staging, stages, timeout_s, progress, early)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _parse_pdf(self, pdf: Path, work: Path) -> ParsedDocument:
        """MinerU on the PDF, a page that breaks it costing that page only (page_ranges): pages with too many drawing
        objects are not given to it, and a failed parse is done again in ranges."""
        counts = page_object_counts(pdf)
        limit = self.settings.parser_max_page_objects
        heavy = {
            page: f"{count:,} drawing objects, more than ingest.parser_max_page_objects = {limit:,}"
            for page, count in enumerate(counts) if limit and count > limit
        }
        parsed, failed = parse_pages(self.parser, pdf, work, len(counts), heavy, self.settings.parser_range_pages)
        then = "OCR reads its page image" if self.settings.ocr != "off" else "it has no text (ingest.ocr is off)"
        parsed.warnings += [f"page {page + 1} was not parsed ({why}): {then}" for page, why in sorted(failed.items())]
        parsed.unparsed_pages = sorted(failed)
        return parsed

    def _pdf_pages(self, pdf: Path) -> PageImages:
        return lambda page: render_page_png(pdf, page, self.settings.ocr_dpi, self.settings.ocr_max_side, blank_as_empty=True)

    async def _read_text(
        self, parsed: ParsedDocument, images: Optional[PageImages], staging: Path, stages: _Stages, timeout_s: Optional[float],
        progress: DocumentProgress, early: Optional[PageReading] = None,
    ) -> tuple[ParsedDocument, OcrReport]:
        """The document with the text OCR read added; the page-sized pictures it replaced leave the segment. Stage
        `ocr` is what ingest waited for OCR after the parse, `ocr_reading` OCR's whole span (from its first image,
        which may precede the parse's end)."""
        progress.parsed(parsed.page_count)
        progress.warn(*parsed.warnings)
        if self.settings.ocr == "off":
            return parsed, OcrReport()
        progress.ocr_planned(len(self.ocr.pages_to_read(parsed)) if images is not None else 0)
        try:
            with stages.timed("ocr"):
                read, report = await self.ocr.read(parsed, images, timeout_s, started=early, on_page=progress.ocr_page)
        except BaseException:
            if early is not None:
                await early.cancel()
            raise
        if report.pages or report.figures:
            stages.seconds["ocr_reading"] = report.seconds
        kept = {block.asset for block in read.blocks if block.asset}
        for asset in {block.asset for block in parsed.blocks if block.asset} - kept:
            (staging / asset).unlink(missing_ok=True)
        return read, report

    def _origin_pages(self, origin: Path, name: str) -> int:
        """Pages of the original shipped with a content list; the same checks and page limit as a PDF upload."""
        if origin.suffix.lower() != ".pdf":
            return 1
        pages = inspect_pdf(origin)
        if pages > self.settings.max_pages:
            raise InvalidRequestError(f"{name!r} has {pages} pages; the limit is ingest.max_pages = {self.settings.max_pages}")
        return pages

    async def _origin_page_images(
        self, origin: Path, pages: int, parsed: ParsedDocument, staging: Path, stages: _Stages
    ) -> list[Path]:
        """Page images from the original, as for a PDF or image upload; none if the content list needs more pages."""
        if parsed.page_count > pages:
            parsed.warnings.append(
                f"the content list has items on page {parsed.page_count} but {origin.name} has {pages}: no page images"
            )
            return []
        if origin.suffix.lower() == ".pdf":
            return await self._render(origin, staging / "pages", stages)
        (staging / "pages").mkdir(exist_ok=True)
        with origin.open("rb") as file:
            png = sources.detect(origin.name, file.read(8)).media_type == "image/png"
        page = staging / "pages" / f"page-0000{'.png' if png else '.jpg'}"
        shutil.copyfile(origin, page)
        return [page]

    async def _render(self, pdf: Path, folder: Path, stages: _Stages) -> list[Path]:
        with stages.timed("render_pages", aside=True):
            quality = self.settings.page_render_quality or None
            return await asyncio.to_thread(
                render_pages, pdf, folder, self.settings.page_render_dpi, self.settings.page_render_max_side, quality
            )

    async def _build_segment(
        self,
        parsed: ParsedDocument,
        ocr: OcrReport,
        source: sources.SourceKind,
        name: str,
        document_id: str,
        size: int,
        staging: Path,
        stages: _Stages,
        timeout_s: Optional[float],
    ) -> Segment:
        settings = self.settings
        with stages.timed("chunk"):
            sections = block_sections(parsed.blocks, parsed.slides())
            passages = await asyncio.to_thread(passages_of, parsed.blocks, self.tokenizer, settings.passage_tokens, sections)
            chunks = await asyncio.to_thread(
                chunk_blocks, parsed.blocks, self.tokenizer, settings.chunk_tokens, settings.chunk_overlap_tokens, sections
            )
        units = [i for i, block in enumerate(parsed.blocks) if block.is_visual]
        with stages.timed("describe"):
            descriptions = await self._describe(parsed, units, staging, timeout_s)
        evidence = [
            EvidenceRecord(f"{document_id}:t{n}", document_id, name, "passage", "text", p.text, p.section, p.spans, tokens=p.tokens)
            for n, p in enumerate(passages)
        ]
        for n, (index, text) in enumerate(zip(units, descriptions)):
            block = parsed.blocks[index]
            evidence.append(
                EvidenceRecord(
                    f"{document_id}:u{n}", document_id, name, "unit", block.type, text, sections[index],
                    (Span(index, block.page, block.bbox, ocr_confidence=block.ocr_confidence),), asset=f"{document_id}/{block.asset}" if block.asset else "",
                    tokens=self.tokenizer.count(text),
                )
            )
        if not evidence:
            raise InvalidRequestError(f"{name!r}: no text, table or figure was found in it ({parsed.parser})")
        parsed.warnings.extend(_textless_pages(parsed, ocr.read_pages))

        # The extractor reads chunks (and units); what it finds is filed under the passages that name it.
        unit_records = evidence[len(passages) :]
        with stages.timed("extract"):
            extractions = await self._extract([c.text for c in chunks] + [u.text for u in unit_records], timeout_s)
        readers = _passages_by_chunk(chunks, passages, evidence) + [[u] for u in unit_records]
        entities, relations = _mentions(readers, extractions)
        entity_keys = list(dict.fromkeys(m.key for m in entities))
        first_mention = {}
        for mention in entities:
            first_mention.setdefault(mention.key, mention)
        relation_keys = list(dict.fromkeys((r.source, r.target) for r in relations))
        first_relation = {}
        for relation in relations:
            first_relation.setdefault((relation.source, relation.target), relation)

        # Entities named by fewer evidence records than entity_min_mentions get no vector (zeros: no question is
        # similar to them, so they seed the graph only when a question names them): most entities of a real
        # document are named once, and their "name: description" texts outweighed its passages.
        mentioned = collections.Counter(m.key for m in entities)
        embedded = [row for row, key in enumerate(entity_keys) if mentioned[key] >= self.settings.entity_min_mentions]
        with stages.timed("embed"):
            texts = [
                [e.text for e in evidence],
                [f"{first_mention[k].name}: {first_mention[k].description}" for k in (entity_keys[row] for row in embedded)],
                [_relation_text(first_mention, first_relation[k]) for k in relation_keys] if self.embed_relations else [],
            ]
            families = list(contracts.PAGE_ENCODER_FAMILIES) if parsed.page_images else []
            images = [path.read_bytes() for path in parsed.page_images] if families else []
            jobs = [self._embed_by_length(texts, timeout_s)] + [self._embed_images(f, images, timeout_s) for f in families]
            (evidence_vectors, embedded_vectors, relation_vectors), *page_vectors = await asyncio.gather(*jobs)
        entity_vectors = np.zeros((len(entity_keys), evidence_vectors.shape[1]), np.float32)
        if embedded:
            entity_vectors[embedded] = embedded_vectors

        document = DocumentRecord(
            document_id=document_id,
            name=name,
            media_type=source.media_type,
            parser=parsed.parser,
            pages=parsed.page_count,
            blocks=len(parsed.blocks),
            chunks=len(chunks),
            units=len(units),
            passages=len(passages),
            entities=len(entity_keys),
            relations=len(relation_keys),
            bytes=size,
            added_at=time.time(),
            warnings=tuple(parsed.warnings),
            ocr_pages=ocr.pages,
            ocr_figures=ocr.figures,
            ocr_lines=ocr.lines,
            ocr_low_confidence_lines=ocr.low_confidence_lines,
            unparsed_pages=tuple(parsed.unparsed_pages),
        )
        pages = [PageRecord(document_id, n, str(path.relative_to(staging))) for n, path in enumerate(parsed.page_images)]
        segment = Segment(
            document=document,
            blocks=parsed.blocks,
            evidence=evidence,
            evidence_vectors=evidence_vectors,
            entities=entities,
            entity_keys=entity_keys,
            entity_vectors=entity_vectors,
            relations=relations,
            relation_keys=relation_keys,
            relation_vectors=relation_vectors,
            pages=pages,
            page_vectors=dict(zip(families, page_vectors)),
        )
        with stages.timed("sentences"):  # what the extractive answer reads of each passage, cut once here
            await asyncio.to_thread(segment.cut_sentences, self.tokenizer.counts)
        return segment

    async def _describe(self, parsed: ParsedDocument, units: Sequence[int], staging: Path, timeout_s: Optional[float]) -> list[str]:
        """Caption + description per multimodal unit; the VLM describes when configured and an image exists."""
        fallbacks = [describe_fallback(parsed.blocks[i]) for i in units]
        if self.settings.describer != "vlm":
            return fallbacks
        options = GenerationOptions(max_tokens=self.settings.description_max_tokens, temperature=0.0, top_p=1.0)
        limit = asyncio.Semaphore(self.settings.max_concurrent_calls)
        chat = chat_template_of(await self.models.generator_facts(contracts.VLM.name), contracts.VLM.name)

        async def describe(index: int, fallback: str) -> str:
            block = parsed.blocks[index]
            image = staging / block.asset if block.asset else None
            if image is None or not image.is_file():
                return fallback
            prompt = chat(INGEST_SYSTEM, _description_request(parsed.blocks, index, self.settings.description_context_blocks))
            async with limit, self.models.generate(prompt, options, [image.read_bytes()], timeout_s) as stream:
                text = "".join([chunk.text async for chunk in stream]).strip()
            return f"{fallback}\n{text}".strip() if text else fallback

        return list(await asyncio.gather(*(describe(i, f) for i, f in zip(units, fallbacks))))

    async def _extract(self, texts: Sequence[str], timeout_s: Optional[float]) -> list[Extraction]:
        if self.settings.extractor == "cooccurrence":
            return await asyncio.to_thread(lambda: [self.cooccurrence.extract(text) for text in texts])
        limit = asyncio.Semaphore(self.settings.max_concurrent_calls)
        options = GenerationOptions(max_tokens=self.settings.extraction_max_tokens, temperature=0.0, top_p=1.0)
        chat = chat_template_of(await self.models.generator_facts(contracts.LLM.name), contracts.LLM.name)

        async def generate(prompt: str, max_tokens: int) -> str:
            async with limit, self.models.generate(chat(INGEST_SYSTEM, prompt), replace(options, max_tokens=max_tokens), (), timeout_s) as stream:
                return "".join([chunk.text async for chunk in stream])

        extractor = LlmExtractor(generate, max_tokens=self.settings.extraction_max_tokens)
        return list(await asyncio.gather(*(extractor.extract(text) for text in texts)))

    async def _embed_by_length(self, groups: Sequence[Sequence[str]], timeout_s: Optional[float]) -> list[np.ndarray]:
        """Embed several lists of texts in requests of similar length, returning one array per list.

        The encoder pads a batch to its longest text, and Triton merges concurrent requests into one batch:
        sent in length order, a 10-token entity name is not padded to a 254-token chunk piece beside it. A text
        that occurs twice (a repeated table row, an entity described alike) is embedded once.
        """
        unique = sorted(dict.fromkeys(text for texts in groups for text in texts), key=len)  # each text embedded once
        vectors = await self._batches(unique, lambda batch: self.models.embed(batch, timeout_s))
        row_of = {text: row for row, text in enumerate(unique)}
        results = [np.zeros((len(texts), vectors.shape[1] if vectors.size else 0), np.float32) for texts in groups]
        for group, texts in enumerate(groups):
            if len(texts):
                results[group][:] = vectors[[row_of[text] for text in texts]]
        return [result if len(result) else np.zeros((0, 0), np.float32) for result in results]

    async def _embed_images(self, family: str, images: Sequence[bytes], timeout_s: Optional[float]) -> np.ndarray:
        return await self._batches(images, lambda batch: self.models.embed_page_images(family, batch, timeout_s))

    async def _batches(self, items: Sequence, call: Callable[[Sequence], Awaitable[np.ndarray]]) -> np.ndarray:
        """Requests of embed_batch items, max_concurrent_calls in flight: full batches for Triton's batcher."""
        if not items:
            return np.zeros((0, 0), dtype=np.float32)
        limit = asyncio.Semaphore(self.settings.max_concurrent_calls)
        step = self.settings.embed_batch

        async def run(batch: Sequence) -> np.ndarray:
            async with limit:
                return await call(batch)

        parts = await asyncio.gather(*(run(items[i : i + step]) for i in range(0, len(items), step)))
        return np.concatenate(parts).astype(np.float32)


def ocr_options(settings: IngestSettings) -> OcrOptions:
    return OcrOptions(
        mode=settings.ocr,
        figures=settings.ocr_figures,
        min_confidence=settings.ocr_min_confidence,
        concurrency=settings.ocr_concurrency,
    )


def _whole_image(path: Path) -> PageImages:
    """An image document's one page: its own bytes (and its width / height)."""
    from PIL import Image

    def page(index: int) -> tuple[bytes, float]:
        data = path.read_bytes()
        with Image.open(path) as image:
            width, height = image.size
        return data, width / height if height else 1.0

    return page


def mineru_options(settings: IngestSettings) -> MineruOptions:
    return MineruOptions(
        tier=settings.parser_tier,
        mode=settings.parser_mode,
        timeout_s=settings.parser_timeout_s,
        model_source=settings.parser_model_source,
        model_dir=settings.parser_model_dir,
        memory_limit_mb=parser_memory_limit(settings),
    )


def parser_memory_limit(settings: IngestSettings) -> Optional[int]:
    """MiB the parse process may use, None for no limit (see IngestSettings.parser_memory_mb)."""
    if settings.parser_mode != "subprocess":
        return None  # in-process: the limit would be the server's own
    if settings.parser_memory_mb is None:
        return FLASH_PARSER_MEMORY_MB if settings.parser_tier == "flash" else None
    return settings.parser_memory_mb or None


def _local_name(name: str, suffix: str) -> str:
    """A safe file name for a document name (which may hold folders or any character)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", PurePosixPath(name).stem).strip("._") or "document"
    return f"{stem[:100]}{suffix}"


def _present(documents: dict[str, DocumentRecord], document_id: str) -> Optional[DocumentRecord]:
    return next((d for d in documents.values() if d.document_id == document_id), None)


def _adopt_assets(parsed: ParsedDocument, staging: Path) -> ParsedDocument:
    """Move the blocks' images into staging/assets and make their paths relative to the segment folder."""
    if parsed.asset_root is None:
        return parsed
    blocks: list[Block] = []
    for block in parsed.blocks:
        if block.asset:
            source = parsed.asset_root / block.asset
            target = staging / "assets" / block.asset
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists():  # two blocks may share an image
                shutil.move(source, target)  # the parser's work folder is inside staging: a rename
            block = replace(block, asset=f"assets/{block.asset}")
        blocks.append(block)
    return replace(parsed, blocks=blocks, asset_root=staging)


def _description_request(blocks: Sequence[Block], index: int, window: int) -> str:
    block = blocks[index]
    context = [
        b.content for b in blocks[max(0, index - window) : index] + blocks[index + 1 : index + 1 + window] if b.content and not b.is_visual
    ]
    return description_request(block.type, block.caption, context)


def _passages_by_chunk(chunks: Sequence[TextChunk], passages: Sequence[Passage], evidence: Sequence[EvidenceRecord]) -> list[list[EvidenceRecord]]:
    """Each chunk's passages (those sharing a block with it), in reading order; a long block may give several."""
    by_block: dict[int, list[int]] = {}
    for number, passage in enumerate(passages):
        for span in passage.spans:
            by_block.setdefault(span.block, []).append(number)
    return [
        [evidence[n] for n in dict.fromkeys(n for span in chunk.spans for n in by_block.get(span.block, ()))]
        for chunk in chunks
    ]


def _mentions(readers: Sequence[Sequence[EvidenceRecord]], extractions: Sequence[Extraction]):
    """Entity and relation mentions, each filed under the evidence that names it.

    `readers[i]` are the evidence records text i covers (a chunk: its passages; a unit: itself). An entity is
    filed under every one of them that contains its name, a relation under the first containing both names
    (then either); one the extractor paraphrased goes to the first record, so none is lost."""
    entities: dict[tuple[str, str], EntityMention] = {}
    relations: list[RelationMention] = []
    for records, extraction in zip(readers, extractions):
        if not records:
            continue
        folded = [record.text.casefold() for record in records]

        def naming(*names: str) -> list[EvidenceRecord]:
            wanted = [name.casefold() for name in names]
            return [record for record, text in zip(records, folded) if all(name in text for name in wanted)]

        for entity in extraction.entities:
            key, name = normalize_entity_name(entity.name), entity.name.strip()
            if key:
                for record in naming(name) or records[:1]:
                    entities.setdefault((key, record.evidence_id), EntityMention(key, name, entity.type, entity.description, record.evidence_id))
        for relation in extraction.relations:
            source, target = sorted((normalize_entity_name(relation.source), normalize_entity_name(relation.target)))
            if source and target and source != target:
                names = (relation.source.strip(), relation.target.strip())
                record = (naming(*names) or naming(names[0]) or naming(names[1]) or records)[0]
                relations.append(
                    RelationMention(source, target, relation.description, relation.keywords, relation.weight, record.evidence_id)
                )
    return list(entities.values()), relations


def _pages(count: int) -> str:
    return f"{count} page{'' if count == 1 else 's'}"


def _textless_pages(parsed: ParsedDocument, ocr_read_pages: bool = False) -> list[str]:
    """A warning naming the pages without any text the parser could extract or OCR read (scans, slides of
    pictures): silently, they would be indexed as nothing but page images. `ocr_read_pages`: OCR read the pages
    (it was on, and the document had page images to read)."""
    if parsed.page_count <= 0:
        return []
    with_text = {block.page for block in parsed.blocks if block.content.strip() or block.caption.strip()}
    missing = [page for page in range(parsed.page_count) if page not in with_text]
    if not missing:
        return []
    shown = ", ".join(str(page + 1) for page in missing[:10]) + (", ..." if len(missing) > 10 else "")
    if ocr_read_pages:
        why = "OCR found no words on them either"
    elif parsed.parser.endswith("/flash"):
        why = "scanned or image-only pages, MinerU's flash tier does no OCR, and OCR did not read them"
    else:
        why = f"the parser ({parsed.parser}) found none on them, and OCR did not read them"
    found_by = ("their page images and captions" if parsed.page_images else
                "the captions of their figures and tables (no page images: the document came without its original)")
    return [
        f"{len(missing)} of {parsed.page_count} pages have no extractable text (page {shown}): {why}; "
        f"only {found_by} can be found"
    ]


# A relation is embedded as its two names, keywords and the start of its description: co-occurrence relations
# describe themselves with their whole sentence, and every pair in a sentence would embed it again in full.
RELATION_DESCRIPTION_CHARS = 160


def _relation_text(first_mention: dict[str, EntityMention], relation: RelationMention) -> str:
    names = [first_mention[k].name if k in first_mention else k for k in (relation.source, relation.target)]
    description = relation.description[:RELATION_DESCRIPTION_CHARS]
    return f"{names[0]} - {names[1]}: {relation.keywords} {description}".strip()
