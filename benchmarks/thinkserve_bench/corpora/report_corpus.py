"""A deterministic PDF corpus for the ingest benchmark: report-like pages with prose, tables and a chart.

Every document differs (seeded names and figures), so content hashing never deduplicates two of them.
"""

from __future__ import annotations

import random
from pathlib import Path

from reportlab.lib import colors
from reportlab.lib.pagesizes import A4
from reportlab.lib.styles import getSampleStyleSheet
from reportlab.lib.units import cm
from reportlab.platypus import Image, PageBreak, Paragraph, SimpleDocTemplate, Spacer, Table, TableStyle

from .pdf_factory import draw_bar_chart

COMPANIES = ["Northwind", "Contoso", "Fabrikam", "Tailspin Toys", "Woodgrove Bank", "Litware", "Adventure Works", "Proseware"]
PLACES = ["Aarhus", "Brno", "Lyon", "Porto", "Leeds", "Graz", "Utrecht", "Gdansk", "Singapore", "Osaka"]
TOPICS = ["revenue", "operating margin", "energy use", "headcount", "order backlog", "research spending"]


def write_corpus(folder: Path, documents: int, pages: int, seed: int = 2024) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    return [_write_document(folder / f"report-{n:03d}.pdf", pages, random.Random(seed + n)) for n in range(documents)]


def _sentence(rng: random.Random) -> str:
    company, place, topic = rng.choice(COMPANIES), rng.choice(PLACES), rng.choice(TOPICS)
    value = rng.randint(2, 900)
    return rng.choice(
        [
            f"{company} reported {topic} of {value} million euros at its {place} site.",
            f"In {place}, {company} changed its {topic} by {value / 10:.1f} percent compared with last year.",
            f"The board of {company} expects {topic} in {place} to reach {value} units next year.",
            f"{company} and {rng.choice(COMPANIES)} agreed to share the {place} warehouse from March.",
        ]
    )


def _write_document(path: Path, pages: int, rng: random.Random) -> Path:
    styles = getSampleStyleSheet()
    chart = draw_bar_chart(path.with_suffix(".chart.png"), [(q, rng.randint(20, 90)) for q in ("Q1", "Q2", "Q3", "Q4")])
    story: list = [Paragraph(f"{rng.choice(COMPANIES)} annual review {path.stem}", styles["Title"])]
    for page in range(pages):
        story.append(Paragraph(f"Section {page + 1}: {rng.choice(TOPICS).title()}", styles["Heading2"]))
        for _ in range(4):
            story += [Paragraph(" ".join(_sentence(rng) for _ in range(4)), styles["BodyText"]), Spacer(1, 0.2 * cm)]
        if page % 4 == 1:
            rows = [["Site", "Units", "Change"]] + [[p, str(rng.randint(100, 999)), f"{rng.uniform(-9, 9):.1f}%"] for p in rng.sample(PLACES, 4)]
            table = Table(rows, colWidths=[4 * cm, 3 * cm, 3 * cm])
            table.setStyle(TableStyle([("GRID", (0, 0), (-1, -1), 0.8, colors.black)]))
            story += [Paragraph(f"Table {page}: units by site.", styles["BodyText"]), table]
        if page == pages // 2:
            story += [Image(str(chart), width=12 * cm, height=7.5 * cm), Paragraph("Figure 1: quarterly shipments.", styles["BodyText"])]
        story.append(PageBreak())
    SimpleDocTemplate(str(path), pagesize=A4).build(story)
    path.with_suffix(".chart.png").unlink()
    return path
