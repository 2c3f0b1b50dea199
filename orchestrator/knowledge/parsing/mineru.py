"""PDFs and page images -> ParsedDocument with MinerU 4, offline.

MinerU's public Python API does the work: `mineru.parser.parse(path, tier=..., ocr_mode=...)` (what
`mineru-kit parse` calls) returns a ParseResult; `ParseResult.save(writer)` writes the middle JSON with its
images as files (`images/page_1_table_2.jpg`, ...); `mineru.render.render(middle, RenderFormat.CONTENT_LIST)`
makes the V1 content list, which `read_content_list` turns into blocks, the same code that reads content lists
users bring.

Offline and private by construction:
- tier `flash` needs no models. It is run with `ocr_mode="txt"`: in `auto` a page without a text layer (a scan,
  a photo) makes MinerU fetch OCR models from Hugging Face, then ModelScope, for 20-30 s before failing (and
  write `model.source: modelscope` into ~/.mineru/config.yaml when `model_source` is "auto"). With
  `txt` such a page (and a PNG/JPEG input, which MinerU wraps in a one-page PDF) becomes one full-page image
  block. Higher tiers need models placed beforehand (`model_source="local"`, `model_dir`).
- telemetry: MinerU 4's only telemetry is in its `doclib` server (`mineru server`, and the `mineru` CLI's
  parse/read/scan/... commands that talk to it; not `mineru-kit`), whose flush loop posts
  to https://mineru.net/metrics/v2/metrics; its consent lives in the server's SQLite database, so
  `mineru telemetry disable` needs that server running and there is no environment switch. `mineru.parser`
  never imports `mineru.doclib` (checked: no `mineru.doclib*` module loaded and no socket opened during a
  parse). In subprocess mode the worker process also installs an audit hook that refuses every non-loopback
  lookup and connection, so neither telemetry nor a model download can leave the machine from it.

Modes, measured on the 2-core machine with the 3-page test report (benchmarks/thinkserve_bench/corpora/pdf_factory.py):
- "subprocess" (default): a fresh `python -m orchestrator.knowledge.parsing.mineru` per document, 2.2-3.2 s wall
  (imports, then the first parse in a process ~1.8 s), peak RSS ~140 MB, freed when it exits. 2,000 pages
  (benchmarks/thinkserve_bench/corpora/pdf_factory.write_long_pdf): 23 s and a peak RSS of 1.05 GB, which grows with the page count.
  A crash, a leak or a hang costs only that child; `timeout_s` kills its whole process group; settings apply
  per call through the child's environment.
- "inprocess": the first parse ~1.8 s, later ones ~0.1 s, but MinerU then lives in the caller's process:
  it keeps a pool of up to 3 spawned PDF-render processes alive for the process's lifetime (spawn requires an
  import-safe `__main__`), replaces loguru's default sink and sets `LOGURU_LEVEL` in `os.environ`, shares
  PDFium's process-wide state with everything else, reads its settings once at import (so `model_source` and
  `model_dir` cannot be applied), and `timeout_s` cannot stop it.
The fixed ~2 s is small next to ingesting the document (embedding, description), and a 1 GB peak must not
land in the server process, so isolation wins.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import json
import os
import resource
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Literal, Optional

from ...errors import (
    ConfigurationError,
    DeadlineExceededError,
    InvalidRequestError,
    ResourceExhaustedError,
    ThinkServeError,
)
from .content_list import read_content_list
from .documents import ParsedDocument
from .pdf import inspect_pdf, page_aspects

Tier = Literal["flash", "basic", "standard", "advanced"]
Mode = Literal["subprocess", "inprocess"]
OcrMode = Literal["auto", "txt", "ocr"]
ModelSource = Literal["local", "auto", "huggingface", "modelscope"]

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg"})
IMAGE_MAX_SIDE = 65_500  # pixels: JPEG's largest side, and MinerU writes an image document's page and crops as JPEG
CONTENT_LIST_NAME = "content_list.json"
MIDDLE_JSON_NAME = "middle_json.json"
RUN_RECORD_NAME = "mineru_run.json"
STDERR_TAIL_CHARS = 4000
EXIT_INVALID_INPUT = 3  # the worker's exit status when MinerU rejects the input itself
EXIT_OUT_OF_MEMORY = 4  # ... when the parse ran out of the memory it may use (memory_limit_mb)
FLASH_PARSER_MEMORY_MB = 8192  # the flash tier's default limit: 5x its peak on the dev PDFs (1.6 GB, a 160-page 10-K)
# how the libraries under MinerU report a failed allocation (Python, C++, libc, Rust, OpenBLAS), matched case-free
OUT_OF_MEMORY_SIGNS = ("memoryerror", "bad_alloc", "cannot allocate memory", "out of memory", "memory allocation")


class MineruError(ThinkServeError, RuntimeError):
    """MinerU failed on an input that passed our checks; carries the tail of MinerU's stderr."""

    def __init__(self, message: str, stderr_tail: str = ""):
        super().__init__(message + (f"\n--- MinerU stderr (tail) ---\n{stderr_tail}" if stderr_tail else ""))
        self.stderr_tail = stderr_tail


class MineruTimeoutError(MineruError, DeadlineExceededError):
    """The parse ran past `timeout_s` and was killed."""


class MineruMemoryError(MineruError, ResourceExhaustedError):
    """The parse needed more memory than it may use (`memory_limit_mb`), or the kernel killed it for memory:
    the document fails alone, and nothing else on the machine was put at risk."""


@dataclass(frozen=True)
class MineruOptions:
    """How MinerU runs. Defaults run offline on a CPU machine with no model files."""

    tier: Tier = "flash"
    mode: Mode = "subprocess"
    timeout_s: float = 600.0
    model_source: ModelSource = "local"  # "local": never download; higher tiers read models from model_dir
    model_dir: Optional[Path] = None  # MinerU's model folder (default ~/.mineru/models); subprocess mode only
    ocr_mode: Optional[OcrMode] = None  # None: "txt" for flash (it has no OCR models), "auto" otherwise
    # The parse process's address space, in MiB (subprocess mode; None: unlimited). One ordinary PDF (a vector
    # chart of 187,176 drawing objects) once took 21.6 GB; the flash tier's peak on the dev PDFs is 0.3-1.6 GB.
    memory_limit_mb: Optional[int] = None

    def __post_init__(self) -> None:
        if self.tier not in ("flash", "basic", "standard", "advanced"):
            raise ValueError(f"unknown MinerU tier {self.tier!r}: flash, basic, standard or advanced")
        if self.mode not in ("subprocess", "inprocess"):
            raise ValueError(f"unknown MinerU mode {self.mode!r}: subprocess or inprocess")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")
        if self.model_source not in ("local", "auto", "huggingface", "modelscope"):
            raise ValueError(f"unknown model_source {self.model_source!r}")
        if self.ocr_mode not in (None, "auto", "txt", "ocr"):
            raise ValueError(f"unknown ocr_mode {self.ocr_mode!r}: auto, txt or ocr")
        if self.memory_limit_mb is not None and self.memory_limit_mb <= 0:
            raise ValueError(f"memory_limit_mb must be positive (or None: unlimited), got {self.memory_limit_mb}")
        if self.mode == "inprocess" and self.model_dir is not None:
            raise ValueError("model_dir applies to subprocess mode only (in-process MinerU reads settings at import)")

    @property
    def effective_ocr_mode(self) -> OcrMode:
        return self.ocr_mode or ("txt" if self.tier == "flash" else "auto")


class MineruParser:
    """Parses one PDF or page image per call into a work folder it owns, and reads the result back."""

    def __init__(self, options: Optional[MineruOptions] = None):
        self.options = options or MineruOptions()

    @property
    def version(self) -> str:
        return metadata.version("mineru")

    def with_timeout(self, timeout_s: float) -> "MineruParser":
        """The same parser with another time limit (a range of pages gets its share of the document's)."""
        return MineruParser(dataclasses.replace(self.options, timeout_s=timeout_s))

    def parse(self, source: Path, work_dir: Path, page_range: str = "") -> ParsedDocument:
        """Parse `source` (PDF, PNG or JPEG); MinerU's content list and images end up in `work_dir`. `page_range`
        ("3-5", 1-based, MinerU's syntax) parses those pages only; blocks keep their page in the whole document."""
        source = Path(source)
        page_count = _check_input(source)
        work_dir = Path(work_dir)
        work_dir.mkdir(parents=True, exist_ok=True)
        for name in (CONTENT_LIST_NAME, MIDDLE_JSON_NAME, RUN_RECORD_NAME):
            (work_dir / name).unlink(missing_ok=True)  # a reused folder must not hand back an earlier parse
        started = time.monotonic()
        if self.options.mode == "subprocess":
            self._run_subprocess(source, work_dir, page_range)
        else:
            self._run_inprocess(source, work_dir, page_range)
        document = read_content_list(work_dir / CONTENT_LIST_NAME, page_count=page_count)
        document.parser = f"mineru-{self.version}/{self.options.tier}"
        if source.suffix.lower() == ".pdf":
            document.page_aspects = page_aspects(source)  # which pages are slides (sections.py)
        if not document.blocks:
            document.warnings.append(f"{source.name}: MinerU found no content in {page_count} page(s)")
        _record_seconds(work_dir, time.monotonic() - started)
        return document

    def _run_inprocess(self, source: Path, work_dir: Path, page_range: str = "") -> None:
        if self.options.tier != "flash":
            from mineru.config import config

            if config.model.source != self.options.model_source:
                raise ConfigurationError(
                    f"in-process MinerU uses model source {config.model.source!r}, not {self.options.model_source!r}: "
                    "set MINERU_MODEL_SOURCE before the process starts, or use subprocess mode"
                )
        try:
            parse_to_folder(source, work_dir, self.options.tier, self.options.effective_ocr_mode, page_range)
        except Exception as error:  # MinerU raises anything from ValueError to pypdfium2 and pydantic errors
            if _is_mineru_invalid_request(error):
                raise InvalidRequestError(f"{source.name}: MinerU rejected the input: {error}") from None
            raise MineruError(f"MinerU failed on {source.name}: {type(error).__name__}: {error}") from error

    def _run_subprocess(self, source: Path, work_dir: Path, page_range: str = "") -> None:
        command = [
            sys.executable,
            "-m",
            __name__,
            str(source.resolve()),
            str(work_dir.resolve()),
            "--tier",
            self.options.tier,
            "--ocr-mode",
            self.options.effective_ocr_mode,
        ]
        if self.options.memory_limit_mb is not None:
            command += ["--memory-limit-mb", str(self.options.memory_limit_mb)]
        if page_range:
            command += ["--page-range", page_range]
        started = time.monotonic()
        process = subprocess.Popen(
            command,
            env=self._child_environment(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: a timeout kills MinerU's render workers too
        )
        try:
            _, stderr = process.communicate(timeout=self.options.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            _, stderr = process.communicate()
            raise MineruTimeoutError(
                f"MinerU did not finish {source.name} within {self.options.timeout_s:g} s (killed)",
                _tail(stderr),
            ) from None
        except BaseException:
            _kill_group(process)
            process.wait()
            raise
        if process.returncode == EXIT_INVALID_INPUT:
            raise InvalidRequestError(f"{source.name}: MinerU rejected the input: {_last_line(stderr)}")
        out_of_memory = process.returncode == EXIT_OUT_OF_MEMORY or process.returncode == -signal.SIGKILL or (
            process.returncode != 0 and any(sign in _tail(stderr).casefold() for sign in OUT_OF_MEMORY_SIGNS)
        )
        if out_of_memory:
            limit = self.options.memory_limit_mb
            if limit is not None and process.returncode != -signal.SIGKILL:
                how = f"needed more than its memory limit of {limit} MiB (ingest.parser_memory_mb)"
            else:
                how = "was killed by SIGKILL, most likely by the kernel's out-of-memory killer"
            raise MineruMemoryError(
                f"MinerU's parse of {source.name} {how}, {time.monotonic() - started:.0f} s into it; the document "
                "was not ingested (a higher limit, or the document split into parts, can help)", _tail(stderr))
        if process.returncode != 0:
            raise MineruError(f"MinerU failed on {source.name} (exit status {process.returncode})", _tail(stderr))

    def _child_environment(self) -> dict[str, str]:
        env = dict(os.environ)
        package_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
        env["MINERU_MODEL_SOURCE"] = self.options.model_source
        if self.options.model_dir is not None:
            env["MINERU_MODEL_BASE_DIR"] = str(Path(self.options.model_dir).expanduser().resolve())
        env.setdefault("MINERU_LOG_LEVEL", "warning")  # MinerU logs every page at INFO on stderr
        if self.options.model_source == "local":
            env["HF_HUB_OFFLINE"] = "1"
        env["PYTHONUNBUFFERED"] = "1"
        return env


def _check_input(source: Path) -> int:
    """Refuse what MinerU should never see; returns the page count (1 for an image)."""
    suffix = source.suffix.lower()
    if suffix == ".pdf":
        return inspect_pdf(source)
    if suffix in IMAGE_SUFFIXES:
        if not source.is_file():
            raise InvalidRequestError(f"{source.name}: image file not found")
        from PIL import Image, UnidentifiedImageError

        # Decoded here, not only verified: verify() reads chunks and checksums, so a JPEG with flipped bytes or a
        # PNG with too little pixel data passed it and failed in MinerU's process, an internal error (found by
        # fuzzing). Pillow refuses past its decompression-bomb limit (179 Mpx) before decoding anything.
        try:
            with Image.open(source) as image:
                width, height = image.size
                if max(width, height) > IMAGE_MAX_SIDE:
                    raise InvalidRequestError(
                        f"{source.name}: the image is {width:,} x {height:,} pixels; a side may be at most "
                        f"{IMAGE_MAX_SIDE:,} (the largest JPEG, in which the parser writes its page and crops)"
                    )
                image.load()
        # DecompressionBombError: a few bytes declaring gigapixels (found by fuzzing: it was an internal error)
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
            raise InvalidRequestError(f"{source.name}: not a readable image ({error})") from None
        return 1
    raise InvalidRequestError(
        f"{source.name}: MinerU parsing takes PDF, PNG or JPEG files, not {suffix or 'files without a suffix'!r}"
    )


def parse_to_folder(source: Path, out_dir: Path, tier: str, ocr_mode: str, page_range: str = "") -> dict[str, Any]:
    """Run MinerU and write `middle_json.json`, `images/` and `content_list.json` (V1) into `out_dir`.

    The content list is rendered from the middle JSON as saved, after the images became files, so its
    `img_path` values are relative file paths rather than the inline data URIs of the in-memory result.
    """
    from mineru.parser import ParseResult, parse
    from mineru.parser.writer import DataWriter
    from mineru.render import RenderFormat, render

    root = Path(out_dir).resolve()

    class FolderWriter(DataWriter):
        """Writes the middle JSON and image assets only, never outside `root`."""

        def write(self, path: str, data: bytes) -> None:
            if path in ("markdown.md", "structured_content.json"):
                return  # not used here; the content list is derived from the middle JSON
            target = (root / path).resolve()
            if not target.is_relative_to(root):
                raise ValueError(f"MinerU asset path {path!r} leaves the output folder")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)

    started = time.monotonic()
    result = parse(Path(source), tier=tier, ocr_mode=ocr_mode, page_range=page_range)  # type: ignore[arg-type]
    ParseResult(middle_json=result.middle_json).save(FolderWriter())  # without the model output (~35 KB/page)
    saved = ParseResult.from_json((root / MIDDLE_JSON_NAME).read_text(encoding="utf-8"))
    content_list = render(saved.middle_json, RenderFormat.CONTENT_LIST)
    (root / CONTENT_LIST_NAME).write_text(json.dumps(content_list, ensure_ascii=False), encoding="utf-8")
    summary = {
        "pages": len(saved.middle_json.pages),
        "items": len(content_list),
        "mineru_seconds": round(time.monotonic() - started, 3),
    }
    (root / RUN_RECORD_NAME).write_text(json.dumps(summary), encoding="utf-8")
    return summary


def _is_mineru_invalid_request(error: BaseException) -> bool:
    """MinerU's own "bad input" error (bad page range, unsupported file), as opposed to a failure."""
    from mineru.errors import InvalidRequestError as MineruInvalidRequest

    return isinstance(error, MineruInvalidRequest)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(stderr: Optional[bytes]) -> str:
    text = (stderr or b"").decode("utf-8", errors="replace").strip()
    return text[-STDERR_TAIL_CHARS:]


def _last_line(stderr: Optional[bytes]) -> str:
    lines = _tail(stderr).splitlines()
    return lines[-1] if lines else "no reason given"


def _record_seconds(work_dir: Path, seconds: float) -> None:
    record = work_dir / RUN_RECORD_NAME
    data = json.loads(record.read_text(encoding="utf-8")) if record.is_file() else {}
    data["seconds"] = round(seconds, 3)
    record.write_text(json.dumps(data), encoding="utf-8")


def _refuse_network() -> None:
    """Audit hook for the worker process: loopback and Unix sockets only (local model servers still work)."""

    def is_local(host: Any) -> bool:
        if isinstance(host, bytes):
            host = host.decode(errors="replace")
        if host is None or host in ("", "localhost"):
            return True
        try:
            return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
        except ValueError:
            return False

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "socket.getaddrinfo" and not is_local(args[0]):
            raise PermissionError(f"network access refused in the MinerU worker (lookup of {args[0]!r})")
        if event == "socket.connect":
            address = args[1]
            if isinstance(address, tuple) and not is_local(address[0]):
                raise PermissionError(f"network access refused in the MinerU worker (connect to {address[0]!r})")

    sys.addaudithook(hook)


def _worker(argv: Optional[list[str]] = None) -> int:
    """Entry point of the subprocess: parse one file into the folder; exit 0, 3 (MinerU rejected it) or 1."""
    parser = argparse.ArgumentParser(description="Run one MinerU parse (ThinkServe worker)")
    parser.add_argument("source", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--tier", default="flash")
    parser.add_argument("--ocr-mode", default="txt")
    parser.add_argument("--memory-limit-mb", type=int, help="the address space this process (and each process it starts) may use")
    parser.add_argument("--page-range", default="", help="1-based pages to parse, MinerU's syntax (e.g. 3-5); all when empty")
    args = parser.parse_args(argv)
    if args.memory_limit_mb is not None:  # before MinerU is imported: the limit holds for all of it
        limit = args.memory_limit_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    _refuse_network()
    try:
        parse_to_folder(args.source, args.out_dir, args.tier, args.ocr_mode, args.page_range)
    except MemoryError:
        traceback.print_exc()
        return EXIT_OUT_OF_MEMORY
    except Exception as error:
        if _is_mineru_invalid_request(error):
            print(error, file=sys.stderr)
            return EXIT_INVALID_INPUT
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_worker())
