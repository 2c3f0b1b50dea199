"""Exporters: a checkpoint (local folder or hub id) -> ONNX graphs + tokenizer/preprocessing files + facts.

One function per model kind. Each wraps the Hugging Face model in a small module with flat, named inputs and
outputs, exports it, and checks the ONNX graph against PyTorch before the build accepts it. The returned facts
(dimensions, special token ids, file names) are what the repository writer needs to write config.pbtxt.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from orchestrator.triton.chat_template import ChatTemplate

from . import calibration, decoder_graph, onnx_tools
from .profiles import ClassifierSpec, EmbedderSpec, GeneratorSpec, PageEncoderSpec

Log = Callable[[str], None]
SAMPLE_TEXTS = ["What was the revenue in 2023?", "The table on page 4 lists revenue by region and by quarter."]


def _save_tokenizer(tokenizer, out: Path) -> str:
    tokenizer.backend_tokenizer.save(str(out / "tokenizer.json"))
    return "tokenizer.json"


def _pooled(output) -> torch.Tensor:
    """transformers 5 returns model outputs from get_*_features; older versions return the tensor itself."""
    return output if isinstance(output, torch.Tensor) else output.pooler_output


def _text_inputs(tokenizer) -> list[str]:
    names = ["input_ids", "attention_mask"]
    return names + (["token_type_ids"] if "token_type_ids" in tokenizer.model_input_names else [])


def _sample_batch(tokenizer, names: list[str], pairs: bool = False) -> dict[str, torch.Tensor]:
    texts = (SAMPLE_TEXTS, SAMPLE_TEXTS[::-1]) if pairs else (SAMPLE_TEXTS,)
    encoded = tokenizer(*texts, padding=True, return_tensors="pt")
    return {name: encoded[name] for name in names}


def _text_axes(names: list[str], outputs: list[str]) -> dict:
    return {**{n: {0: "batch", 1: "sequence"} for n in names}, **{o: {0: "batch"} for o in outputs}}


# ---------------------------------------------------------------- text embedder


class MeanPooledEncoder(nn.Module):
    """Sentence embedding: mean of the token states under the attention mask, L2-normalised, in the graph."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, **extra).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return nn.functional.normalize(pooled, p=2, dim=-1)


def export_embedder(location: str, spec: EmbedderSpec, out: Path, log: Log) -> dict:
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(location)
    # eager attention: onnxruntime's optimizer only fuses attention exported this way (needed for int8).
    model = AutoModel.from_pretrained(location, attn_implementation="eager")
    wrapper = MeanPooledEncoder(model).eval()
    names = _text_inputs(tokenizer)
    batch = _sample_batch(tokenizer, names)
    fp32 = onnx_tools.export(
        wrapper, tuple(batch.values()), out / "encoder.onnx", names, ["embedding"], _text_axes(names, ["embedding"])
    )
    with torch.no_grad():
        reference = wrapper(**batch)
    onnx_tools.check_close("embedder", reference, onnx_tools.run(fp32, batch, ["embedding"])[0])
    onnx_file = fp32.name
    if spec.precision == "int8":
        int8 = onnx_tools.quantize_int8(
            fp32, out / "encoder.int8.onnx", model.config.num_attention_heads, model.config.hidden_size
        )
        cosine = onnx_tools.min_cosine(reference.numpy(), onnx_tools.run(int8, batch, ["embedding"])[0])
        log(f"  int8 embedder: min cosine vs fp32 {cosine:.4f}")
        fp32.unlink()
        onnx_file = int8.name
    return {
        "onnx_file": onnx_file,
        "tokenizer_file": _save_tokenizer(tokenizer, out),
        "inputs": names,
        "embedding_dim": int(reference.shape[-1]),
        "max_length": min(spec.max_length, model.config.max_position_embeddings),
        "pad_id": tokenizer.pad_token_id or 0,
        "precision": spec.precision,
    }


# ---------------------------------------------------------------- reranker and router


class ClassifierExport(nn.Module):
    """Sequence classifier whose output is a relevance score [1] (reranker) or label probabilities (router)."""

    def __init__(self, model: nn.Module, output: str):
        super().__init__()
        self.model, self.output = model, output

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask, **extra).logits
        return logits[:, :1] if self.output == "score" else torch.softmax(logits, dim=-1)


def export_classifier(
    location: str, spec: ClassifierSpec, out: Path, labels: tuple[str, ...], output: str, pairs: bool
) -> dict:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(location)
    label_args = {"num_labels": len(labels)}
    if len(labels) > 1:
        label_args.update(id2label=dict(enumerate(labels)), label2id={label: i for i, label in enumerate(labels)})
    model = AutoModelForSequenceClassification.from_pretrained(location, **label_args)
    wrapper = ClassifierExport(model, output).eval()
    names = _text_inputs(tokenizer)
    batch = _sample_batch(tokenizer, names, pairs=pairs)
    path = onnx_tools.export(
        wrapper, tuple(batch.values()), out / "classifier.onnx", names, [output], _text_axes(names, [output])
    )
    with torch.no_grad():
        reference = wrapper(**batch)
    onnx_tools.check_close(output, reference, onnx_tools.run(path, batch, [output])[0])
    return {
        "onnx_file": path.name,
        "tokenizer_file": _save_tokenizer(tokenizer, out),
        "inputs": names,
        "output": output,
        "output_dim": int(reference.shape[-1]),
        "max_length": min(spec.max_length, model.config.max_position_embeddings),
        "pad_id": tokenizer.pad_token_id or 0,
    }


# ---------------------------------------------------------------- page-image encoders (CLIP-like, SigLIP-like)


class TextTower(nn.Module):
    def __init__(self, model: nn.Module, use_mask: bool):
        super().__init__()
        self.model, self.use_mask = model, use_mask

    def forward(self, input_ids, attention_mask=None):
        extra = {"attention_mask": attention_mask} if self.use_mask else {}
        return nn.functional.normalize(_pooled(self.model.get_text_features(input_ids=input_ids, **extra)), dim=-1)


class VisionTower(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        return nn.functional.normalize(_pooled(self.model.get_image_features(pixel_values=pixel_values)), dim=-1)


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


def export_page_encoder(location: str, spec: PageEncoderSpec, out: Path) -> dict:
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(location)
    model = AutoModel.from_pretrained(location).eval()
    # SigLIP is trained on unmasked text padded to full length; CLIP masks its padding.
    names = ["input_ids"] if spec.pad_to_max_length else ["input_ids", "attention_mask"]
    max_length = min(spec.max_length, model.config.text_config.max_position_embeddings)
    padding = "max_length" if spec.pad_to_max_length else True
    encoded = tokenizer(SAMPLE_TEXTS, padding=padding, max_length=max_length, truncation=True, return_tensors="pt")
    text_batch = {name: encoded[name] for name in names}
    text = TextTower(model, use_mask=not spec.pad_to_max_length).eval()
    text_path = onnx_tools.export(
        text, tuple(text_batch.values()), out / "text.onnx", names, ["embedding"], _text_axes(names, ["embedding"])
    )
    with torch.no_grad():
        text_reference = text(**text_batch)
    onnx_tools.check_close(f"{spec.family} text tower", text_reference, onnx_tools.run(text_path, text_batch, ["embedding"])[0])

    preprocessing = image_preprocessing(location)
    pixels = torch.randn(2, 3, preprocessing.height, preprocessing.width)
    vision = VisionTower(model).eval()
    vision_path = onnx_tools.export(
        vision, (pixels,), out / "vision.onnx", ["pixel_values"], ["embedding"], {"pixel_values": {0: "batch"}, "embedding": {0: "batch"}}
    )
    with torch.no_grad():
        vision_reference = vision(pixels)
    onnx_tools.check_close(
        f"{spec.family} vision tower", vision_reference, onnx_tools.run(vision_path, {"pixel_values": pixels}, ["embedding"])[0]
    )
    return {
        "text_onnx_file": text_path.name,
        "vision_onnx_file": vision_path.name,
        "tokenizer_file": _save_tokenizer(tokenizer, out),
        "text_inputs": names,
        "embedding_dim": int(text_reference.shape[-1]),
        "max_length": max_length,
        "pad_to_max_length": spec.pad_to_max_length,
        "pad_id": tokenizer.pad_token_id or 0,
        "preprocessing": json.loads(preprocessing.to_json()),
    }


# ---------------------------------------------------------------- decoders (LLM, VLM)


def _cache_layer(cache, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    if hasattr(cache, "layers"):  # transformers >= 4.56
        return cache.layers[index].keys, cache.layers[index].values
    return cache.key_cache[index], cache.value_cache[index]


class KVCacheDecoderExport(nn.Module):
    """Decoder step with the KV cache as flat tensors: past_key_values.{i}.{key,value} -> present.{i}.{key,value}."""

    def __init__(self, backbone: nn.Module, lm_head: nn.Module, text_config, takes_embeddings: bool):
        super().__init__()
        self.backbone, self.lm_head, self.text_config = backbone, lm_head, text_config
        self.takes_embeddings = takes_embeddings
        self.num_layers = text_config.num_hidden_layers

    def forward(self, primary, attention_mask, position_ids, *past):
        from transformers import DynamicCache

        cache = DynamicCache(config=self.text_config)
        for layer in range(self.num_layers):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        inputs = {"inputs_embeds": primary} if self.takes_embeddings else {"input_ids": primary}
        output = self.backbone(
            **inputs, attention_mask=attention_mask, position_ids=position_ids, past_key_values=cache, use_cache=True
        )
        present = [t for layer in range(self.num_layers) for t in _cache_layer(output.past_key_values, layer)]
        return (self.lm_head(output.last_hidden_state), *present)


def _export_decoder(decoder: KVCacheDecoderExport, out: Path) -> Path:
    """The decoder's graph with a caller-allocated KV buffer written in place (decoder_graph), from the same
    backbone and head as the wrapper."""
    return decoder_graph.export(
        decoder.backbone, decoder.lm_head, decoder.text_config, decoder.takes_embeddings, out / "decoder.onnx"
    )


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
    and the special tokens the template may read (orchestrator.triton.chat_template)."""
    template = spec.chat_template or tokenizer.chat_template
    if not template:
        raise ValueError(f"{location}: the tokenizer has no chat template; give the profile's GeneratorSpec.chat_template")
    variables = {name: value for name, value in tokenizer.special_tokens_map.items() if isinstance(value, str)}
    return {"chat_template": template, "chat_template_variables": variables}


def export_llm(location: str, spec: GeneratorSpec, out: Path) -> dict:
    from thinkserve_backend.decoding import GenerationParams, KVCacheDecoder, generate
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(location)
    model = AutoModelForCausalLM.from_pretrained(location).eval()
    decoder = KVCacheDecoderExport(model.model, model.lm_head, model.config, takes_embeddings=False).eval()
    path = _export_decoder(decoder, out)

    # The graph must generate what PyTorch generates, through the very loop Triton will run.
    prompt = tokenizer(SAMPLE_TEXTS[0], return_tensors="pt").input_ids
    expected = prompt
    with torch.no_grad():  # plain greedy loop: generate() would stop or mask at eos
        for _ in range(8):
            next_token = model(input_ids=expected).logits[0, -1].argmax().reshape(1, 1)
            expected = torch.cat([expected, next_token], dim=1)
    steps = generate(
        KVCacheDecoder(onnx_tools.session(path)),
        prompt.numpy(),
        GenerationParams(max_tokens=8),
        decode=lambda ids: tokenizer.decode(list(ids)),
        eos_token_ids=[],
        max_context=model.config.max_position_embeddings,
    )
    produced = [step.token_ids[0] for step in steps if step.token_ids]
    if produced != expected[0, prompt.shape[1] :].tolist():
        raise onnx_tools.ExportMismatchError(
            f"LLM: ONNX greedy tokens {produced} != PyTorch {expected[0, prompt.shape[1]:].tolist()}"
        )
    max_context = min(spec.max_context, model.config.max_position_embeddings)
    served = KVCacheDecoder(onnx_tools.session(path))
    eos_token_ids = _eos_token_ids(tokenizer, model)
    chat_format = _chat_format(tokenizer, spec, location)
    chat = ChatTemplate(chat_format["chat_template"], chat_format["chat_template_variables"])

    def probe(text: str) -> list[float]:
        """Each token's normalised entropy in a greedy probe answer, through the loop Triton runs."""
        steps = generate(
            served,
            np.array([tokenizer(text, add_special_tokens=False).input_ids], dtype=np.int64),
            GenerationParams(max_tokens=calibration.PROBE_TOKENS),
            decode=lambda ids: tokenizer.decode(list(ids)),
            eos_token_ids=eos_token_ids,
            max_context=max_context,
        )
        return [entropy for step in steps for entropy in step.normalized_entropy]

    return {
        "decoder_file": path.name,
        "tokenizer_file": _save_tokenizer(tokenizer, out),
        "eos_token_ids": eos_token_ids,
        "max_context": max_context,
        "default_max_tokens": spec.default_max_tokens,
        "vocab_size": model.config.vocab_size,
        "judger_entropy_nats": calibration.judger_threshold(probe, chat, model.config.vocab_size, spec.judger_percentile),
        **chat_format,
    }


class LlavaVisionExport(nn.Module):
    """pixel_values [n, 3, h, w] -> projected image features [n, tokens per image, decoder width].

    LlavaModel.get_image_features computed as one tensor: the library splits its result into a list per
    image, which traces into a graph fixed to the sample's image count."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        llava, config = self.model.model, self.model.config
        hidden = llava.vision_tower(pixel_values, output_hidden_states=True, return_dict=True).hidden_states
        layers = config.vision_feature_layer
        pool = [hidden[layers]] if isinstance(layers, int) else [hidden[layer] for layer in layers]
        if config.vision_feature_select_strategy == "default":
            pool = [states[:, 1:] for states in pool]
        return llava.multi_modal_projector(torch.cat(pool, dim=-1))


class TokenEmbeddingExport(nn.Module):
    def __init__(self, embeddings: nn.Module):
        super().__init__()
        self.embeddings = embeddings

    def forward(self, input_ids):
        return self.embeddings(input_ids)


def export_vlm(location: str, spec: GeneratorSpec, out: Path) -> dict:
    from thinkserve_backend.decoding import KVCacheDecoder, splice_image_features
    from thinkserve_backend.relevance import RELEVANCE_QUESTION
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(location)
    model = AutoModelForImageTextToText.from_pretrained(location).eval()
    config = model.config
    text_config = config.text_config
    image_token_id = getattr(config, "image_token_id", None) or config.image_token_index
    preprocessing = image_preprocessing(location)

    vision = LlavaVisionExport(model).eval()
    pixels = torch.randn(1, 3, preprocessing.height, preprocessing.width)
    vision_path = onnx_tools.export(
        vision, (pixels,), out / "vision.onnx", ["pixel_values"], ["image_features"],
        {"pixel_values": {0: "images"}, "image_features": {0: "images"}},
    )
    embed = TokenEmbeddingExport(model.get_input_embeddings()).eval()
    ids = torch.randint(0, text_config.vocab_size - 1, (1, 6))
    embed_path = onnx_tools.export(
        embed, (ids,), out / "embed.onnx", ["input_ids"], ["inputs_embeds"],
        {"input_ids": {0: "batch", 1: "sequence"}, "inputs_embeds": {0: "batch", 1: "sequence"}},
    )
    decoder = KVCacheDecoderExport(model.model.language_model, model.lm_head, text_config, takes_embeddings=True)
    decoder_path = _export_decoder(decoder.eval(), out)

    # Several images in one vision call give each image's own features (the graph's batch axis is free).
    two = torch.randn(2, 3, preprocessing.height, preprocessing.width)
    with torch.no_grad():
        reference = torch.stack(list(_pooled(model.model.get_image_features(pixel_values=two))))
    onnx_tools.check_close("VLM image features", reference, onnx_tools.run(vision_path, {"pixel_values": two}, ["image_features"])[0])

    # First-token logits of a prompt with one image: ONNX (embed, splice features, decode) vs PyTorch.
    with torch.no_grad():
        features = vision(pixels)
        prompt = torch.tensor([[5, 6, image_token_id, 7, 8]])
        expanded = torch.tensor([[5, 6] + [image_token_id] * features.shape[1] + [7, 8]])
        expected = model(input_ids=expanded, pixel_values=pixels).logits[0, -1]
    onnx_features = onnx_tools.run(vision_path, {"pixel_values": pixels}, ["image_features"])[0]
    embeddings = onnx_tools.run(embed_path, {"input_ids": prompt}, ["inputs_embeds"])[0]
    spliced = splice_image_features(prompt.numpy()[0], embeddings[0], onnx_features, image_token_id)[None]
    decoder_session = KVCacheDecoder(onnx_tools.session(decoder_path))
    logits = decoder_session.sequence().step(spliced)
    onnx_tools.check_close("VLM first-token logits", expected, logits, atol=1e-3)
    # The relevance filter prefills many prompts of one length in one run: the batch axis must be exact too.
    batched = decoder_session.prefill_logits(np.repeat(spliced, 3, axis=0))
    for row in batched:
        onnx_tools.check_close("VLM batched prefill logits", expected, row, atol=1e-3)
    chat_format = _chat_format(tokenizer, spec, location)
    chat = ChatTemplate(chat_format["chat_template"], chat_format["chat_template_variables"])
    return {
        "decoder_file": decoder_path.name,
        "vision_file": vision_path.name,
        "embed_file": embed_path.name,
        "tokenizer_file": _save_tokenizer(tokenizer, out),
        "image_token": tokenizer.convert_ids_to_tokens(image_token_id),
        "image_tokens_per_image": int(features.shape[1]),
        "eos_token_ids": _eos_token_ids(tokenizer, model),
        "max_context": min(spec.max_context, text_config.max_position_embeddings),
        "default_max_tokens": spec.default_max_tokens,
        "preprocessing": json.loads(preprocessing.to_json()),
        **chat_format,
        # the page filter's prompt in the VLM's format; {image} and {question} are filled in per page
        "relevance_prompt": chat("", "{image}\n" + RELEVANCE_QUESTION + "\nQuestion: {question}"),
    }

