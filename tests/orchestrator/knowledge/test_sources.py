"""Upload kinds are decided from the bytes; zipped MinerU folders cannot write outside their folder."""

import io
import zipfile

import pytest

from orchestrator.errors import InvalidRequestError
from orchestrator.knowledge.parsing import sources
from orchestrator.knowledge.parsing.local_documents import find_documents, read_source


def test_kind_comes_from_the_bytes_first():
    assert sources.detect("x.txt", b"%PDF-1.7 ...").kind == sources.PDF
    assert sources.detect("scan", b"\x89PNG\r\n\x1a\n....").kind == sources.IMAGE
    assert sources.detect("notes.md", b"# hi").kind == sources.MARKDOWN
    assert sources.detect("notes", b"hi", "text/plain").kind == sources.TEXT
    with pytest.raises(InvalidRequestError, match="'slides.pptx': unsupported document type \\(.pptx\\)"):
        sources.detect("slides.pptx", b"\x00\x01")


def _office(folder: str) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(f"{folder}document.xml", "<x/>")
    return buffer.getvalue()


@pytest.mark.parametrize(("data", "what"), [
    (b"<!DOCTYPE html>\n<html><body>Sign in</body></html>", "its bytes are an HTML page"),
    (bytes(range(7, 250)) * 3, "its bytes are binary data of no known format (729 bytes)"),
    (b"GIF89a\x01\x00", "its bytes are a GIF image"),
    (b"Quarterly figures, typed into a file named like a PDF.", "its bytes are plain text"),
    (b"\x1f\x8b\x08\x00", "its bytes are a gzip-compressed file"),
    (_office("word/"), "its bytes are a Word document (.docx)"),
])
def test_a_mislabelled_file_is_refused_with_what_it_actually_is(data, what):
    """Issue 54: an HTML page or random bytes named .pdf were told 'unsupported document type (.pdf); accepted:
    PDF, ...', as if a PDF were not accepted."""
    with pytest.raises(InvalidRequestError) as refused:
        sources.detect("report.pdf", data)
    message = str(refused.value)
    assert message.startswith("'report.pdf' is not a PDF (named .pdf): " + what), message
    assert "unsupported document type" not in message
    with pytest.raises(InvalidRequestError, match="is not a PDF \\(sent as application/pdf\\): " + what.replace("(", "\\(").replace(")", "\\)")):
        sources.detect("upload", data, "application/pdf")  # a declared PDF must be one too
    with pytest.raises(InvalidRequestError, match="'scan.png' is not a PNG image \\(named .png\\)"):
        sources.detect("scan.png", data)


def test_an_empty_file_is_refused_as_empty_whatever_its_name():
    for name in ("report.pdf", "notes.md", "scan.png", "folder.zip", "x"):
        with pytest.raises(InvalidRequestError, match=f"'{name}' is empty \\(0 bytes\\): nothing to ingest"):
            sources.detect(name, b"")


def test_unsupported_kinds_are_named_and_a_late_pdf_header_is_still_a_pdf():
    with pytest.raises(InvalidRequestError, match="unsupported document type \\(.pptx\\); its bytes are a PowerPoint"):
        sources.detect("slides.pptx", _office("ppt/"))
    with pytest.raises(InvalidRequestError, match="'a.zip' is not a zip archive \\(named .zip\\): its bytes are plain text"):
        sources.detect("a.zip", b"not a zip")
    assert sources.detect("scan.pdf", b"\r\n junk before the header %PDF-1.4\n...").kind == sources.PDF


def test_a_zipped_folder_that_stores_its_original_pdf_is_a_content_list_not_a_pdf():
    """A MinerU folder zipped without compression shows its `_origin.pdf`'s %PDF- header in the first KiB: it was
    taken for a PDF and MinerU failed on the zip (CI, the content-list-with-original ingest test)."""
    folder = zipped({"long/long_content_list.json": "[]", "long/long_origin.pdf": b"%PDF-1.7\n..."})
    assert b"%PDF-" in folder[:sources.PDF_HEADER_WITHIN]
    for name in ("long", "long.zip"):
        assert sources.detect(name, folder).kind == sources.CONTENT_LIST
    with pytest.raises(InvalidRequestError, match="'long.pdf' is not a PDF \\(named .pdf\\): its bytes are a zip archive of 2 files"):
        sources.detect("long.pdf", folder)


def zipped(members):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


@pytest.mark.parametrize("member", ["../evil.json", "/etc/evil", "a/../../evil", "a\\..\\evil"])
def test_archive_members_outside_the_folder_are_refused(tmp_path, member):
    archive = tmp_path / "upload.zip"
    archive.write_bytes(zipped({"doc_content_list.json": "[]", member: "x"}))
    with pytest.raises(InvalidRequestError, match="points outside the archive's folder: refused"):
        sources.unpack_content_list(archive, tmp_path / "out", "upload.zip")
    assert not (tmp_path / "evil.json").exists() and not (tmp_path / "out").exists()


def test_archive_without_a_content_list_and_a_broken_archive(tmp_path):
    archive = tmp_path / "a.zip"
    archive.write_bytes(zipped({"images/a.png": "x"}))
    with pytest.raises(InvalidRequestError, match="holds no \\*_content_list.json"):
        sources.unpack_content_list(archive, tmp_path / "out", "a.zip")
    archive.write_bytes(b"PK\x03\x04 broken")
    with pytest.raises(InvalidRequestError, match="not a readable zip archive"):
        sources.unpack_content_list(archive, tmp_path / "out2", "a.zip")


def test_folders_are_walked_and_mineru_folders_travel_zipped(tmp_path):
    (tmp_path / "docs" / "report").mkdir(parents=True)
    (tmp_path / "docs" / "report" / "report_content_list.json").write_text("[]")
    (tmp_path / "docs" / "report" / "images").mkdir()
    (tmp_path / "docs" / "report" / "images" / "fig.png").write_bytes(b"png")
    (tmp_path / "docs" / "a.md").write_text("# A")
    (tmp_path / "docs" / "sub").mkdir()
    (tmp_path / "docs" / "sub" / "b.pdf").write_bytes(b"%PDF-")
    (tmp_path / "docs" / "skip.exe").write_bytes(b"MZ")
    found = find_documents([tmp_path / "docs"])
    assert [name for _, name in found] == ["report", "a.md", "sub/b.pdf"]
    source = read_source(tmp_path / "docs" / "report", "report")
    assert source.media_type == "application/zip"
    assert sorted(zipfile.ZipFile(io.BytesIO(source.data)).namelist()) == ["images/fig.png", "report_content_list.json"]
