"""Content lists of every MinerU variant -> exact blocks; hostile or broken files -> clear errors."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import InvalidRequestError
from orchestrator.knowledge.parsing.content_list import read_content_list, table_text
from orchestrator.knowledge.parsing.documents import Block, ParsedDocument
from orchestrator.knowledge.ingest import _textless_pages

TABLE_HTML = (
    "<table><tr><th>Region</th><th>Revenue</th></tr>"
    "<tr><td>North</td><td>1&#44;250</td></tr><tr><td>South &amp; West</td><td>980</td></tr></table>"
)
TABLE_TEXT = "Region | Revenue\nNorth | 1,250\nSouth & West | 980"


def tiny_png() -> bytes:
    """A valid 1x1 PNG without Pillow."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00\xff\x00\x00")
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def write_list(folder: Path, items: Any, name: str = "doc_content_list.json", assets: tuple[str, ...] = ()) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for asset in assets:
        (folder / asset).parent.mkdir(parents=True, exist_ok=True)
        (folder / asset).write_bytes(tiny_png())
    path = folder / name
    path.write_text(json.dumps(items), encoding="utf-8")
    return path


V1_ITEMS: list[dict[str, Any]] = [
    {"type": "header", "text": "Northwind annual report", "bbox": [100, 20, 900, 40], "page_idx": 0},
    {"type": "text", "text": "Northwind 2024", "text_level": 1, "bbox": [279, 94, 721, 119], "page_idx": 0},
    {"type": "text", "text": "  Revenue grew to 48 million euros.  ", "bbox": [131, 151, 766, 165], "page_idx": 0},
    {"type": "list", "sub_type": "text", "list_items": ["- Lyon", "- Porto"], "bbox": [131, 170, 400, 200], "page_idx": 0},
    {"type": "page_footnote", "text": "1 Audited figures.", "bbox": [131, 900, 600, 915], "page_idx": 0},
    {"type": "page_number", "text": "1", "bbox": [490, 960, 510, 975], "page_idx": 0},
    {
        "type": "table",
        "img_path": "images/table.jpg",
        "table_caption": ["Table 1: Revenue by region."],
        "table_footnote": ["In thousands of euros."],
        "table_body": TABLE_HTML,
        "bbox": [262, 159, 738, 245],
        "page_idx": 1,
    },
    {
        "type": "equation",
        "img_path": "images/eq.jpg",
        "text": "$$E = mc^2$$",
        "text_format": "latex",
        "bbox": [300, 300, 700, 330],
        "page_idx": 1,
    },
    {
        "type": "code",
        "sub_type": "code",
        "code_body": "print('hi')",
        "code_caption": ["Listing 1"],
        "code_footnote": [],
        "bbox": [131, 400, 600, 440],
        "page_idx": 1,
    },
    {"type": "aside_text", "text": "Draft", "bbox": [950, 400, 990, 600], "page_idx": 1},
    {"type": "footer", "text": "Confidential", "bbox": [100, 970, 900, 985], "page_idx": 1},
    {
        "type": "image",
        "img_path": "images/figure.jpg",
        "image_caption": ["Figure 1: Shipments", "per quarter."],
        "image_footnote": ["Source: logistics."],
        "bbox": [167, 131, 833, 426],
        "page_idx": 2,
    },
    {
        "type": "chart",
        "img_path": "images/chart.jpg",
        "content": "Q1 42, Q2 55",
        "chart_caption": ["Figure 2: Orders."],
        "chart_footnote": [],
        "bbox": [167, 500, 833, 800],
        "page_idx": 2,
    },
    {"type": "seal", "text": "stamp", "bbox": [0, 0, 10, 10], "page_idx": 2},
]
V1_ASSETS = ("images/table.jpg", "images/eq.jpg", "images/figure.jpg", "images/chart.jpg")
V1_BLOCKS = [
    Block("title", "Northwind 2024", page=0, bbox=(279, 94, 721, 119), level=1),
    Block("text", "Revenue grew to 48 million euros.", page=0, bbox=(131, 151, 766, 165)),
    Block("list", "- Lyon\n- Porto", page=0, bbox=(131, 170, 400, 200)),
    Block("footnote", "1 Audited figures.", page=0, bbox=(131, 900, 600, 915)),
    Block(
        "table",
        TABLE_TEXT,
        page=1,
        bbox=(262, 159, 738, 245),
        asset="images/table.jpg",
        caption="Table 1: Revenue by region.",
        footnote="In thousands of euros.",
        table_html=TABLE_HTML,
    ),
    Block("equation", "$$E = mc^2$$", page=1, bbox=(300, 300, 700, 330), asset="images/eq.jpg"),
    Block("code", "print('hi')", page=1, bbox=(131, 400, 600, 440), caption="Listing 1"),
    Block("aside", "Draft", page=1, bbox=(950, 400, 990, 600)),
    Block(
        "image",
        "",
        page=2,
        bbox=(167, 131, 833, 426),
        asset="images/figure.jpg",
        caption="Figure 1: Shipments\nper quarter.",
        footnote="Source: logistics.",
    ),
    Block("chart", "Q1 42, Q2 55", page=2, bbox=(167, 500, 833, 800), asset="images/chart.jpg", caption="Figure 2: Orders."),
]


def test_v1_every_item_type(tmp_path):
    path = write_list(tmp_path / "doc", V1_ITEMS, assets=V1_ASSETS)
    document = read_content_list(path)
    assert document.blocks == V1_BLOCKS
    assert document.parser == "content_list_v1"
    assert document.page_count == 3
    assert document.asset_root == (tmp_path / "doc").resolve()
    assert all((document.asset_root / b.asset).is_file() for b in document.blocks if b.asset)
    assert document.warnings == [
        "dropped 3 page headers, footers and page numbers (running heads)",
        "skipped items of types this reader does not know: seal (1)",
    ]


def test_mineru_1x_field_names_and_missing_bboxes(tmp_path):
    items = [
        {"type": "text", "text": "Intro", "text_level": 2, "page_idx": 0},
        {
            "type": "image",
            "img_path": "images/a.jpg",
            "img_caption": ["Figure 3: Old style."],
            "img_footnote": ["Note."],
            "page_idx": 4,
        },
    ]
    document = read_content_list(write_list(tmp_path, items, assets=("images/a.jpg",)))
    assert document.blocks == [
        Block("title", "Intro", page=0, level=2),
        Block("image", "", page=4, asset="images/a.jpg", caption="Figure 3: Old style.", footnote="Note."),
    ]
    assert document.page_count == 5
    assert document.warnings == []


def span(text: str, kind: str = "text") -> dict[str, Any]:
    return {"type": kind, "content": text}


V2_PAGES: list[list[dict[str, Any]]] = [
    [
        {"type": "page_header", "content": {"page_header_content": [span("Northwind")]}, "bbox": [100, 20, 900, 40]},
        {"type": "title", "content": {"title_content": [span("Northwind 2024")], "level": 1}, "bbox": [279, 94, 721, 119]},
        {
            "type": "paragraph",
            "content": {
                "paragraph_content": [
                    span("Energy is "),
                    span("E=mc^2", "equation_inline"),
                    span(", see "),
                    {"type": "hyperlink", "content": "the site", "url": "https://x"},
                    span("."),
                ]
            },
            "bbox": [131, 151, 766, 165],
        },
        {
            "type": "list",
            "content": {
                "list_type": "text_list",
                "attribute": "unordered",
                "list_items": [
                    {"item_type": "text", "item_content": [span("- Lyon")]},
                    {"item_type": "text", "item_content": [span("- Porto")]},
                ],
            },
            "bbox": [131, 170, 400, 200],
        },
        {"type": "page_footnote", "content": {"page_footnote_content": [span("1 Audited figures.")]}, "bbox": [131, 900, 600, 915]},
    ],
    [
        {
            "type": "table",
            "content": {
                "image_source": {"path": "images/table.jpg"},
                "table_caption": [span("Table 1: Revenue by region.")],
                "table_footnote": [span("In thousands of euros.")],
                "html": TABLE_HTML,
                "table_type": "simple_table",
                "table_nest_level": 1,
            },
            "bbox": [262, 159, 738, 245],
        },
        {
            "type": "equation_interline",
            "content": {"math_content": "E = mc^2", "math_type": "latex", "image_source": {"path": "images/eq.jpg"}},
            "bbox": [300, 300, 700, 330],
        },
        {
            "type": "code",
            "content": {
                "code_caption": [span("Listing 1")],
                "code_content": [span("print('hi')")],
                "code_footnote": [],
                "code_language": "python",
            },
            "bbox": [131, 400, 600, 440],
        },
        {"type": "page_aside_text", "content": {"page_aside_text_content": [span("Draft")]}, "bbox": [950, 400, 990, 600]},
        {"type": "page_number", "content": {"page_number_content": [span("2")]}, "bbox": [490, 960, 510, 975]},
    ],
    [
        {
            "type": "image",
            "content": {
                "image_source": {"path": "images/figure.jpg"},
                "image_caption": [span("Figure 1: Shipments")],
                "image_footnote": [],
            },
            "bbox": [167, 131, 833, 426],
        },
        {
            "type": "chart",
            "content": {
                "image_source": {"path": "images/chart.jpg"},
                "content": "Q1 42",
                "chart_caption": [span("Figure 2: Orders.")],
                "chart_footnote": [],
            },
            "bbox": [167, 500, 833, 800],
        },
    ],
    [],  # a blank last page still counts
]


def test_v2_pages(tmp_path):
    path = write_list(tmp_path, V2_PAGES, name="doc_content_list_v2.json", assets=V1_ASSETS)
    document = read_content_list(path)
    assert document.parser == "content_list_v2"
    assert document.page_count == 4
    assert document.blocks == [
        Block("title", "Northwind 2024", page=0, bbox=(279, 94, 721, 119), level=1),
        Block("text", "Energy is $E=mc^2$, see the site.", page=0, bbox=(131, 151, 766, 165)),
        Block("list", "- Lyon\n- Porto", page=0, bbox=(131, 170, 400, 200)),
        Block("footnote", "1 Audited figures.", page=0, bbox=(131, 900, 600, 915)),
        Block(
            "table",
            TABLE_TEXT,
            page=1,
            bbox=(262, 159, 738, 245),
            asset="images/table.jpg",
            caption="Table 1: Revenue by region.",
            footnote="In thousands of euros.",
            table_html=TABLE_HTML,
        ),
        Block("equation", "E = mc^2", page=1, bbox=(300, 300, 700, 330), asset="images/eq.jpg"),
        Block("code", "print('hi')", page=1, bbox=(131, 400, 600, 440), caption="Listing 1"),
        Block("aside", "Draft", page=1, bbox=(950, 400, 990, 600)),
        Block("image", "", page=2, bbox=(167, 131, 833, 426), asset="images/figure.jpg", caption="Figure 1: Shipments"),
        Block("chart", "Q1 42", page=2, bbox=(167, 500, 833, 800), asset="images/chart.jpg", caption="Figure 2: Orders."),
    ]
    assert document.warnings == ["dropped 2 page headers, footers and page numbers (running heads)"]


def test_known_page_count_wins_over_items(tmp_path):
    path = write_list(tmp_path, [{"type": "text", "text": "a", "page_idx": 0}])
    assert read_content_list(path, page_count=7).page_count == 7
    assert read_content_list(path).page_count == 1


def image_item(img_path: str, page: int = 0) -> dict[str, Any]:
    return {"type": "image", "img_path": img_path, "image_caption": [], "bbox": [0, 0, 10, 10], "page_idx": page}


@pytest.mark.parametrize("img_path", ["../secret.png", "images/../../secret.png", "..\\secret.png", "/etc/passwd", "C:/secret.png"])
def test_asset_paths_leaving_the_folder_are_refused(tmp_path, img_path):
    (tmp_path / "secret.png").write_bytes(tiny_png())
    items = [{"type": "text", "text": "ok", "page_idx": 0}, image_item(img_path)]
    with pytest.raises(InvalidRequestError) as error:
        read_content_list(write_list(tmp_path / "upload", items))
    message = str(error.value)
    assert "doc_content_list.json" in message and "item 1" in message and repr(img_path) in message


def test_symlink_escaping_the_folder_is_refused(tmp_path):
    (tmp_path / "secret.png").write_bytes(tiny_png())
    folder = tmp_path / "upload"
    (folder / "images").mkdir(parents=True)
    (folder / "images" / "innocent.png").symlink_to(tmp_path / "secret.png")
    with pytest.raises(InvalidRequestError, match=r"item 0: image path 'images/innocent.png' points outside"):
        read_content_list(write_list(folder, [image_item("images/innocent.png")]))


def test_v2_asset_escape_is_refused_with_its_page_and_item(tmp_path):
    pages = [[], [{"type": "image", "content": {"image_source": {"path": "../x.png"}}, "bbox": [0, 0, 1, 1]}]]
    with pytest.raises(InvalidRequestError, match=r"page 1 item 0: image path '\.\./x\.png'"):
        read_content_list(write_list(tmp_path / "upload", pages))


def test_paths_that_stay_inside_and_links_inside_are_fine(tmp_path):
    folder = tmp_path / "upload"
    write_list(folder, [], assets=("images/a.png",))
    (folder / "images" / "link.png").symlink_to(folder / "images" / "a.png")
    items = [image_item("images/../images/a.png"), image_item("./images/link.png")]
    document = read_content_list(write_list(folder, items))
    assert [b.asset for b in document.blocks] == ["images/a.png", "images/a.png"]


def test_missing_asset_keeps_the_block_with_a_warning(tmp_path):
    items = [{**image_item("images/gone.jpg"), "image_caption": ["Figure 9"]}]
    document = read_content_list(write_list(tmp_path, items))
    assert document.blocks == [Block("image", "", page=0, bbox=(0, 0, 10, 10), caption="Figure 9")]
    assert document.warnings == ["item 0: image file 'images/gone.jpg' is missing; block kept without its image"]


def test_inline_and_remote_images_are_not_kept(tmp_path):
    items = [image_item("data:image/jpeg;base64,/9j/4AAQ"), image_item("https://example.com/a.png")]
    document = read_content_list(write_list(tmp_path, items))
    assert [b.asset for b in document.blocks] == ["", ""]
    assert len(document.warnings) == 2 and all("embedded or remote" in w for w in document.warnings)


def test_bboxes_are_clamped_and_ordered(tmp_path):
    items = [{"type": "text", "text": "a", "bbox": [-5, 990.4, 1200, 10], "page_idx": 0}]
    document = read_content_list(write_list(tmp_path, items))
    assert document.blocks[0].bbox == (0, 10, 1000, 990)
    assert document.warnings == ["1 bboxes were outside the 0-1000 scale of content_list_v1 and were clamped"]


@pytest.mark.parametrize(
    "bad_item, problem",
    [
        ({"text": "no type", "page_idx": 0}, "item 1: has no 'type' (skipped)"),
        ({"type": "text", "text": "x"}, "item 1: has no 'page_idx' (skipped)"),
        ({"type": "text", "text": "x", "page_idx": -1}, "item 1: page_idx -1 is not a page index (0-based, non-negative) (skipped)"),
        ({"type": "text", "text": "x", "page_idx": 0, "bbox": [1, 2, 3]}, "item 1: bbox [1, 2, 3] is not four numbers (skipped)"),
        ({"type": "text", "text": ["x"], "page_idx": 0}, "item 1: text is a JSON list, not a string (skipped)"),
        ("just a string", "item 1: is a JSON str, not an object (skipped)"),
    ],
)
def test_one_broken_item_is_skipped_with_a_warning(tmp_path, bad_item, problem):
    good = {"type": "text", "text": "fine", "page_idx": 0}
    document = read_content_list(write_list(tmp_path, [good, bad_item, good]))
    assert [b.content for b in document.blocks] == ["fine", "fine"]
    assert document.warnings == [problem]


def test_mostly_broken_items_make_the_file_unusable(tmp_path):
    items = [{"name": "a"}, {"name": "b"}, {"type": "text", "text": "x", "page_idx": 0}]
    with pytest.raises(InvalidRequestError, match=r"doc_content_list.json: 2 of 3 items are unusable.*item 0: has no 'type'"):
        read_content_list(write_list(tmp_path, items))


@pytest.mark.parametrize(
    "raw, message",
    [
        (b'[{"type": "text", ', r"x.json: content list is not valid JSON \(Expecting .* at line 1 column 19\)"),
        (b'[{"type": "text", "text": "\xff\xfe"}]', r"x.json: content list is not UTF-8 text \(invalid byte at offset 27\)"),
        (b'{"pages": []}', r"x.json: not a MinerU content list \(top level is a JSON dict, expected a list\)"),
        (b'[{"type": "text", "page_idx": 0}, []]', r"x.json: item 1 is a list among objects"),
    ],
)
def test_unusable_files_are_refused(tmp_path, raw, message):
    path = tmp_path / "x.json"
    path.write_bytes(raw)
    with pytest.raises(InvalidRequestError, match=message):
        read_content_list(path)


def test_missing_file_is_refused(tmp_path):
    with pytest.raises(InvalidRequestError, match="nothing.json: content list file not found"):
        read_content_list(tmp_path / "nothing.json")


def test_utf8_bom_and_empty_list_are_accepted(tmp_path):
    path = tmp_path / "x.json"
    path.write_bytes("\ufeff[]".encode("utf-8"))
    document = read_content_list(path)
    assert document.blocks == [] and document.page_count == 0
    assert document.warnings == ["the content list has no items"]


def test_table_text_flattens_rows_cells_and_nested_tables():
    html = (
        "<table><thead><tr><th rowspan='2'>Name</th><th>Value<br/>(EUR)</th></tr></thead>"
        "<tbody><tr><td><b>A</b></td><td><table><tr><td>in</td><td>ner</td></tr></table></td></tr></tbody></table>"
    )
    assert table_text(html) == "Name | Value (EUR)\nA | in ner"
    assert table_text("") == ""
    assert table_text("| a | b |") == "| a | b |"  # Markdown bodies are kept as they are


def test_many_missing_assets_give_a_bounded_list_of_warnings(tmp_path):
    items = [image_item(f"images/{n}.jpg", page=n) for n in range(25)]
    document = read_content_list(write_list(tmp_path, items))
    assert len(document.blocks) == 25
    assert len(document.warnings) == 21
    assert document.warnings[-1] == "... and 5 more items kept incomplete"


def test_absurdly_nested_json_is_refused(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InvalidRequestError, match="deep.json: content list is nested too deeply"):
        read_content_list(path)


def test_running_heads_are_kept_when_they_are_the_documents_only_text(tmp_path):
    # three pages of one short line each, every one marked a header or footer: the whole document
    items = [{"type": "header" if page % 2 else "footer", "text": f"Line {page}", "bbox": [100, 20, 900, 40], "page_idx": page}
             for page in range(3)]
    items.append({"type": "page_number", "text": "3", "bbox": [480, 960, 520, 980], "page_idx": 2})
    document = read_content_list(write_list(tmp_path, items))
    assert [(b.type, b.content, b.page) for b in document.blocks] == [("text", "Line 0", 0), ("text", "Line 1", 1), ("text", "Line 2", 2)]
    assert document.warnings == [
        "kept 3 lines marked as page headers, footers or page numbers (running heads): they are the only text of the document"]
    # V2 the same way
    pages = [[{"type": "page_header", "content": {"page_header_content": [{"type": "text", "content": f"Line {page}"}]},
               "bbox": [100, 20, 900, 40]}] for page in range(2)]
    document = read_content_list(write_list(tmp_path / "v2", pages))
    assert [(b.content, b.page) for b in document.blocks] == [("Line 0", 0), ("Line 1", 1)]
    # with any content of its own, a document's running heads are dropped; a malformed one is only dropped
    items = [{"type": "header", "text": 7, "page_idx": 0}, {"type": "footer", "text": "Draft", "bbox": "x", "page_idx": 0},
             {"type": "text", "text": "The body.", "page_idx": 0}]
    document = read_content_list(write_list(tmp_path / "body", items))
    assert [b.content for b in document.blocks] == ["The body."]
    assert document.warnings == ["dropped 2 page headers, footers and page numbers (running heads)"]


def test_textless_pages_are_named_with_what_can_still_find_them(tmp_path):
    blocks = [Block("text", "Revenue grew.", page=0), Block("image", "", page=2, caption="Figure 1: a chart")]
    without_renders = ParsedDocument(blocks, page_count=3, parser="content_list_v1")
    (warning,) = _textless_pages(without_renders)
    assert warning.startswith("1 of 3 pages have no extractable text (page 2): the parser (content_list_v1) found none")
    assert warning.endswith("only the captions of their figures and tables (no page images: the document came "
                            "without its original) can be found")
    with_renders = ParsedDocument(blocks, page_count=3, parser="mineru-4.0.12/flash", page_images=[tmp_path] * 3)
    (warning,) = _textless_pages(with_renders)
    assert "MinerU's flash tier does no OCR" in warning and warning.endswith("only their page images and captions can be found")
    (warning,) = _textless_pages(with_renders, ocr_read_pages=True)
    assert "(page 2): OCR found no words on them either; only their page images" in warning
