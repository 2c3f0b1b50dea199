"""The pieces of `ingest --ray` that need no cluster: deterministic packing, originals beside a content list,
failures carried as data, and the one-line error when the Ray extra is missing."""

from __future__ import annotations

import io
import sys
import zipfile

import pytest

from orchestrator import cli
from orchestrator.errors import ConfigurationError, InvalidRequestError
from orchestrator.knowledge.parsing import sources
from orchestrator.knowledge.parsing.mineru import MineruOptions
from orchestrator.knowledge.parsing.local_documents import zip_files
from orchestrator.client.ray_ingest import RAY_MISSING, import_ray, parse_row, parsed_on_ray
from thinkserve_bench.corpora import pdf_factory

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16


def test_zip_bytes_depend_only_on_names_and_contents(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "content_list.json").write_text("[]")
    (tmp_path / "a" / "x.png").write_bytes(PNG)
    first = zip_files({"content_list.json": tmp_path / "a" / "content_list.json", "images/x.png": tmp_path / "a" / "x.png"})
    (tmp_path / "b").mkdir()  # written later, so other timestamps; members given in another order
    (tmp_path / "b" / "x.png").write_bytes(PNG)
    (tmp_path / "b" / "content_list.json").write_text("[]")
    second = zip_files({"images/x.png": tmp_path / "b" / "x.png", "content_list.json": tmp_path / "b" / "content_list.json"})
    assert first == second
    assert zipfile.ZipFile(io.BytesIO(first)).namelist() == ["content_list.json", "images/x.png"]


def test_the_original_beside_a_content_list_is_found_and_checked(tmp_path):
    content_list = tmp_path / "doc_content_list.json"
    content_list.write_text("[]")
    (tmp_path / "doc_layout.pdf").write_bytes(b"%PDF-")  # MinerU's debug render: never the original
    assert sources.find_origin(content_list) is None
    (tmp_path / "doc_origin.pdf").write_bytes(b"%PDF-")
    assert sources.find_origin(content_list) == tmp_path / "doc_origin.pdf"
    (tmp_path / "scan_origin.png").write_bytes(PNG)
    with pytest.raises(InvalidRequestError, match="holds 2 original documents"):
        sources.find_origin(content_list)
    (tmp_path / "doc_origin.pdf").unlink()
    assert sources.find_origin(content_list) == tmp_path / "scan_origin.png"
    (tmp_path / "scan_origin.png").write_bytes(b"GIF89a")
    with pytest.raises(InvalidRequestError, match="not a PNG or JPEG"):
        sources.find_origin(content_list)


def test_a_document_that_cannot_be_parsed_comes_back_as_data(tmp_path):
    corrupt = pdf_factory.write_corrupt_pdf(tmp_path / "corrupt.pdf")
    row = parse_row({"index": 3, "path": str(corrupt)}, MineruOptions())
    assert row["index"] == 3 and row["data"] == b"" and row["status"] == "INVALID_ARGUMENT"
    assert "corrupt.pdf: PDF is corrupt or not a PDF" in row["error"] and row["node"]
    missing = parse_row({"index": 4, "path": str(tmp_path / "gone.pdf")}, MineruOptions())
    assert missing["status"] == "INVALID_ARGUMENT" and "gone.pdf: PDF file not found" in missing["error"]


def test_only_pdfs_and_images_go_to_ray(tmp_path):
    for name in ("a.pdf", "b.PNG", "c.jpeg", "d.md", "e.txt"):
        (tmp_path / name).write_bytes(b"x")
    assert [p.name for p in sorted(tmp_path.iterdir()) if parsed_on_ray(p)] == ["a.pdf", "b.PNG", "c.jpeg"]
    assert not parsed_on_ray(tmp_path)  # a content-list folder is uploaded as it is


def test_without_ray_installed_the_command_says_what_to_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(ConfigurationError) as missing:
        import_ray()
    assert str(missing.value) == RAY_MISSING and 'pip install "thinkserve[ray]"' in RAY_MISSING
    (tmp_path / "a.md").write_text("# A")
    assert cli.main(["ingest", "--address", "127.0.0.1:1", "--collection", "c", "--ray", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"thinkserve: error: {RAY_MISSING}"


def test_ray_options_need_ray(tmp_path, capsys):
    (tmp_path / "a.md").write_text("# A")
    assert cli.main(["ingest", "--address", "127.0.0.1:1", "--collection", "c", "--ray-cpus", "2", str(tmp_path)]) == 2
    assert "--ray-address and --ray-cpus go with --ray" in capsys.readouterr().err
