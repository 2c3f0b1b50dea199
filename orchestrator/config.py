"""Typed settings, loaded once (TOML file, then explicit overrides) and passed down; nothing reads the environment.

Relative paths are resolved against the folder the server is started from, so a checkout works as is.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import ConfigurationError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TritonSettings(_Section):
    # An already-running Triton to use (gRPC "host:port"). Empty: `serve` launches and supervises its own.
    url: str = ""
    model_repository: Path = Path("model_repository/tiny")  # in Settings: model_repository/<profile> unless set
    # Python environment the python-backend stubs run in (numpy<2, onnxruntime, thinkserve-backend).
    model_environment: Path = Path(".venv-triton")
    # Folder holding bin/tritonserver and backends/; empty: the nvidia-pytriton wheel, then /opt/tritonserver.
    install_root: Optional[Path] = None
    # Ports on 127.0.0.1 (Triton never binds other interfaces); 0 picks a free port.
    grpc_port: int = Field(0, ge=0, le=65535)
    http_port: int = Field(0, ge=0, le=65535)
    metrics_port: int = Field(0, ge=0, le=65535)
    startup_timeout_s: float = Field(240.0, gt=0)
    exit_timeout_s: int = Field(10, ge=2)  # below 2 s Triton always leaks its /dev/shm regions
    log_dir: Path = Path(".thinkserve/logs")
    log_verbose: int = Field(0, ge=0)
    call_timeout_s: float = Field(60.0, gt=0)  # deadline of one Triton call when the request sets none


class ServerSettings(_Section):
    host: str = "127.0.0.1"
    port: int = Field(50051, ge=0, le=65535)  # 0 picks a free port
    max_message_bytes: int = Field(64 * 1024 * 1024, gt=0)
    max_question_chars: int = Field(4000, gt=0)
    max_upload_bytes: int = Field(50 * 1024 * 1024, gt=0)
    default_deadline_s: float = Field(120.0, gt=0)  # when the client sends no deadline
    shutdown_grace_s: float = Field(10.0, ge=0)


class StorageSettings(_Section):
    data_dir: Path = Path(".thinkserve/data")


class RetrievalSettings(_Section):
    top_k: int = Field(5, ge=1)
    max_top_k: int = Field(50, ge=1)


class IndexSettings(_Section):
    """FAISS index kind for every vector table of a collection (derived data: changing it needs no re-ingest)."""

    kind: Literal["flat", "ivf", "hnsw"] = "flat"
    ivf_lists: int = Field(0, ge=0)  # 0: about 4 * sqrt(vectors)
    ivf_probe: int = Field(16, ge=1)
    ivf_min_vectors: int = Field(10_000, ge=1)  # fewer vectors: exact Flat instead (IVF cannot train on them)
    hnsw_neighbors: int = Field(32, ge=4)
    hnsw_ef_search: int = Field(128, ge=1)
    use_gpu: bool = True  # when faiss sees a GPU


class IngestSettings(_Section):
    # Text stream: windows of the embedder's tokens (LightRAG's 1,200 / 100).
    chunk_tokens: int = Field(1200, ge=16)
    chunk_overlap_tokens: int = Field(100, ge=0)
    # The embedder reads at most this many tokens: longer chunks are embedded as the mean of such pieces.
    embed_window_tokens: int = Field(254, ge=8)
    # The embedder's tokenizer.json; empty: the one the model repository's text_embedder_tokenize serves.
    tokenizer: Optional[Path] = None
    # Entities and relations: "cooccurrence" (model-free, GraphRAG's fast mode) or "llm" (through Triton).
    extractor: Literal["cooccurrence", "llm"] = "cooccurrence"
    extraction_max_tokens: int = Field(512, ge=16)
    # Images, tables, equations: "caption" (caption, footnote and table text) or "vlm" (described through Triton).
    describer: Literal["caption", "vlm"] = "caption"
    description_context_blocks: int = Field(2, ge=0)  # neighbouring blocks on each side given to the VLM
    description_max_tokens: int = Field(128, ge=8)
    # Page renders for page-image retrieval, embedded by every page-image encoder family.
    page_images: bool = True
    page_render_dpi: float = Field(40.0, gt=0)
    max_pages: int = Field(1000, ge=1)  # a PDF with more pages is refused with a clear error
    # MinerU: the offline "flash" tier by default; "basic" / "standard" / "advanced" need their model folders.
    parser_tier: str = "flash"
    parser_mode: Literal["subprocess", "inprocess"] = "subprocess"
    parser_timeout_s: float = Field(1800.0, gt=0)
    # "local" never downloads: higher tiers read models pre-placed in parser_model_dir (default ~/.mineru/models).
    parser_model_source: Literal["local", "auto", "huggingface", "modelscope"] = "local"
    parser_model_dir: Optional[Path] = None
    # Model calls: texts per request and requests in flight per document (Triton batches across them).
    embed_batch: int = Field(32, ge=1)
    max_concurrent_calls: int = Field(8, ge=1)


class GenerationSettings(_Section):
    max_tokens: int = Field(64, ge=0)
    max_tokens_limit: int = Field(1024, ge=1)
    temperature: float = Field(0.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)


class Settings(_Section):
    profile: str = "tiny"
    triton: TritonSettings = TritonSettings()
    server: ServerSettings = ServerSettings()
    storage: StorageSettings = StorageSettings()
    retrieval: RetrievalSettings = RetrievalSettings()
    index: IndexSettings = IndexSettings()
    ingest: IngestSettings = IngestSettings()
    generation: GenerationSettings = GenerationSettings()

    @model_validator(mode="after")
    def _repository_follows_profile(self) -> "Settings":
        if "model_repository" not in self.triton.model_fields_set:
            repository = Path("model_repository") / self.profile
            object.__setattr__(self, "triton", self.triton.model_copy(update={"model_repository": repository}))
        if self.ingest.chunk_overlap_tokens >= self.ingest.chunk_tokens:
            raise ValueError("ingest.chunk_overlap_tokens must be smaller than ingest.chunk_tokens")
        return self

    @property
    def tokenizer_file(self) -> Path:
        """The text embedder's tokenizer: chunks are counted in the tokens the embedder reads."""
        if self.ingest.tokenizer is not None:
            return self.ingest.tokenizer
        return self.triton.model_repository / "text_embedder_tokenize" / "1" / "tokenizer.json"

    @classmethod
    def load(cls, path: Optional[Path] = None, overrides: Optional[dict[str, Any]] = None) -> "Settings":
        """Settings from a TOML file (optional) with dotted-key overrides, e.g. {"server.port": 0}."""
        data: dict[str, Any] = {}
        if path is not None:
            try:
                data = tomllib.loads(Path(path).read_text())
            except (OSError, tomllib.TOMLDecodeError) as error:
                raise ConfigurationError(f"cannot read settings file {path}: {error}") from None
        for dotted, value in (overrides or {}).items():
            if value is None:
                continue
            section = data
            *parents, leaf = dotted.split(".")
            for parent in parents:
                section = section.setdefault(parent, {})
            section[leaf] = value
        try:
            return cls.model_validate(data)
        except ValidationError as error:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
            raise ConfigurationError(f"invalid settings: {problems}") from None
