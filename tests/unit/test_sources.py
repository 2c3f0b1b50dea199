"""Upload kinds are decided from the bytes; zipped MinerU folders cannot write outside their folder."""

import io
import zipfile

import pytest

from orchestrator.errors import InvalidRequestError
from orchestrator.knowledge.parsing import sources
from orchestrator.local_documents import find_documents, read_source


def test_kind_comes_from_the_bytes_first():
    assert sources.detect("x.txt", b"%PDF-1.7 ...").kind == sources.PDF
    assert sources.detect("scan", b"\x89PNG\r\n\x1a\n....").kind == sources.IMAGE
    assert sources.detect("notes.md", b"# hi").kind == sources.MARKDOWN
    assert sources.detect("notes", b"hi", "text/plain").kind == sources.TEXT
    with pytest.raises(InvalidRequestError, match="'slides.pptx': unsupported document type \\(.pptx\\)"):
        sources.detect("slides.pptx", b"\x00\x01")


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
