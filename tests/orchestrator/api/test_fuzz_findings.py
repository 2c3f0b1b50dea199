"""Regression tests for what the fuzzing benchmark (thinkserve_bench.scripts.fuzz) found, one each: every case
was a server error (UNKNOWN / INTERNAL / HTTP 500) for input that is the client's mistake."""

import pytest

from orchestrator.api import decoding
from orchestrator.api.protos import pb
from orchestrator.errors import InvalidRequestError
from orchestrator.knowledge.parsing.mineru import _check_input
from thinkserve_bench.fuzzing.hostile_files import png


def test_bytes_that_are_no_request_message_are_invalid_argument_not_unknown():
    """Raw bytes sent to any unary method: grpc's deserializer raised DecodeError, answered as UNKNOWN."""
    decode = decoding._tolerant(pb.QueryRequest.FromString, "QueryRequest")
    bad = decode(b"\x0a\xff\xff\xff\xff\x0f")  # field 1 (collection), a length past the end
    assert isinstance(bad, decoding.Undecodable)
    with pytest.raises(InvalidRequestError, match="the request is not a valid QueryRequest message"):
        decoding.checked(bad)
    good = decode(pb.QueryRequest(collection="c", question="q").SerializeToString())
    assert decoding.checked(good).collection == "c"


def test_every_method_of_the_service_gets_the_tolerant_deserializer():
    class Server:
        def add_generic_rpc_handlers(self, handlers):
            self.generic = handlers

        def add_registered_method_handlers(self, service, handlers):
            self.handlers = handlers

    server = Server()
    decoding.add_service(object.__new__(type("S", (), {name: None for name in pb.DESCRIPTOR.services_by_name["ThinkServe"]
                                                        .methods_by_name})), server)
    assert set(server.handlers) == set(pb.DESCRIPTOR.services_by_name["ThinkServe"].methods_by_name)
    for name, handler in server.handlers.items():
        assert isinstance(handler.request_deserializer(b"\xff\xff\xff"), decoding.Undecodable), name


def test_a_png_declaring_gigapixels_is_refused_as_a_client_error(tmp_path):
    """A 200-byte PNG declaring 50,000 x 50,000 pixels: Pillow's DecompressionBombError went up as an internal error."""
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(png(50_000, 50_000, b"x\x9c\x03\x00\x00\x00\x00\x01"))
    with pytest.raises(InvalidRequestError, match="bomb.png: not a readable image .*decompression bomb"):
        _check_input(bomb)


BROKEN_SECOND_PAGE = b"""%PDF-1.4
1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj
2 0 obj << /Type /Pages /Kids [3 0 R 4 0 R] /Count 2 >> endobj
3 0 obj << /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >> endobj
4 0 obj 42 endobj
trailer << /Root 1 0 R >>
%%EOF
"""


def test_a_pdf_page_pdfium_cannot_load_is_refused_naming_the_page(tmp_path):
    """A corrupted PDF that opens but whose second page object is broken: reading its text layer (which OCR
    starts from) raised PdfiumError up to an HTTP 500; rendering its pages and counting their objects too."""
    from orchestrator.knowledge.parsing.pdf import inspect_pdf, page_object_counts, render_page_png, render_pages, text_layer_characters

    path = tmp_path / "damaged.pdf"
    path.write_bytes(BROKEN_SECOND_PAGE)
    assert inspect_pdf(path) == 2  # it opens: the damage shows only at the page
    for read in (lambda: text_layer_characters(path), lambda: render_pages(path, tmp_path / "pages", 50, 500),
                 lambda: render_page_png(path, 1, 50, 500), lambda: page_object_counts(path)):
        with pytest.raises(InvalidRequestError, match="damaged.pdf: PDF page 2 of 2 cannot be read .*the file is damaged"):
            read()
    assert render_page_png(path, 0, 50, 500)[1] > 0  # the sound page still renders


def test_a_giant_pdf_page_is_rendered_with_its_longer_side_capped(tmp_path):
    """A 1.4 KB PDF with one 14,400-point-square page (PDF's largest; PDFium renders larger): ingest rendered its
    page image at 100 dpi uncapped, a 20,000-pixel-square bitmap, 4.4 GB at the peak, and the server was OOM-killed
    (the fuzzer's first defect, every later case refused a connection). A 4,000-point page here: 5,556 pixels
    before, the cap after."""
    import asyncio

    from PIL import Image

    from orchestrator.config import Settings
    from orchestrator.knowledge.ingest import Ingestor, _Stages
    from orchestrator.knowledge.parsing.pdf import render_page_png, render_pages, render_scale
    from orchestrator.knowledge.storage.registry import KnowledgeBase
    from tests.conftest import MODEL_REPOSITORY
    from tests.model_double import InProcessModels
    from thinkserve_bench.fuzzing.hostile_files import small_pdf

    config = Settings.load(overrides={"triton": {"model_repository": str(MODEL_REPOSITORY)}})
    cap = config.ingest.page_render_max_side
    poster = tmp_path / "poster.pdf"
    poster.write_bytes(small_pdf(1, (4000.0, 4000.0)))
    ingestor = Ingestor(KnowledgeBase(tmp_path / "data"), InProcessModels(), config.ingest, config.tokenizer_file)
    [page] = asyncio.run(ingestor._render(poster, tmp_path / "pages", _Stages()))
    with Image.open(page) as image:
        assert max(image.size) == cap < 4000 * config.ingest.page_render_dpi / 72

    # every renderer is bounded whatever the page: the largest, a sliver, a point
    assert render_scale(20_000.0, 20_000.0, 100.0, cap) * 20_000 == pytest.approx(cap)
    assert render_scale(612.0, 792.0, 100.0, cap) == pytest.approx(100 / 72)  # print sizes keep their dpi
    for size, expected in (((14_400.0, 14_400.0), (500, 500)), ((14_400.0, 1.0), (500, 1)), ((1.0, 1.0), (2, 2))):
        poster.write_bytes(small_pdf(1, size))
        [page] = render_pages(poster, tmp_path / f"{size}", 100.0, 500)
        with Image.open(page) as image:
            assert image.size == expected, size
        assert len(render_page_png(poster, 0, 150.0, 500)[0]) > 0
    with pytest.raises(ValueError, match="max_side must be positive"):
        render_pages(poster, tmp_path / "none", 100.0, 0)


def test_an_image_that_does_not_decode_or_is_wider_than_a_jpeg_is_refused_before_the_parser(tmp_path):
    """Images that passed Pillow's verify() (chunks and checksums) and failed in MinerU's process, each an internal
    error: a JPEG whose scan data is damaged, a PNG declaring 1,000 x 1,000 pixels with a few bytes of them, and a
    PNG 200,000 pixels wide (MinerU writes the page as JPEG, whose sides stop at 65,500)."""
    import zlib

    from thinkserve_bench.fuzzing.hostile_files import small_jpeg

    jpeg = bytearray(small_jpeg())
    scan = jpeg.index(b"\xff\xda")  # start of scan: what follows is the entropy-coded image
    jpeg[scan + 20 : scan + 60] = b"\xff" * 40
    cases = {
        "flipped.jpg": (bytes(jpeg), "flipped.jpg: not a readable image .*broken data stream"),
        "short.png": (png(1000, 1000, zlib.compress(b"\x00" * 1000)), "short.png: not a readable image .*truncated"),
        "thin.png": (png(200_000, 1), "thin.png: the image is 200,000 x 1 pixels; a side may be at most 65,500"),
    }
    for name, (data, message) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(InvalidRequestError, match=message):
            _check_input(path)
    for name, data in (("sound.jpg", small_jpeg()), ("sound.png", png(40, 30)), ("wide.png", png(50_000, 1))):
        (tmp_path / name).write_bytes(data)
        assert _check_input(tmp_path / name) == 1
