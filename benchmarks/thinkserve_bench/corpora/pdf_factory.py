"""PDFs generated on the fly, so parser and ingest tests need no binary fixtures and know the exact content.

`write_sample_report` returns what it put on each page (sentences, cell values, captions) so tests can assert
on it; `write_long_pdf` pages say their number (`long_pdf_lines`).
"""

from __future__ import annotations

import io
import random
from dataclasses import dataclass
from pathlib import Path

import pypdfium2 as pdfium
from PIL import Image, ImageDraw
from reportlab.lib import colors
from reportlab.lib.pagesizes import A4
from reportlab.lib.styles import getSampleStyleSheet
from reportlab.lib.units import cm
from reportlab.pdfgen import canvas
from reportlab.platypus import Image as FlowImage
from reportlab.platypus import PageBreak, Paragraph, SimpleDocTemplate, Spacer, Table, TableStyle


@dataclass(frozen=True)
class SampleReport:
    """What `write_sample_report` put on each page."""

    path: Path
    title: str
    sentences: list[str]  # page 0 paragraphs
    table_caption: str  # page 1
    table_rows: list[list[str]]  # header first
    figure_caption: str  # page 2
    chart_png: Path  # the chart drawn on page 2, as a PNG file of its own
    pages: int = 3


SENTENCES = [
    "Northwind Traders grew its annual revenue to 48 million euros in the fiscal year 2024.",
    "The company opened three new distribution centres in Lyon, Porto and Gdansk during the spring.",
    "Operating margin improved to 12 percent because freight costs fell after the new contracts.",
]
TABLE_ROWS = [
    ["Region", "Revenue", "Growth"],
    ["North", "1250", "4.5%"],
    ["South", "980", "7.1%"],
    ["East", "1430", "2.3%"],
]
TABLE_CAPTION = "Table 1: Revenue by region in thousands of euros."
FIGURE_CAPTION = "Figure 1: Quarterly shipments in thousands of units."
CHART_VALUES = [("Q1", 42), ("Q2", 55), ("Q3", 61), ("Q4", 78)]


def draw_bar_chart(path: Path, values: list[tuple[str, int]] = CHART_VALUES, size: tuple[int, int] = (640, 400)) -> Path:
    """A plain bar chart PNG drawn with PIL (matplotlib is a dev extra, and PIL keeps this fast)."""
    width, height = size
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    left, bottom, top = 60, height - 50, 30
    draw.line([(left, top), (left, bottom), (width - 20, bottom)], fill="black", width=2)
    peak = max(v for _, v in values)
    slot = (width - 20 - left) // len(values)
    palette = ["#4472c4", "#ed7d31", "#a5a5a5", "#70ad47"]
    for i, (label, value) in enumerate(values):
        x0 = left + i * slot + slot // 5
        x1 = x0 + slot * 3 // 5
        y0 = bottom - int((bottom - top) * value / peak)
        draw.rectangle([x0, y0, x1, bottom], fill=palette[i % len(palette)], outline="black")
        draw.text((x0 + 5, bottom + 10), label, fill="black")
        draw.text((x0 + 5, y0 - 15), str(value), fill="black")
    image.save(path, format="PNG")
    return path


def write_sample_report(path: Path) -> SampleReport:
    """Three pages: title + paragraphs, a gridded table with a caption, a bar chart with a caption."""
    styles = getSampleStyleSheet()
    chart = draw_bar_chart(path.with_name(path.stem + "-chart.png"))
    title = "Northwind Annual Report 2024"
    story: list = [Paragraph(title, styles["Title"]), Spacer(1, 0.5 * cm)]
    for sentence in SENTENCES:
        story += [Paragraph(sentence, styles["BodyText"]), Spacer(1, 0.3 * cm)]
    story += [PageBreak(), Paragraph("Regional results", styles["Heading2"]), Spacer(1, 0.3 * cm)]
    story.append(Paragraph(TABLE_CAPTION, styles["BodyText"]))
    table = Table(TABLE_ROWS, colWidths=[4 * cm, 3 * cm, 3 * cm])
    table.setStyle(
        TableStyle(
            [
                ("GRID", (0, 0), (-1, -1), 0.8, colors.black),
                ("BACKGROUND", (0, 0), (-1, 0), colors.lightgrey),
                ("FONTNAME", (0, 0), (-1, 0), "Helvetica-Bold"),
            ]
        )
    )
    story += [Spacer(1, 0.2 * cm), table, Spacer(1, 0.5 * cm)]
    story.append(Paragraph("Sales in the East region remain the largest of the three regions.", styles["BodyText"]))
    story += [PageBreak(), Paragraph("Shipments", styles["Heading2"]), Spacer(1, 0.3 * cm)]
    story += [FlowImage(str(chart), width=14 * cm, height=8.75 * cm), Spacer(1, 0.2 * cm)]
    story.append(Paragraph(FIGURE_CAPTION, styles["BodyText"]))
    SimpleDocTemplate(str(path), pagesize=A4, title=title).build(story)
    return SampleReport(path, title, list(SENTENCES), TABLE_CAPTION, [list(r) for r in TABLE_ROWS], FIGURE_CAPTION, chart)


def write_long_pdf(path: Path, pages: int) -> Path:
    """`pages` pages, each a heading and a short paragraph naming its page, drawn straight on a canvas (fast:
    2,000 pages in under a second). Text sits in the body of the page: lines near the top edge are taken by
    MinerU for running heads and dropped."""
    pdf = canvas.Canvas(str(path), pagesize=A4, pageCompression=1)
    for number in range(1, pages + 1):
        pdf.setFont("Helvetica-Bold", 14)
        pdf.drawString(72, 640, f"Section {number}")
        text = pdf.beginText(72, 610)
        text.setFont("Helvetica", 11)
        text.setLeading(15)
        for line in long_pdf_lines(number):
            text.textLine(line)
        pdf.drawText(text)
        pdf.showPage()
    pdf.save()
    return path


def write_header_line_pdf(path: Path, pages: int) -> Path:
    """`pages` pages of one short line each, near the top edge, where MinerU takes a line for a running head."""
    pdf = canvas.Canvas(str(path), pagesize=A4)
    for number in range(1, pages + 1):
        pdf.setFont("Helvetica", 11)
        pdf.drawString(72, 800, f"Short note number {number}.")
        pdf.showPage()
    pdf.save()
    return path


def long_pdf_lines(number: int) -> list[str]:
    """The paragraph on page `number` (1-based) of `write_long_pdf`; its keyword is unique to the page."""
    return [
        f"This is the body text of page {number}, written for the long document test.",
        f"Its unique keyword is item-{number:05d}, which appears on no other page.",
        "The remaining words only fill the line so that the paragraph looks like prose.",
    ]


def write_encrypted_pdf(path: Path, password: str = "secret") -> Path:
    """A one-page PDF that needs a password to open."""
    pdf = canvas.Canvas(str(path), pagesize=A4, encrypt=password)
    pdf.drawString(72, 770, "Confidential.")
    pdf.showPage()
    pdf.save()
    return path


def write_corrupt_pdf(path: Path, size: int = 4096, seed: int = 7) -> Path:
    """Random bytes behind a PDF header: what a truncated or mangled upload looks like."""
    rng = random.Random(seed)
    path.write_bytes(b"%PDF-1.7\n" + bytes(rng.getrandbits(8) for _ in range(size)))
    return path


def write_empty_pdf(path: Path) -> Path:
    """A structurally valid PDF with zero pages (pypdfium2 writes one; reportlab always adds a page)."""
    document = pdfium.PdfDocument.new()
    try:
        buffer = io.BytesIO()
        document.save(buffer)
    finally:
        document.close()
    path.write_bytes(buffer.getvalue())
    return path


FILLER_TOPICS = ["depot maintenance", "staff rota", "fleet inspection", "supplier audit", "safety drill", "canteen menu",
                 "parking permits", "archive storage", "visitor badges", "printer leases"]
DEEP_FACT = "The Halvorsen turbine contract was signed for 7.4 million kroner on 12 March 2025."


def write_long_chunk_report(path: Path, fact_page: int = 2, pages: int = 4) -> Path:
    """`pages` pages of running prose (one section, so one 1,200-token chunk spans them all) with DEEP_FACT as
    a paragraph of its own in the middle of page `fact_page` (0-based), and a last page holding only a picture
    (no text MinerU's flash tier can extract)."""
    styles = getSampleStyleSheet()
    story: list = [Paragraph("Operations review", styles["Title"]), Spacer(1, 0.4 * cm)]
    for page in range(pages):
        for n in range(3):
            if page == fact_page and n == 1:
                story += [Paragraph(DEEP_FACT, styles["BodyText"]), Spacer(1, 0.3 * cm)]
            topic = FILLER_TOPICS[(page * 3 + n) % len(FILLER_TOPICS)]
            sentence = (f"The committee reviewed the {topic} for period {page * 3 + n + 1} and agreed that the routine "
                        f"checks continue as planned, with the usual weekly notes kept in the shared binder.")
            story += [Paragraph(" ".join([sentence] * 2), styles["BodyText"]), Spacer(1, 0.3 * cm)]
        story.append(PageBreak())
    chart = draw_bar_chart(path.with_name(path.stem + "-picture.png"))
    story.append(FlowImage(str(chart), width=14 * cm, height=8.75 * cm))
    SimpleDocTemplate(str(path), pagesize=A4, title="Operations review").build(story)
    return path


@dataclass(frozen=True)
class OcrCases:
    """What `write_ocr_cases` put on each page: the cases OCR's decisions tell apart."""

    path: Path
    chart_labels: list[str]  # page 0: text, a chart picture whose labels are in the text layer, its caption
    figure_caption: str
    scanned_words: list[str]  # page 1: a picture of a page, words drawn in it, no text layer
    blank_page: int = 2  # nothing drawn
    photo_page: int = 3  # a photo-like picture without text, no text layer
    photo_figure_page: int = 0  # ... and the same photo smaller, a figure on page 0 beside the chart
    pages: int = 4


def photo(size: tuple[int, int] = (800, 600)) -> Image.Image:
    """A smooth colour field with soft waves: a picture holding no text."""
    import numpy as np

    height, width = size[1], size[0]
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([x / width * 255, y / height * 200, 128 + 60 * np.sin(x / 50) * np.cos(y / 40)], axis=-1)
    return Image.fromarray(pixels.astype(np.uint8))


def write_ocr_cases(path: Path) -> OcrCases:
    """Four pages: (0) text, a bar chart picture with its labels drawn over it as text (so the text layer holds
    them: what a PDF's vector chart or a table exported as a picture gives a parser), its caption, and a small photo
    without text; (1) a page that is only a picture of words (a scan); (2) a blank page; (3) a page that is only a
    photo without text."""
    from reportlab.lib.utils import ImageReader
    from PIL import ImageFont

    labels = ["Shipments Q1", "Shipments Q2", "Shipments Q3", "Shipments Q4"]
    scanned = ["Harbour crane capacity doubled", "Rotterdam terminal 2025"]
    chart = draw_bar_chart(path.with_name(path.stem + "-chart.png"))
    width, height = A4
    pdf = canvas.Canvas(str(path), pagesize=A4)
    pdf.setFont("Helvetica", 11)
    for row, sentence in enumerate(SENTENCES):
        pdf.drawString(60, height - 80 - 18 * row, sentence)
    pdf.drawImage(ImageReader(str(chart)), 80, 300, width=400, height=250)
    pdf.setFont("Helvetica", 9)
    for column, label in enumerate(labels):
        pdf.drawString(110 + 90 * column, 310, label)
    pdf.setFont("Helvetica", 10)
    pdf.drawString(80, 285, FIGURE_CAPTION)
    pdf.drawImage(ImageReader(photo((400, 300))), 80, 60, width=200, height=150)
    pdf.showPage()
    scan = Image.new("RGB", (1240, 1754), "white")
    draw = ImageDraw.Draw(scan)
    font = ImageFont.load_default(size=48)
    for row, line in enumerate(scanned):
        draw.text((120, 200 + 120 * row), line, fill="black", font=font)
    pdf.drawImage(ImageReader(scan), 0, 0, width=width, height=height)
    pdf.showPage()
    pdf.showPage()  # blank
    pdf.drawImage(ImageReader(photo()), 0, 0, width=width, height=height)
    pdf.showPage()
    pdf.save()
    return OcrCases(path, labels, FIGURE_CAPTION, scanned)
