"""Slide decks generated on the fly, each slide with a title of its own, so tests can check that every passage is
filed under its own slide's title.

The slides are drawn as presentation software exports them (16:9 pages, a title at the top, bullets, a logo
above the title and a footer with the deck's name and the slide's number on every slide) and vary where a title
rule could go wrong: a title barely larger than its bullets, a title on two lines, a section divider that is only
a title, a slide with a chart and no bullets. `image_only` draws each slide as one picture (a deck exported as
images: no text layer, every word read by OCR).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pypdfium2 as pdfium
from PIL import Image
from reportlab.lib.utils import ImageReader
from reportlab.pdfgen import canvas

from .pdf_factory import draw_bar_chart

PAGE = (960.0, 540.0)  # points: 13.33 x 7.5 inches, PowerPoint's 16:9
FOOTER = "Westbrook transit plan 2025"
LOGO = "WESTBROOK TRANSIT"  # small, at the top right of every slide, above the title's line


@dataclass(frozen=True)
class Slide:
    title: str
    bullets: tuple[str, ...] = ()
    title_size: int = 34
    body_size: int = 22
    chart: bool = False


@dataclass(frozen=True)
class Deck:
    path: Path
    slides: tuple[Slide, ...]

    def title_of(self, page: int) -> str:
        return self.slides[page].title


SLIDES = (
    Slide("Westbrook transit plan", ("Prepared for the city council in March 2025.",), title_size=44),
    Slide("Why the plan is needed", (
        "Traffic on Harbour Road grew by 18 percent since 2019.",
        "Two of three commuters drive alone to work.",
        "Bus ridership fell to 41,000 trips a day.",
    )),
    Slide("City policies to reduce trips", (
        "Parking downtown is priced by demand from July.",
        "Employers with 100 staff offer transit passes.",
        "New offices must provide secure bicycle rooms.",
    ), title_size=26, body_size=22),
    Slide("Bicycle lanes on Mill Street", (
        "A protected lane of 2.4 kilometres opens in autumn.",
        "Cyclists counted at the bridge rose to 3,150 a day.",
    )),
    Slide("Funding sources", ()),
    Slide("Regional rail and the Diridon link to the airport and the stadium", (
        "Trains every ten minutes between Diridon and Westbrook.",
        "The station platform is extended to 300 metres.",
        "Construction is planned from 2026 to 2029.",
    ), title_size=30, body_size=24),
    Slide("Ridership by quarter", (), chart=True),
    Slide("Average household income along the corridor", (
        "The average household income near the corridor is 68,400 dollars.",
        "Households without a car make up 14 percent.",
    ), title_size=30),
    Slide("Questions and next steps", (
        "Public hearings are held on 4 and 11 June.",
        "Comments can be sent until 30 June.",
    )),
)


def write_deck(path: Path, slides: tuple[Slide, ...] = SLIDES, image_only: bool = False, dpi: int = 150) -> Deck:
    """The deck as a PDF; with `image_only`, each page is a picture of the slide (rendered at `dpi`)."""
    chart: Optional[Path] = None
    if any(slide.chart for slide in slides):
        chart = draw_bar_chart(path.with_name(path.stem + "-chart.png"), [("Q1", 38), ("Q2", 44), ("Q3", 51), ("Q4", 57)])
    drawn = path if not image_only else path.with_name(path.stem + "-text.pdf")
    pdf = canvas.Canvas(str(drawn), pagesize=PAGE)
    for number, slide in enumerate(slides, start=1):
        _draw_slide(pdf, slide, number, chart)
        pdf.showPage()
    pdf.save()
    if image_only:
        _as_pictures(drawn, path, dpi)
        drawn.unlink()
    return Deck(path, slides)


def _draw_slide(pdf: canvas.Canvas, slide: Slide, number: int, chart: Optional[Path]) -> None:
    width, height = PAGE
    if not slide.bullets and not slide.chart:  # a section divider: the title alone, in the middle
        pdf.setFont("Helvetica-Bold", slide.title_size + 6)
        pdf.drawCentredString(width / 2, height / 2, slide.title)
    else:
        pdf.setFont("Helvetica-Bold", slide.title_size)
        words, lines = slide.title.split(), []
        for word in words:  # a title too wide for one line goes on two
            candidate = f"{lines[-1]} {word}" if lines else word
            if lines and pdf.stringWidth(candidate, "Helvetica-Bold", slide.title_size) <= width - 120:
                lines[-1] = candidate
            else:
                lines.append(word)
        y = height - 80
        for line in lines:
            pdf.drawString(60, y, line)
            y -= slide.title_size * 1.15
        y -= 24
        pdf.setFont("Helvetica", slide.body_size)
        for bullet in slide.bullets:
            pdf.drawString(80, y, "\u2022")
            pdf.drawString(110, y, bullet)
            y -= slide.body_size * 2
        if slide.chart and chart is not None:
            pdf.drawImage(str(chart), 200, 70, width=480, height=300)
    pdf.setFont("Helvetica", 11)
    pdf.drawRightString(width - 40, height - 36, LOGO)
    pdf.drawString(60, 24, FOOTER)
    pdf.drawRightString(width - 60, 24, str(number))


def _as_pictures(source: Path, target: Path, dpi: int) -> None:
    document = pdfium.PdfDocument(str(source))
    try:
        pdf = canvas.Canvas(str(target), pagesize=PAGE)
        for page in document:
            image: Image.Image = page.render(scale=dpi / 72).to_pil()
            buffer = io.BytesIO()
            image.save(buffer, "PNG")
            pdf.drawImage(ImageReader(io.BytesIO(buffer.getvalue())), 0, 0, width=PAGE[0], height=PAGE[1])
            pdf.showPage()
        pdf.save()
    finally:
        document.close()
