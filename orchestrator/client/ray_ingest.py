"""`thinkserve ingest --ray`: MinerU parses fan out over a Ray cluster (Ray Data); the orchestrator does the rest.

Parsing is the expensive, embarrassingly parallel part of ingest (seconds of CPU per document), so the PDFs and
page images found on the command line become a Ray Data dataset whose map step runs MinerU on the workers with
the server's parser settings (orchestrator/knowledge/parsing/mineru.py: flash tier, offline, a subprocess with network
refused, a timeout per document). Each result comes back as a zipped MinerU output folder: the content list, its
images/ and the original as `document_origin.<ext>`, from which the server takes the page count and the page
images (orchestrator/knowledge/sources.find_origin). The driver streams the zips to the Ingest RPC, a bounded
number at a time, so the server does only the model work and the commit. Markdown, text and content-list folders
have nothing to parse and are uploaded directly.

- Document names are the ones a plain `thinkserve ingest` gives, so replace and re-ingest work across both.
- The zip is deterministic (fixed member order and timestamps; MinerU's flash output is byte-identical across
  runs), so re-ingesting unchanged documents finds them already present, though only after parsing them again.
- A document that fails to parse (corrupt PDF, MinerU error, timeout) fails alone: the map step never raises
  (one raising row would stop the whole dataset), it returns the error's gRPC status name and message instead.
- The cluster: --ray-address (or Ray's RAY_ADDRESS) joins an existing one; otherwise a local cluster is started
  for the run (`address="local"`, so a cluster left running by `ray start` is not joined by accident) and
  stopped after it, with Ray's usage reporting off. Ray 2.60 turns token authentication on for local clusters
  (it writes ~/.ray/auth_token); joining a cluster that uses it needs RAY_AUTH_MODE=token and its token.
- Workers read the documents from their paths: on a cluster of several machines the paths must be readable at
  the same place on every node (a shared file system), and every node needs `thinkserve[ray]` installed.
- Ray is an optional extra, imported only here and only when --ray is used.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Optional

from ..errors import ConfigurationError, ThinkServeError
from ..knowledge.parsing.mineru import CONTENT_LIST_NAME, IMAGE_SUFFIXES, MineruOptions, MineruParser
from ..knowledge.parsing.local_documents import zip_files

RAY_MISSING = 'ingest --ray needs Ray, an optional extra: pip install "thinkserve[ray]"'
PARSED_SUFFIXES = frozenset({".pdf"} | IMAGE_SUFFIXES)  # what MinerU parses; everything else skips Ray
ORIGIN_STEM = "document_origin"  # `<anything>_origin.<ext>` is what the server looks for beside a content list
BUFFERED_RESULTS = 2  # parsed zips held by the driver beyond the uploads in flight


@dataclass(frozen=True)
class RayOptions:
    address: Optional[str] = None  # None: join RAY_ADDRESS if set, else start a local cluster for this run
    num_cpus: Optional[int] = None  # local cluster only; None: every core
    cpus_per_parse: float = 1.0
    mineru: MineruOptions = field(default_factory=MineruOptions)


class ParseFailure(Exception):
    """A document the Ray workers could not parse, with the gRPC status the server would have given it."""

    def __init__(self, status: str, message: str, node: str = ""):
        super().__init__(f"{status}: {message}")
        self.status, self.message, self.node = status, message, node


def import_ray() -> Any:
    """Ray and Ray Data, or a one-line ConfigurationError naming the extra to install."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise ConfigurationError(RAY_MISSING) from None
    return ray


def parsed_on_ray(path: Path) -> bool:
    """Whether --ray sends this document to the workers (PDFs and page images; folders and text go directly)."""
    return path.is_file() and path.suffix.lower() in PARSED_SUFFIXES


def pack_parse(source: Path, options: MineruOptions) -> bytes:
    """Parse one PDF or image with MinerU and zip its output as the server's content-list path reads it."""
    source = Path(source)
    with tempfile.TemporaryDirectory(prefix="thinkserve-ray-") as scratch:
        work = Path(scratch) / "mineru"
        MineruParser(options).parse(source, work)  # also checks the input and reads the content list back
        members = {CONTENT_LIST_NAME: work / CONTENT_LIST_NAME}
        members.update((p.relative_to(work).as_posix(), p) for p in (work / "images").rglob("*") if p.is_file())
        members[f"{ORIGIN_STEM}{source.suffix.lower()}"] = source
        return zip_files(members)


def parse_row(row: dict[str, Any], options: MineruOptions) -> dict[str, Any]:
    """The Ray Data map step: one document's zip, or its failure as data (never raises)."""
    result = {"index": row["index"], "data": b"", "status": "", "error": "", "node": socket.gethostname()}
    try:
        result["data"] = pack_parse(Path(row["path"]), options)
    except ThinkServeError as error:
        result.update(status=error.status.name, error=str(error))
    except Exception as error:  # MinerU and the file system raise anything; it is this document's failure
        result.update(status="INTERNAL", error=f"{type(error).__name__}: {error}")
    return result


class RaySession:
    """A connection to a Ray cluster for one ingest run: a local cluster started for it, or an existing one."""

    def __init__(self, options: RayOptions):
        self.options = options
        self.ray = import_ray()

    def start(self, log=print) -> "RaySession":
        ray, options = self.ray, self.options
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # a local cluster would report usage to Anyscale
        quiet = dict(logging_level=logging.ERROR, log_to_driver=False)  # failures come back as row data
        try:
            if options.address:
                log(f"connecting to the Ray cluster at {options.address} ...")
                ray.init(address=options.address, **quiet)
            elif os.environ.get("RAY_ADDRESS"):  # Ray's own way of naming a cluster to join
                log(f"connecting to the Ray cluster at RAY_ADDRESS={os.environ['RAY_ADDRESS']} ...")
                ray.init(num_cpus=options.num_cpus, **quiet)
            else:
                log(f"starting a local Ray cluster ({f'{options.num_cpus} CPUs' if options.num_cpus else 'all cores'}) ...")
                # "local": a new cluster even where `ray start` left one running (plain ray.init() would join it)
                ray.init(address="local", num_cpus=options.num_cpus, include_dashboard=False, **quiet)
        except Exception as error:  # Ray raises ConnectionError, RuntimeError, ValueError ... with long texts
            last = (str(error).strip().splitlines() or [""])[-1]
            hint = (
                "; if the cluster uses token authentication, set RAY_AUTH_MODE=token here and give its token "
                "(RAY_AUTH_TOKEN or ~/.ray/auth_token)"
                if (options.address or os.environ.get("RAY_ADDRESS")) and not os.environ.get("RAY_AUTH_MODE") else ""
            )
            raise ConfigurationError(f"Ray did not start: {type(error).__name__}: {last}{hint}") from error
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False  # the ingest has its own progress bar
        context.execution_options.preserve_order = False  # upload whatever finishes first
        logging.getLogger("ray.data").setLevel(logging.ERROR)  # its per-run INFO lines would cut through the bar
        cpus = ray.cluster_resources().get("CPU", 0)
        log(f"Ray: {cpus:g} CPUs for MinerU ({self.options.mineru.tier} tier)")
        return self

    def close(self) -> None:
        """Stops the local cluster, or disconnects from an existing one (which keeps running)."""
        self.ray.shutdown()

    async def parse(self, documents: list[tuple[int, Path]]) -> AsyncIterator[tuple[int, Any]]:
        """(index, zip bytes or ParseFailure) for every document, in the order the workers finish them.

        Ray Data's blocking iterator runs on a daemon thread; it takes a slot per result and the consumer gives it
        back when it takes the result, so at most BUFFERED_RESULTS wait here and Ray Data's own backpressure holds
        the rest. Leaving the loop early (an error, Ctrl-C) stops the thread at its next result.
        """
        if not documents:
            return
        rows = [{"index": index, "path": str(Path(path).resolve())} for index, path in documents]
        dataset = self.ray.data.from_items(rows, override_num_blocks=len(rows)).map(
            parse_row, fn_kwargs={"options": self.options.mineru}, num_cpus=self.options.cpus_per_parse
        )
        loop = asyncio.get_running_loop()
        results: asyncio.Queue = asyncio.Queue()
        slots = threading.Semaphore(BUFFERED_RESULTS)
        stop = threading.Event()

        def hand_over(kind: str, value: Any) -> None:
            try:
                loop.call_soon_threadsafe(results.put_nowait, (kind, value))
            except RuntimeError:  # the loop is gone: nobody is waiting any more
                pass

        def produce() -> None:
            try:
                for row in dataset.iter_rows():
                    while not slots.acquire(timeout=0.2):
                        if stop.is_set():
                            return
                    if stop.is_set():
                        return
                    hand_over("row", row)
            except BaseException as error:  # the cluster itself failed: every document not yet back fails with it
                hand_over("error", error)
            finally:
                hand_over("end", None)

        thread = threading.Thread(target=produce, name="ray-data-results", daemon=True)
        thread.start()
        try:
            while True:
                kind, value = await results.get()
                if kind == "end":
                    return
                if kind == "error":
                    raise value
                slots.release()
                if value["status"]:
                    yield value["index"], ParseFailure(value["status"], value["error"], value["node"])
                else:
                    yield value["index"], bytes(value["data"])
        finally:
            stop.set()


def ray_options_or_exit(address: Optional[str], num_cpus: Optional[int], mineru: MineruOptions) -> RayOptions:
    """RayOptions from the command line; Ray missing or options that do not combine end the command in one line."""
    if address and num_cpus:
        raise ConfigurationError("--ray-cpus sizes a local Ray cluster; an existing one (--ray-address) has its own CPUs")
    if num_cpus is not None and num_cpus < 1:
        raise ConfigurationError(f"--ray-cpus must be at least 1, got {num_cpus}")
    import_ray()
    return RayOptions(address=address, num_cpus=num_cpus, mineru=mineru)

