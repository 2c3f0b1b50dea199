"""The simplest strong baselines of page retrieval, over the same MinerU text the product indexes.

- BM25 over whole pages with the `bm25s` package as its users call it (English stop words, its default
  tokenizer and Lucene scoring); pages sharing no word with the question are not ranked.
- Dense all-MiniLM-L6-v2 over passages of at most 254 of its tokens cut from each page's text in order (the
  window it reads whole), a page scoring its best passage.

A page's text is every block MinerU found on it, in reading order: the text, and of tables, figures and
equations their captions, content and footnotes. Running heads are left out, as the product leaves them out.
The same baselines also read the text the product stored (`page_texts` of its blocks): the text layer where a page
has one, and where it has none what OCR read, so they see exactly the words the product can search.
"""

from __future__ import annotations

from pathlib import Path
from typing import Awaitable, Callable, Sequence

import bm25s
import numpy as np

from orchestrator.knowledge.parsing.documents import Block, ParsedDocument
from orchestrator.models.tokens import PlainTokenizer

DENSE_WINDOW_TOKENS = 254  # MiniLM reads 256 tokens, two of them its own [CLS] and [SEP]

Embed = Callable[[Sequence[str]], Awaitable[np.ndarray]]


def pages_without_text_layer(pdf: Path) -> list[int]:
    """0-based pages of a PDF whose text layer holds no character but spaces (scans, slides exported as images):
    what no parser without OCR can read."""
    import pypdfium2 as pdfium

    document = pdfium.PdfDocument(str(pdf))
    try:
        empty = []
        for index in range(len(document)):
            page = document[index]
            text = page.get_textpage()
            if not text.get_text_range().strip():
                empty.append(index)
            text.close()
            page.close()
        return empty
    finally:
        document.close()


def page_texts(document: ParsedDocument) -> list[str]:
    pages: list[list[str]] = [[] for _ in range(document.page_count)]
    for block in document.blocks:
        text = block_text(block)
        if text and 0 <= block.page < document.page_count:
            pages[block.page].append(text)
    return ["\n".join(parts) for parts in pages]


def block_text(block: Block) -> str:
    return "\n".join(part for part in (block.caption, block.content, block.footnote) if part.strip())


class Bm25Pages:
    """bm25s over one document's pages."""

    def __init__(self, texts: Sequence[str]):
        self.pages = len(texts)
        corpus = bm25s.tokenize(list(texts), stopwords="en", show_progress=False)
        self.vocabulary = corpus.vocab
        self.retriever = bm25s.BM25()
        if self.vocabulary:  # bm25s cannot index a corpus without a single word (pages of images only)
            self.retriever.index(corpus, show_progress=False)

    def rank(self, question: str) -> list[int]:
        """Pages best first; pages sharing no word with the question are left out."""
        if not self.vocabulary:
            return []
        (words,) = bm25s.tokenize([question], stopwords="en", show_progress=False, return_ids=False)
        words = [word for word in words if word in self.vocabulary]
        if not words:
            return []
        scores = np.asarray(self.retriever.get_scores(words))
        order = np.lexsort((np.arange(len(scores)), -scores))
        return [int(page) for page in order if scores[page] > 0]


class DensePassages:
    """One document's pages cut into passages of DENSE_WINDOW_TOKENS, embedded once."""

    def __init__(self, texts: Sequence[str], tokenizer: PlainTokenizer):
        self.passages: list[str] = []
        pages: list[int] = []
        for page, text in enumerate(texts):
            for passage in windows(text, tokenizer, DENSE_WINDOW_TOKENS):
                self.passages.append(passage)
                pages.append(page)
        self.page_of = np.asarray(pages, dtype=np.int64)
        self.vectors = np.zeros((0, 0), np.float32)

    async def embed(self, embed: Embed) -> None:
        if self.passages:
            self.vectors = np.asarray(await embed(self.passages), dtype=np.float32)

    def rank(self, question_vector: np.ndarray) -> list[int]:
        """Pages by their best passage's cosine with the question, best first."""
        if not self.passages:
            return []
        scores = self.vectors @ np.asarray(question_vector, dtype=np.float32)
        order = np.lexsort((np.arange(len(scores)), -scores))
        return list(dict.fromkeys(int(page) for page in self.page_of[order]))


def windows(text: str, tokenizer: PlainTokenizer, size: int) -> list[str]:
    """`text` cut into consecutive runs of at most `size` tokens (character ranges of the original text)."""
    if not text.strip():
        return []
    (encoding,) = tokenizer.encode([text])
    offsets = encoding.offsets
    return [text[offsets[i][0] : offsets[min(i + size, len(offsets)) - 1][1]] for i in range(0, len(offsets), size)]
