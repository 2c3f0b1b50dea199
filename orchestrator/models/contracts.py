"""Model names and tensor contracts: the one place that knows what the orchestrator may ask of Triton.

Which backend serves a model (python + onnxruntime on CPU, TensorRT or TensorRT-LLM on GPU) is the build
profile's business; the orchestrator relies on these names, tensors and data types only. The model compiler
(thinkserve_build) generates the public models of every repository from these same definitions.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tensor:
    """One input or output of a model, as seen by a client (batch dimension excluded; -1 = variable)."""

    name: str
    datatype: str  # Triton datatype: BYTES, FP32, INT32, INT64, UINT8, UINT64, BOOL
    dims: tuple[int, ...]
    optional: bool = False


@dataclass(frozen=True)
class ModelContract:
    """A model every deployment must serve under `name` with exactly these tensors."""

    name: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    decoupled: bool = False  # streams any number of responses per request (LLM, VLM)
    description: str = ""

    def input(self, name: str) -> Tensor:
        return _find(self.inputs, name, self.name)

    def output(self, name: str) -> Tensor:
        return _find(self.outputs, name, self.name)


def _find(tensors: tuple[Tensor, ...], name: str, model: str) -> Tensor:
    for tensor in tensors:
        if tensor.name == name:
            return tensor
    raise KeyError(f"model {model!r} has no tensor {name!r}")


# Labels of the router's output, in output order.
ROUTE_LABELS: tuple[str, ...] = ("simple", "moderate", "complex")

# Page-image encoder families served side by side; their similarities are averaged (V-RAG's ensemble of three:
# OpenAI's CLIP, SigLIP, and an OpenCLIP model trained on LAION, the same architecture as CLIP on other data).
PAGE_ENCODER_FAMILIES: tuple[str, ...] = ("clip", "siglip", "openclip")

TEXT_EMBEDDER = ModelContract(
    name="text_embedder",
    inputs=(Tensor("text", "BYTES", (1,)),),
    outputs=(Tensor("embedding", "FP32", (-1,)),),
    description="Ensemble: tokenizer -> encoder with mean pooling and L2 normalisation in the graph.",
)

RERANKER = ModelContract(
    name="reranker",
    inputs=(Tensor("query", "BYTES", (1,)), Tensor("passage", "BYTES", (1,))),
    outputs=(Tensor("score", "FP32", (1,)),),
    description="Ensemble: pair tokenizer -> cross-encoder; higher score = more relevant.",
)

ROUTER = ModelContract(
    name="router",
    inputs=(Tensor("text", "BYTES", (1,)),),
    outputs=(Tensor("probabilities", "FP32", (len(ROUTE_LABELS),)),),
    description="Ensemble: tokenizer -> 3-way query-complexity classifier (softmax in the graph).",
)

# Generation contract shared by the LLM and the VLM; it follows the TensorRT-LLM backend's names where they exist.
GENERATION_INPUTS: tuple[Tensor, ...] = (
    Tensor("text_input", "BYTES", (1,)),
    Tensor("max_tokens", "INT32", (1,), optional=True),
    Tensor("temperature", "FP32", (1,), optional=True),  # 0 = greedy
    Tensor("top_p", "FP32", (1,), optional=True),
    Tensor("stop", "BYTES", (-1,), optional=True),  # stop strings; generation ends before them
    Tensor("seed", "UINT64", (1,), optional=True),
    # Each token's entropy wanted (the judger's probes). A runtime for which they cost the vocabulary's logits per
    # token (a TensorRT-LLM engine) sends NaN unless asked; the others compute them where the logits are, always.
    Tensor("entropies", "BOOL", (1,), optional=True),
)

GENERATION_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("text_output", "BYTES", (1,)),  # text added by this response (a delta)
    Tensor("token_ids", "INT32", (-1,)),
    Tensor("log_probs", "FP32", (-1,)),  # log-probability of each token under the model (temperature 1)
    Tensor("normalized_entropy", "FP32", (-1,)),  # entropy of each step's distribution / log(vocab), in [0, 1]; NaN:
    # not measured (not asked for where costly: the `entropies` input)
    Tensor("finish_reason", "BYTES", (1,)),  # empty until the final response: stop | length | eos | cancelled
    Tensor("prompt_tokens", "INT32", (1,)),
    Tensor("completion_tokens", "INT32", (1,)),  # cumulative
)

# Every LLM/VLM deployment declares its context length (prompt + generated tokens) as a config.pbtxt parameter
# of this name, whatever its backend, so the orchestrator can keep prompts inside it.
CONTEXT_PARAMETER = "max_context"
# ... and a VLM the number of prompt positions one image takes, so prompts with images fit too.
IMAGE_TOKENS_PARAMETER = "image_tokens_per_image"
# ... and the size of its vocabulary (the logits of a step), which turns a normalized_entropy back into nats.
VOCABULARY_PARAMETER = "vocab_size"
# The LLM declares the judger's threshold in nats, calibrated by the build (thinkserve_build.calibration).
JUDGER_THRESHOLD_PARAMETER = "judger_entropy_nats"
# ... and the threshold of the judger's other measure, the mean surprisal of a probe sampled at temperature 1, which
# needs no entropies (orchestrator/pipeline/uncertainty.py).
JUDGER_SURPRISAL_PARAMETER = "judger_surprisal_nats"
# Every LLM/VLM declares its prompt format: its tokenizer's Jinja chat template, and (JSON) the special tokens the
# template reads, so prompts are built in the model's own format (orchestrator.models.chat_template).
CHAT_TEMPLATE_PARAMETER = "chat_template"
CHAT_TEMPLATE_VARIABLES_PARAMETER = "chat_template_variables"

LLM = ModelContract(
    name="llm",
    inputs=GENERATION_INPUTS,
    outputs=GENERATION_OUTPUTS,
    decoupled=True,
    description="Causal LM with a KV cache; streams text deltas with per-token log-probabilities.",
)

VLM = ModelContract(
    name="vlm",
    inputs=GENERATION_INPUTS + (Tensor("images", "BYTES", (-1,), optional=True),),
    outputs=GENERATION_OUTPUTS,
    decoupled=True,
    description="Vision encoder + decoder; images are encoded PNG/JPEG bytes referenced by <image> in the prompt.",
)

# V-RAG's LMM filter: the VLM's answer to "Can this image provide answers to this question? Respond only with yes
# or no", read off its next-token distribution in one prefill (no decoding), so pages batch like an encoder.
VLM_RELEVANCE = ModelContract(
    name="vlm_relevance",
    inputs=(Tensor("question", "BYTES", (1,)), Tensor("image", "BYTES", (1,))),
    outputs=(Tensor("relevance", "FP32", (1,)),),
    description="P(yes) / (P(yes) + P(no)) of the VLM's next token after the yes/no relevance prompt.",
)


# Text of page images (scans, slides exported as pictures) and of the figures a parser crops: PP-OCR's detector,
# line classifier and recogniser behind one model (thinkserve_backend.models.ocr_pipeline).
OCR = ModelContract(
    name="ocr",
    inputs=(Tensor("image", "BYTES", (1,)),),
    outputs=(
        Tensor("text", "BYTES", (-1,)),  # one recognised line per row, in reading order
        Tensor("boxes", "FP32", (-1, 4, 2)),  # each line's corners (top-left, top-right, bottom-right, bottom-left)
        # as (x, y) fractions of the image's width and height
        Tensor("confidence", "FP32", (-1,)),  # mean probability of the line's characters
    ),
    description="Encoded PNG/JPEG in; its text lines out: detect, turn upside-down lines, recognise (CTC).",
)


# The models a hosted API would bill by the token (prompt and completion of the LLM and the VLM, the VLM's
# relevance prefill included); encoders' tokens are compute, not a bill, and cost papers leave them out.
GENERATIVE_MODELS: tuple[str, ...] = (LLM.name, VLM.name, VLM_RELEVANCE.name)


def page_text_encoder(family: str) -> ModelContract:
    """Text tower of a page-image encoder family (questions are embedded into that family's image space)."""
    return ModelContract(
        name=f"page_text_{family}",
        inputs=(Tensor("text", "BYTES", (1,)),),
        outputs=(Tensor("embedding", "FP32", (-1,)),),
        description=f"Ensemble: {family} tokenizer -> text tower, L2-normalised.",
    )


def page_image_encoder(family: str) -> ModelContract:
    """Vision tower of a page-image encoder family; takes an encoded page image."""
    return ModelContract(
        name=f"page_image_{family}",
        inputs=(Tensor("image", "BYTES", (1,)),),
        outputs=(Tensor("embedding", "FP32", (-1,)),),
        description=f"Ensemble: {family} image preprocessing -> vision tower, L2-normalised.",
    )


def all_contracts(families: tuple[str, ...] = PAGE_ENCODER_FAMILIES) -> tuple[ModelContract, ...]:
    """Every model a complete deployment serves."""
    page = tuple(c for family in families for c in (page_text_encoder(family), page_image_encoder(family)))
    return (TEXT_EMBEDDER, RERANKER, ROUTER, *page, LLM, VLM, VLM_RELEVANCE, OCR)
