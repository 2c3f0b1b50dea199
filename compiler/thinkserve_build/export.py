"""Exporters: a checkpoint (local folder or hub id) -> the files a target serves + facts.

One function per model kind. Each wraps the Hugging Face model in the module of thinkserve_backend.torch_modules
(flat, named inputs and outputs) and writes the formats the build's target serves: ONNX graphs (`onnx`: the cpu
and gpu targets) and the checkpoint the `torch` target loads back (`torch`). Each format is checked against
PyTorch before the build accepts it: ONNX through onnxruntime, the checkpoint loaded back exactly as the served
model loads it. The returned facts (dimensions, special token ids, file names) are what the repository writer
needs to write config.pbtxt.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
from thinkserve_backend import torch_modules
from thinkserve_backend.generator_runtime import GeneratorRuntime, onnx_generator, torch_generator
from thinkserve_backend.torch_modules import LlavaImageFeatures, NetworkKind, TokenEmbeddings
from torch import nn

from orchestrator.models.chat_template import ChatTemplate

from . import calibration, decoder_graph, onnx_tools
from .profiles import ClassifierSpec, EmbedderSpec, GeneratorSpec, PageEncoderSpec

Log = Callable[[str], None]
SAMPLE_TEXTS = ["What was the revenue in 2023?", "The table on page 4 lists revenue by region and by quarter."]

ONNX, ONNX16, TORCH = "onnx", "onnx16", "torch"  # fp32 graphs; fp16 graphs made from them; the checkpoint
LANGUAGE_MODEL = "language_model"  # a VLM's decoder as a causal-LM checkpoint of its own (TensorRT-LLM builds from it)
ALL_FORMATS = frozenset({ONNX, ONNX16, TORCH, LANGUAGE_MODEL})
LANGUAGE_MODEL_DIR = "language_model"
TORCH_DIR = "torch"  # the artifact's sub-folder holding the torch target's checkpoint
CPU, FP32 = torch.device("cpu"), torch.float32  # what the build checks the torch checkpoint with


def _check_formats(formats: frozenset[str]) -> None:
    if not formats or not formats <= ALL_FORMATS:
        raise ValueError(f"export formats must be a non-empty subset of {sorted(ALL_FORMATS)}, got {sorted(formats)}")
    if ONNX16 in formats and ONNX not in formats:
        raise ValueError("fp16 graphs (onnx16) are made from the fp32 ones: ask for onnx too")


def _save_tokenizer(tokenizer, out: Path) -> str:
    tokenizer.backend_tokenizer.save(str(out / "tokenizer.json"))
    return "tokenizer.json"


def _text_inputs(tokenizer) -> list[str]:
    names = ["input_ids", "attention_mask"]
    return names + (["token_type_ids"] if "token_type_ids" in tokenizer.model_input_names else [])


def _sample_batch(tokenizer, names: list[str], pairs: bool = False) -> dict[str, torch.Tensor]:
    texts = (SAMPLE_TEXTS, SAMPLE_TEXTS[::-1]) if pairs else (SAMPLE_TEXTS,)
    encoded = tokenizer(*texts, padding=True, return_tensors="pt")
    return {name: encoded[name] for name in names}


def _text_axes(names: list[str], outputs: list[str]) -> dict:
    return {**{n: {0: "batch", 1: "sequence"} for n in names}, **{o: {0: "batch"} for o in outputs}}


def _torch_checkpoint(model: nn.Module, out: Path) -> dict:
    """Save the checkpoint the torch target serves; its facts name the folder and files."""
    return {"torch_dir": TORCH_DIR, "torch_files": torch_modules.save_checkpoint(model, out / TORCH_DIR)}


def _check_torch(what: str, kind: NetworkKind, out: Path, reference: torch.Tensor, batch: dict) -> dict:
    """Load the saved checkpoint back as the served model loads it and check it computes the reference."""
    served = torch_modules.load_network(kind, out / TORCH_DIR, CPU, FP32)
    with torch.no_grad():
        actual = served(**batch)
    onnx_tools.check_close(what, reference, actual.numpy(), runtime="the torch target")
    return kind.to_facts()


def _torch_network(what: str, kind: NetworkKind, model: nn.Module, out: Path, reference: torch.Tensor, batch: dict) -> dict:
    """The torch target's checkpoint of a network, saved and checked."""
    facts = _torch_checkpoint(model, out)
    return {**facts, "torch_network": _check_torch(what, kind, out, reference, batch)}


def _onnx_network(
    what: str, wrapper: nn.Module, out: Path, file: str, batch: dict, output: str, reference: torch.Tensor,
    formats: frozenset[str] = frozenset({ONNX}),
) -> tuple[Path, Optional[Path]]:
    """The fp32 graph, and with onnx16 its fp16 twin (`<name>.fp16.onnx`), each checked against PyTorch."""
    path = onnx_tools.export(wrapper, tuple(batch.values()), out / file, list(batch), [output], _text_axes(list(batch), [output]))
    onnx_tools.check_close(what, reference, onnx_tools.run(path, batch, [output])[0])
    if ONNX16 not in formats:
        return path, None
    half = onnx_tools.to_fp16(path, path.with_suffix(".fp16.onnx"))
    actual = onnx_tools.run(half, batch, [output])[0]
    onnx_tools.check_close(what, reference, actual, atol=onnx_tools.fp16_tolerance(reference), runtime="fp16 ONNX")
    return path, half


def _onnx_facts(prefix: str, paths: tuple[Path, Optional[Path]]) -> dict:
    fp32, fp16 = paths
    return {f"{prefix}onnx_file": fp32.name, **({f"{prefix}onnx_fp16_file": fp16.name} if fp16 else {})}


# ---------------------------------------------------------------- text embedder


def export_embedder(location: str, spec: EmbedderSpec, out: Path, log: Log, formats: frozenset[str] = frozenset({ONNX})) -> dict:
    from transformers import AutoModel, AutoTokenizer

    _check_formats(formats)
    tokenizer = AutoTokenizer.from_pretrained(location)
    # eager attention: onnxruntime's optimizer only fuses attention exported this way (needed for int8).
    model = AutoModel.from_pretrained(location, attn_implementation="eager")
    kind = NetworkKind("mean_pooled")
    wrapper = kind.wrap(model).eval()
    names = _text_inputs(tokenizer)
    batch = _sample_batch(tokenizer, names)
    with torch.no_grad():
        reference = wrapper(**batch)
    facts = {}
    if ONNX in formats:
        fp32, fp16 = _onnx_network("embedder", wrapper, out, "encoder.onnx", batch, "embedding", reference, formats)
        facts.update(_onnx_facts("", (fp32, fp16)))
        if spec.precision == "int8":
            int8 = onnx_tools.quantize_int8(
                fp32, out / "encoder.int8.onnx", model.config.num_attention_heads, model.config.hidden_size
            )
            cosine = onnx_tools.min_cosine(reference.numpy(), onnx_tools.run(int8, batch, ["embedding"])[0])
            log(f"  int8 embedder: min cosine vs fp32 {cosine:.4f}")
            fp32.unlink()
            facts["onnx_file"] = int8.name
    if TORCH in formats:
        facts.update(_torch_network("embedder", kind, model, out, reference, batch))
    return {
        **facts,
        "tokenizer_file": _save_tokenizer(tokenizer, out),
        "inputs": names,
        "embedding_dim": int(reference.shape[-1]),
        "max_length": min(spec.max_length, model.config.max_position_embeddings),
        "pad_id": tokenizer.pad_token_id or 0,
        "precision": spec.precision,
    }


# ---------------------------------------------------------------- reranker and router


def export_classifier(
    location: str, spec: ClassifierSpec, out: Path, labels: tuple[str, ...], output: str, pairs: bool,
    formats: frozenset[str] = frozenset({ONNX}),
) -> dict:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    _check_formats(formats)
    tokenizer = AutoTokenizer.from_pretrained(location)
    label_args = {"num_labels": len(labels)}
    if len(labels) > 1:
        label_args.update(id2label=dict(enumerate(labels)), label2id={label: i for i, label in enumerate(labels)})
    model = AutoModelForSequenceClassification.from_pretrained(location, **label_args)
    kind = NetworkKind(output)
    wrapper = kind.wrap(model).eval()
    names = _text_inputs(tokenizer)
    batch = _sample_batch(tokenizer, names, pairs=pairs)
    with torch.no_grad():
        reference = wrapper(**batch)
    facts = {}
    if ONNX in formats:
        facts.update(_onnx_facts("", _onnx_network(output, wrapper, out, "classifier.onnx", batch, output, reference, formats)))
    if TORCH in formats:
        facts.update(_torch_network(output, kind, model, out, reference, batch))
    return {
        **facts,
        "tokenizer_file": _save_tokenizer(tokenizer, out),
        "inputs": names,
        "output": output,
        "output_dim": int(reference.shape[-1]),
        "max_length": min(spec.max_length, model.config.max_position_embeddings),
        "pad_id": tokenizer.pad_token_id or 0,
    }


# ---------------------------------------------------------------- page-image encoders (CLIP-like, SigLIP-like)


def image_preprocessing(location: str):
    """Resize/crop/normalisation of a checkpoint, read from its standard preprocessor_config.json."""
    from thinkserve_backend.images import ImagePreprocessing
    from transformers.utils import cached_file

    config = json.loads(Path(cached_file(location, "preprocessor_config.json")).read_text())
    crop = bool(config.get("do_center_crop", False))
    size = config.get("crop_size") if crop else config.get("size")
    if isinstance(size, int):
        height = width = size
    elif "shortest_edge" in size:
        height = width = size["shortest_edge"]
    else:
        height, width = size["height"], size["width"]
    return ImagePreprocessing(
        height=int(height),
        width=int(width),
        mean=tuple(config.get("image_mean", (0.5, 0.5, 0.5))),
        std=tuple(config.get("image_std", (0.5, 0.5, 0.5))),
        mode="crop" if crop else "resize",
    )


def export_page_encoder(location: str, spec: PageEncoderSpec, out: Path, formats: frozenset[str] = frozenset({ONNX})) -> dict:
    from transformers import AutoModel, AutoTokenizer

    _check_formats(formats)
    tokenizer = AutoTokenizer.from_pretrained(location)
    model = AutoModel.from_pretrained(location).eval()
    # SigLIP is trained on unmasked text padded to full length; CLIP masks its padding.
    names = ["input_ids"] if spec.pad_to_max_length else ["input_ids", "attention_mask"]
    max_length = min(spec.max_length, model.config.text_config.max_position_embeddings)
    padding = "max_length" if spec.pad_to_max_length else True
    encoded = tokenizer(SAMPLE_TEXTS, padding=padding, max_length=max_length, truncation=True, return_tensors="pt")
    text_batch = {name: encoded[name] for name in names}
    preprocessing = image_preprocessing(location)
    # the vision tower takes the preprocess step's uint8 pixels and normalises them itself (torch_modules.VisionTower)
    text_kind = NetworkKind("text_tower", use_mask=not spec.pad_to_max_length)
    vision_kind = NetworkKind("vision_tower", mean=preprocessing.mean, std=preprocessing.std)
    text, vision = text_kind.wrap(model).eval(), vision_kind.wrap(model).eval()
    pixels = {"pixels": torch.randint(0, 256, (2, 3, preprocessing.height, preprocessing.width), dtype=torch.uint8)}
    with torch.no_grad():
        text_reference, vision_reference = text(**text_batch), vision(**pixels)
    facts = {}
    if ONNX in formats:
        facts.update(_onnx_facts("text_", _onnx_network(
            f"{spec.family} text tower", text, out, "text.onnx", text_batch, "embedding", text_reference, formats
        )))
        facts.update(_onnx_facts("vision_", _onnx_network(
            f"{spec.family} vision tower", vision, out, "vision.onnx", pixels, "embedding", vision_reference, formats
        )))
    if TORCH in formats:
        facts.update(_torch_checkpoint(model, out))
        facts["torch_text_network"] = _check_torch(f"{spec.family} text tower", text_kind, out, text_reference, text_batch)
        facts["torch_vision_network"] = _check_torch(f"{spec.family} vision tower", vision_kind, out, vision_reference, pixels)
    return {
        **facts,
        "tokenizer_file": _save_tokenizer(tokenizer, out),
        "text_inputs": names,
        "embedding_dim": int(text_reference.shape[-1]),
        "max_length": max_length,
        "pad_to_max_length": spec.pad_to_max_length,
        "pad_id": tokenizer.pad_token_id or 0,
        "preprocessing": json.loads(preprocessing.to_json()),
    }


# ---------------------------------------------------------------- decoders (LLM, VLM)


def _eos_token_ids(tokenizer, model) -> list[int]:
    ids = set()
    configured = getattr(model.generation_config, "eos_token_id", None)
    ids.update(configured if isinstance(configured, list) else [configured])
    ids.add(tokenizer.eos_token_id)
    for token in ("<|im_end|>", "<|endoftext|>"):
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
            ids.add(token_id)
    return sorted(i for i in ids if isinstance(i, int))


def _chat_format(tokenizer, spec: GeneratorSpec, location: str) -> dict:
    """The generator's prompt format as the orchestrator reads it: its tokenizer's chat template (or the spec's)
    and the special tokens the template may read (orchestrator.models.chat_template)."""
    template = spec.chat_template or tokenizer.chat_template
    if not template:
        raise ValueError(f"{location}: the tokenizer has no chat template; give the profile's GeneratorSpec.chat_template")
    variables = {name: value for name, value in tokenizer.special_tokens_map.items() if isinstance(value, str)}
    return {"chat_template": template, "chat_template_variables": variables}


def _served_generators(
    model: nn.Module, formats: frozenset[str], out: Path, max_context: int, image_size: Optional[tuple[int, int]] = None
) -> tuple[list[GeneratorRuntime], dict]:
    """Write each format of a generator and load it back the way the served model does (generator_runtime):
    ONNX, the decoder graph and for a VLM the vision tower and token embeddings; torch, the saved checkpoint."""
    served, facts = [], {}
    vision = image_size is not None
    if ONNX in formats:
        backbone = model.model.language_model if vision else model.model
        text_config = model.config.text_config if vision else model.config
        facts["decoder_file"] = decoder_graph.export(backbone, model.lm_head, text_config, vision, out / "decoder.onnx").name
        sessions = [onnx_tools.session(out / facts["decoder_file"])]
        if vision:
            facts.update(_export_vision_parts(model, out, image_size))
            sessions += [onnx_tools.session(out / facts["vision_file"]), onnx_tools.session(out / facts["embed_file"])]
        served.append(onnx_generator(*sessions))
    if TORCH in formats:
        facts.update(_torch_checkpoint(model, out))
        served.append(torch_generator(out / TORCH_DIR, vision, max_context, CPU, FP32))
    return served, facts


def calibration_device(formats: frozenset[str]) -> torch.device:
    """Where the judger's calibration probes run: on a GPU when the build machine has one and the torch checkpoint is
    written (the same float32 loop, the same thresholds; on the H200 the 2 x 16 probes of the 1.5B LLM took most
    of its 158 s export on the CPU), else on the CPU with the checks."""
    return torch.device("cuda") if TORCH in formats and torch.cuda.is_available() else CPU


def _calibration_generator(checked: GeneratorRuntime, formats: frozenset[str], out: Path, max_context: int) -> GeneratorRuntime:
    """The generator the calibration probes run on: the checked form itself, or its torch checkpoint loaded in float32
    on the GPU (calibration_device); a GPU that cannot load it leaves the checked form."""
    device = calibration_device(formats)
    if device.type == "cpu":
        return checked
    try:
        return torch_generator(out / TORCH_DIR, False, max_context, device, FP32)
    except (RuntimeError, torch.cuda.OutOfMemoryError):
        return checked


def _export_vision_parts(model: nn.Module, out: Path, image_size: tuple[int, int]) -> dict:
    """A VLM's vision tower (with its projector) and token embeddings as ONNX graphs."""
    vision = LlavaImageFeatures(model).eval()
    vision_path = onnx_tools.export(
        vision, (torch.randn(1, 3, *image_size),), out / "vision.onnx", ["pixel_values"], ["image_features"],
        {"pixel_values": {0: "images"}, "image_features": {0: "images"}},
    )
    embed = TokenEmbeddings(model.get_input_embeddings()).eval()
    ids = torch.randint(0, model.config.text_config.vocab_size - 1, (1, 6))
    embed_path = onnx_tools.export(
        embed, (ids,), out / "embed.onnx", ["input_ids"], ["inputs_embeds"],
        {"input_ids": {0: "batch", 1: "sequence"}, "inputs_embeds": {0: "batch", 1: "sequence"}},
    )
    return {"vision_file": vision_path.name, "embed_file": embed_path.name}


def export_llm(location: str, spec: GeneratorSpec, out: Path, formats: frozenset[str] = frozenset({ONNX})) -> dict:
    from thinkserve_backend.decoding import GenerationParams, generate
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _check_formats(formats)
    tokenizer = AutoTokenizer.from_pretrained(location)
    model = AutoModelForCausalLM.from_pretrained(location).eval()
    max_context = min(spec.max_context, model.config.max_position_embeddings)
    served, facts = _served_generators(model, formats, out, max_context)

    # Each served form must generate what PyTorch generates, through the very loop Triton will run.
    prompt = tokenizer(SAMPLE_TEXTS[0], return_tensors="pt").input_ids
    expected = prompt
    with torch.no_grad():  # plain greedy loop: generate() would stop or mask at eos
        for _ in range(8):
            next_token = model(input_ids=expected).logits[0, -1].argmax().reshape(1, 1)
            expected = torch.cat([expected, next_token], dim=1)
    for form in served:
        steps = generate(
            form.decoder,
            prompt.numpy(),
            GenerationParams(max_tokens=8),
            decode=lambda ids: tokenizer.decode(list(ids)),
            eos_token_ids=[],
            max_context=max_context,
        )
        produced = [step.token_ids[0] for step in steps if step.token_ids]
        if produced != expected[0, prompt.shape[1] :].tolist():
            raise onnx_tools.ExportMismatchError(
                f"LLM: {form.runtime} greedy tokens {produced} != PyTorch {expected[0, prompt.shape[1]:].tolist()}"
            )
    eos_token_ids = _eos_token_ids(tokenizer, model)
    chat_format = _chat_format(tokenizer, spec, location)
    chat = ChatTemplate(chat_format["chat_template"], chat_format["chat_template_variables"])
    prober = _calibration_generator(served[0], formats, out, max_context)

    def probe(text: str) -> list[float]:
        """Each token's normalised entropy in a greedy probe answer, through the loop Triton runs."""
        steps = generate(
            prober.decoder,
            np.array([tokenizer(text, add_special_tokens=False).input_ids], dtype=np.int64),
            GenerationParams(max_tokens=calibration.PROBE_TOKENS),
            decode=lambda ids: tokenizer.decode(list(ids)),
            eos_token_ids=eos_token_ids,
            max_context=max_context,
        )
        return [entropy for step in steps for entropy in step.normalized_entropy]

    def sampled_probe(text: str) -> list[float]:
        """Each token's log-probability in a probe sampled at temperature 1 (the surprisal judger's probe)."""
        steps = generate(
            prober.decoder,
            np.array([tokenizer(text, add_special_tokens=False).input_ids], dtype=np.int64),
            GenerationParams(max_tokens=calibration.PROBE_TOKENS, temperature=1.0, top_p=1.0, seed=calibration.PROBE_SEED),
            decode=lambda ids: tokenizer.decode(list(ids)),
            eos_token_ids=eos_token_ids,
            max_context=max_context,
        )
        return [log_prob for step in steps for log_prob in step.log_probs]

    vocabulary = model.config.vocab_size
    return {
        **facts,
        "tokenizer_file": _save_tokenizer(tokenizer, out),
        "eos_token_ids": eos_token_ids,
        "max_context": max_context,
        "default_max_tokens": spec.default_max_tokens,
        "vocab_size": model.config.vocab_size,
        "judger_entropy_nats": calibration.judger_threshold(probe, chat, vocabulary, spec.judger_percentile),
        "judger_surprisal_nats": calibration.surprisal_threshold(sampled_probe, chat, vocabulary, spec.judger_percentile),
        **chat_format,
    }


def _language_model(vlm: nn.Module, out: Path, text_ids: torch.Tensor) -> dict:
    """The VLM's decoder saved as a causal LM of its own, checked to give the VLM's logits on a text-only prompt."""
    language_model = torch_modules.language_model_of(vlm)
    files = torch_modules.save_checkpoint(language_model, out / LANGUAGE_MODEL_DIR)
    with torch.no_grad():
        expected = vlm(input_ids=text_ids).logits[0, -1]
        saved = torch_modules.load_generator(out / LANGUAGE_MODEL_DIR, False, CPU, FP32)
        actual = saved.lm_head(saved.backbone(input_ids=text_ids).last_hidden_state)[0, -1]
    onnx_tools.check_close("VLM language model", expected, actual.numpy(), atol=1e-4, runtime="the extracted language model")
    architecture = json.loads((out / LANGUAGE_MODEL_DIR / "config.json").read_text())["model_type"]
    return {"language_model_dir": LANGUAGE_MODEL_DIR, "language_model_files": files, "language_model_type": architecture}


def export_vlm(location: str, spec: GeneratorSpec, out: Path, formats: frozenset[str] = frozenset({ONNX})) -> dict:
    from thinkserve_backend.decoding import splice_image_features
    from thinkserve_backend.relevance import RELEVANCE_QUESTION
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    _check_formats(formats)
    tokenizer = AutoTokenizer.from_pretrained(location)
    model = AutoModelForImageTextToText.from_pretrained(location).eval()
    config = model.config
    text_config = config.text_config
    image_token_id = getattr(config, "image_token_id", None) or config.image_token_index
    preprocessing = image_preprocessing(location)
    max_context = min(spec.max_context, text_config.max_position_embeddings)
    served, facts = _served_generators(model, formats, out, max_context, (preprocessing.height, preprocessing.width))

    pixels = torch.randn(1, 3, preprocessing.height, preprocessing.width)
    two = torch.randn(2, 3, preprocessing.height, preprocessing.width)
    vision = LlavaImageFeatures(model).eval()
    with torch.no_grad():
        # Several images in one vision call give each image's own features (the batch axis is free).
        reference = torch.stack(list(torch_modules.pooled(model.model.get_image_features(pixel_values=two))))
        features = vision(pixels)
        prompt = torch.tensor([[5, 6, image_token_id, 7, 8]])
        expanded = torch.tensor([[5, 6] + [image_token_id] * features.shape[1] + [7, 8]])
        expected = model(input_ids=expanded, pixel_values=pixels).logits[0, -1]
    for form in served:
        onnx_tools.check_close("VLM image features", reference, form.image_features(two.numpy()), runtime=form.runtime)
        # First-token logits of a prompt with one image: embed, splice the features, decode.
        embeddings = form.embed(prompt.numpy())
        spliced = splice_image_features(prompt.numpy()[0], embeddings[0], form.image_features(pixels.numpy()), image_token_id)[None]
        logits = np.asarray(form.decoder.sequence().step(spliced))  # a torch form's stay on its device otherwise
        onnx_tools.check_close("VLM first-token logits", expected, logits, atol=1e-3, runtime=form.runtime)
        # The relevance filter prefills many prompts of one length in one run: the batch axis must be exact too.
        for row in form.decoder.prefill_logits(np.repeat(spliced, 3, axis=0)):
            onnx_tools.check_close("VLM batched prefill logits", expected, row, atol=1e-3, runtime=form.runtime)
    if LANGUAGE_MODEL in formats:
        facts.update(_language_model(model, out, expanded[:, :8]))
    chat_format = _chat_format(tokenizer, spec, location)
    chat = ChatTemplate(chat_format["chat_template"], chat_format["chat_template_variables"])
    return {
        **facts,
        "tokenizer_file": _save_tokenizer(tokenizer, out),
        "image_token": tokenizer.convert_ids_to_tokens(image_token_id),
        "image_tokens_per_image": int(features.shape[1]),
        "vocab_size": text_config.vocab_size,
        "text_hidden_size": text_config.hidden_size,  # the width of its image features (and token embeddings)
        "eos_token_ids": _eos_token_ids(tokenizer, model),
        "max_context": max_context,
        "default_max_tokens": spec.default_max_tokens,
        "preprocessing": json.loads(preprocessing.to_json()),
        **chat_format,
        # the page filter's prompt in the VLM's format; {image} and {question} are filled in per page
        "relevance_prompt": chat("", "{image}\n" + RELEVANCE_QUESTION + "\nQuestion: {question}"),
    }
