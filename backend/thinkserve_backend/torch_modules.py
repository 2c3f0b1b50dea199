"""What each served network computes, as PyTorch modules with flat, named inputs and one output.

One definition for every target: the model compiler exports these modules to ONNX (the `cpu` target) and
saves their checkpoints for the `torch` target, whose python-backend models load them back here
(`load_network`, `load_generator`), on a GPU in bf16 or on the CPU in fp32. A checkpoint is an ordinary
Hugging Face folder (config.json, model.safetensors), so a real hub model and a random-weight recipe load alike.

Needs torch and transformers (the `torch` extra of thinkserve-backend); the cpu target's models never import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from torch import nn

# The files save_pretrained writes that from_pretrained needs back (weights in one safetensors file).
CHECKPOINT_FILES = ("config.json", "model.safetensors")


def pooled(output) -> torch.Tensor:
    """transformers 5 returns model outputs from get_*_features; older versions return the tensor itself."""
    return output if isinstance(output, torch.Tensor) else output.pooler_output


class MeanPooledEncoder(nn.Module):
    """Sentence embedding: mean of the token states under the attention mask, L2-normalised."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, **extra).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return nn.functional.normalize(pooled, p=2, dim=-1)


class Classifier(nn.Module):
    """Sequence classifier whose output is a relevance score [1] (reranker) or label probabilities (router)."""

    def __init__(self, model: nn.Module, output: str):
        super().__init__()
        self.model, self.output = model, output

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask, **extra).logits
        return logits[:, :1] if self.output == "score" else torch.softmax(logits, dim=-1)


class TextTower(nn.Module):
    """A page-image family's text tower: a question into the family's image space, L2-normalised."""

    def __init__(self, model: nn.Module, use_mask: bool):
        super().__init__()
        self.model, self.use_mask = model, use_mask

    def forward(self, input_ids, attention_mask=None):
        extra = {"attention_mask": attention_mask} if self.use_mask else {}
        return nn.functional.normalize(pooled(self.model.get_text_features(input_ids=input_ids, **extra)), dim=-1)


class PixelNormalisation(nn.Module):
    """uint8 RGB [n, 3, h, w] -> the family's normalised float32 pixels, on the tower's own device, so a request
    carries a quarter of float32's bytes. (x / 255 - mean) / std in float32, the operations of images.normalise in
    its order: on the CPU the pixels are bit for bit the ones the preprocess step made when it sent floats."""

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]):
        super().__init__()
        # not persistent: the checkpoint stays the Hugging Face model's; the facts carry mean and std
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).reshape(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).reshape(1, 3, 1, 1), persistent=False)

    def forward(self, pixels):
        return (pixels.to(torch.float32) / 255.0 - self.mean) / self.std


class VisionTower(nn.Module):
    """A page-image family's vision tower: uint8 pixels (resized, not normalised) into the shared space, L2-normalised."""

    def __init__(self, model: nn.Module, normalisation: PixelNormalisation):
        super().__init__()
        self.model, self.normalisation = model, normalisation

    def forward(self, pixels):
        pixel_values = self.normalisation(pixels).to(self.model.dtype)
        return nn.functional.normalize(pooled(self.model.get_image_features(pixel_values=pixel_values)), dim=-1)


class LlavaImageFeatures(nn.Module):
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


class TokenEmbeddings(nn.Module):
    def __init__(self, embeddings: nn.Module):
        super().__init__()
        self.embeddings = embeddings

    def forward(self, input_ids):
        return self.embeddings(input_ids)


@dataclass(frozen=True)
class NetworkKind:
    """Which network a checkpoint serves: the transformers class that loads it and the wrapper around it."""

    name: str  # mean_pooled | score | probabilities | text_tower | vision_tower | llava_image_features
    use_mask: bool = True  # text towers: SigLIP's takes no attention mask (trained on text padded to full length)
    # vision towers: the family's normalisation, applied inside the tower to the uint8 pixels it is sent
    mean: Optional[tuple[float, ...]] = None
    std: Optional[tuple[float, ...]] = None

    def auto_class(self):
        import transformers

        if self.name in ("score", "probabilities"):
            return transformers.AutoModelForSequenceClassification
        if self.name == "llava_image_features":
            return transformers.AutoModelForImageTextToText
        return transformers.AutoModel

    def wrap(self, model: nn.Module) -> nn.Module:
        if self.name == "mean_pooled":
            return MeanPooledEncoder(model)
        if self.name in ("score", "probabilities"):
            return Classifier(model, self.name)
        if self.name == "text_tower":
            return TextTower(model, self.use_mask)
        if self.name == "vision_tower":
            if self.mean is None or self.std is None:
                raise ValueError("a vision tower needs its family's mean and std (a repository built before towers "
                                 "took uint8 pixels: rebuild it)")
            return VisionTower(model, PixelNormalisation(self.mean, self.std))
        if self.name == "llava_image_features":
            return LlavaImageFeatures(model)
        raise ValueError(f"unknown network kind {self.name!r}")

    def to_facts(self) -> dict:
        normalisation = {} if self.mean is None else {"mean": list(self.mean), "std": list(self.std or ())}
        return {"name": self.name, "use_mask": self.use_mask, **normalisation}

    @classmethod
    def from_facts(cls, facts: dict) -> "NetworkKind":
        mean, std = facts.get("mean"), facts.get("std")
        return cls(facts["name"], bool(facts.get("use_mask", True)), tuple(mean) if mean else None, tuple(std) if std else None)


def device_and_dtype(device: str = "auto", dtype: str = "auto") -> tuple[torch.device, torch.dtype]:
    """"auto": the GPU in bf16 when torch sees one, else the CPU in fp32 (bf16 matmuls are slow on most CPUs)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {device!r} asked for, but torch sees no CUDA GPU (torch {torch.__version__})")
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    return torch.device(device), getattr(torch, dtype)


def save_checkpoint(model: nn.Module, folder: Path) -> list[str]:
    """The checkpoint's config and weights (one safetensors file), as the torch target serves them."""
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder), safe_serialization=True, max_shard_size="1000GB")
    written = [name for name in CHECKPOINT_FILES if (folder / name).is_file()]
    if len(written) != len(CHECKPOINT_FILES):
        raise RuntimeError(f"save_pretrained wrote {sorted(p.name for p in folder.iterdir())}, not {list(CHECKPOINT_FILES)}")
    return written


def _quiet_loading() -> None:
    """transformers draws a progress bar per load: noise in Triton's log."""
    from transformers.utils import logging

    logging.disable_progress_bar()


def load_network(kind: NetworkKind, folder: Path, device: torch.device, dtype: torch.dtype) -> nn.Module:
    _quiet_loading()
    model = kind.auto_class().from_pretrained(str(folder), dtype=dtype)
    return kind.wrap(model).to(device).eval()


@dataclass
class GeneratorModules:
    """A causal LM's parts as generation uses them; a VLM adds its token embeddings and image features."""

    backbone: nn.Module  # the decoder stack (input_ids or inputs_embeds -> hidden states, with a KV cache)
    lm_head: nn.Module
    text_config: object
    embeddings: Optional[nn.Module] = None  # VLM: ids -> embeddings, to splice image features into a prompt
    image_features: Optional[nn.Module] = None  # VLM: LlavaImageFeatures


def generator_modules(model: nn.Module, vision: bool) -> GeneratorModules:
    if not vision:
        return GeneratorModules(model.model, model.lm_head, model.config)
    return GeneratorModules(
        model.model.language_model, model.lm_head, model.config.text_config,
        TokenEmbeddings(model.get_input_embeddings()), LlavaImageFeatures(model),
    )


def language_model_of(model: nn.Module) -> nn.Module:
    """A VLM's decoder as a causal LM of its own (its text config, its decoder layers and head): what an engine
    builder that knows only text models (TensorRT-LLM's from_hugging_face) is given."""
    import transformers

    text_config = model.config.text_config
    language_model = transformers.AutoModelForCausalLM.from_config(text_config).to(model.dtype).eval()
    language_model.model.load_state_dict(model.model.language_model.state_dict())
    language_model.lm_head.load_state_dict(model.lm_head.state_dict())
    return language_model


def load_generator(folder: Path, vision: bool, device: torch.device, dtype: torch.dtype) -> GeneratorModules:
    import transformers

    _quiet_loading()
    auto = transformers.AutoModelForImageTextToText if vision else transformers.AutoModelForCausalLM
    model = auto.from_pretrained(str(folder), dtype=dtype).to(device).eval()
    return generator_modules(model, vision)
