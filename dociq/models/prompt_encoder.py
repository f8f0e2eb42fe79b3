"""Prompt encoder: questions (open_clip text tower), points, boxes and a dense mask prompt.

Points, boxes and masks follow SAM (Kirillov et al. 2023): a point or box corner is its
random-Fourier positional encoding plus a learned embedding of its kind (negative point,
positive point, top-left corner, bottom-right corner); label -1 is a not-a-point pad; a mask
prompt (previous-round logits at 4x the embedding resolution) is downscaled by two strided
convs to the image-embedding grid, and without one a learned no-mask embedding fills that grid.

Questions are encoded by an open_clip text tower and projected to the decoder width. Every
question contributes 1 + L sparse tokens, L = the tower's context length:
- 1 pooled token: CLIP's EOT feature (its joint-embedding summary of the whole question);
- L word tokens: the tower's per-position features. A reading question ("the value next to
  'Invoice No.'") is answered by matching particular words against the OCR-conditioned image
  tokens; squeezing the question through one pooled vector loses those words, while the two-way
  transformer can attend to each word token directly. Pad positions get a learned
  no-question embedding instead of being dropped, so every prompt has the same token count
  and the decoder needs no attention mask (SAM's not-a-point trick). `question_word_tokens=False`
  keeps only the pooled token.
A prompt whose `question_ids` row is all padding (id 0, how the collator fills pages with fewer
questions; an empty string still tokenizes to SOT, EOT) gets the no-question embedding
in all its 1 + L slots, so question and non-question prompts can share a batch.

All inputs are per prompt, flattened image-major: N = B*Q rows, as SAM's per-prompt batch.
Sparse tokens are ordered [points (+1 pad when there are no boxes, as SAM), box corners,
question tokens]; any combination of the four prompt kinds may be given in one call.
"""
from __future__ import annotations

import math
import os
from typing import Any, Mapping, Sequence

import open_clip
import torch
from open_clip.factory import load_state_dict as load_open_clip_state_dict
from open_clip.model import CLIPTextCfg, _build_text_tower
from torch import Tensor, nn

from dociq.io.checkpoint import load_state_dict_like, strip_prefix
from dociq.models.common import LayerNorm2d, exporting
from dociq.models.sizes import QUESTION_TOWERS

# Named question towers (open_clip-style configs open_clip does not ship) live in dociq.models.sizes;
# any open_clip model name (e.g. "ViT-B-16") works as well.
QUESTION_TOWER_CONFIGS = QUESTION_TOWERS

# Point labels: SAM's -1/0/1 plus SAM 2's box corners given as points (2 top-left, 3 bottom-right),
# which lets prompts with and without a box share one batch.
NOT_A_POINT, NEGATIVE_POINT, POSITIVE_POINT, BOX_TOP_LEFT, BOX_BOTTOM_RIGHT = -1, 0, 1, 2, 3


def _resolve_question_model(model_name_or_cfg: str | Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """-> (open_clip model config dict, open_clip model name or None)."""
    if isinstance(model_name_or_cfg, Mapping):
        cfg, name = dict(model_name_or_cfg), None
    elif model_name_or_cfg in QUESTION_TOWER_CONFIGS:
        cfg, name = QUESTION_TOWER_CONFIGS[model_name_or_cfg], None
    else:
        cfg, name = open_clip.get_model_config(model_name_or_cfg), model_name_or_cfg
        if cfg is None:
            raise KeyError(
                f"QuestionEncoder: unknown model {model_name_or_cfg!r}; use one of {sorted(QUESTION_TOWER_CONFIGS)}, "
                "an open_clip model name (open_clip.list_models()), or a config dict "
                "{'embed_dim': E, 'text_cfg': {...CLIPTextCfg fields}}"
            )
    if "embed_dim" not in cfg or "text_cfg" not in cfg:
        raise KeyError(f"QuestionEncoder: config needs keys 'embed_dim' and 'text_cfg', got {sorted(cfg)}")
    if cfg["text_cfg"].get("hf_model_name"):
        raise ValueError(
            f"QuestionEncoder: {model_name_or_cfg!r} uses a Hugging Face text tower, which needs the hub; "
            "choose an open_clip model with its own text transformer (e.g. 'ViT-B-16')"
        )
    return cfg, name


class QuestionEncoder(nn.Module):
    """open_clip text tower -> sparse prompt tokens of width `output_dim`.

    model_name_or_cfg: a name in QUESTION_TOWER_CONFIGS ("tiny"), an open_clip model name
        ("ViT-B-16"), or an open_clip model-config dict {"embed_dim", "text_cfg", "quick_gelu"}.
        Built offline with random weights (no hub access).
    checkpoint_path: a local open_clip checkpoint (full CLIP or CustomTextCLIP state dict, with or
        without the training wrapper; .pt/.bin/.safetensors) whose text tower weights are loaded.
        OpenAI-trained weights need the matching "-quickgelu" model name (e.g. "ViT-B-16-quickgelu"):
        the activation has no weights, so a mismatch would load silently but compute wrong features.
    word_tokens: also emit the per-position features (see the module doc), not only the pooled one.
    """

    def __init__(
        self,
        model_name_or_cfg: str | Mapping[str, Any] = "tiny",
        output_dim: int = 256,
        checkpoint_path: str | os.PathLike | None = None,
        word_tokens: bool = True,
    ) -> None:
        super().__init__()
        cfg, self.open_clip_name = _resolve_question_model(model_name_or_cfg)
        text_cfg = CLIPTextCfg(**{**cfg["text_cfg"], "output_tokens": True})
        # Private, but open_clip's only public routes to this module (create_model, CustomTextCLIP)
        # also build a vision tower; copying its CLIPTextCfg -> TextTransformer mapping would drift.
        self.text = _build_text_tower(cfg["embed_dim"], text_cfg, quick_gelu=cfg.get("quick_gelu", False))
        self.context_length = text_cfg.context_length
        self.pad_id = text_cfg.pad_id
        self.causal = not text_cfg.no_causal_mask
        self.word_tokens = word_tokens
        self.pooled_proj = nn.Linear(cfg["embed_dim"], output_dim)
        self.word_proj = nn.Linear(text_cfg.width, output_dim) if word_tokens else None
        self.no_question_embed = nn.Embedding(1, output_dim)
        if checkpoint_path is not None:
            self.load_open_clip_checkpoint(checkpoint_path)

    @property
    def num_tokens(self) -> int:
        """Sparse tokens per question: 1 pooled (+ context_length word tokens)."""
        return 1 + (self.context_length if self.word_tokens else 0)

    def tokenize(self, texts: str | Sequence[str]) -> Tensor:
        """Questions -> long [n, context_length] CLIP BPE ids (offline; open_clip ships the vocabulary)."""
        if self.open_clip_name is None:
            return open_clip.tokenize(texts, context_length=self.context_length)
        if getattr(self, "_tokenizer", None) is None:  # built once: it reads the BPE vocabulary
            self._tokenizer = open_clip.get_tokenizer(self.open_clip_name, context_length=self.context_length)
        return self._tokenizer(texts)

    def encode_text(self, question_ids: Tensor) -> tuple[Tensor, Tensor]:
        """Raw tower outputs: pooled (projected EOT) [n, embed_dim], per-position [n, context_length, width]."""
        ids = self._check_ids(question_ids)
        return self.text(ids)

    def no_question_tokens(self, n: int) -> Tensor:
        """What `forward` gives an all-padding row, for `n` prompts without any question:
        [n, num_tokens, output_dim] copies of the learned no-question embedding."""
        return self.no_question_embed.weight.expand(n, self.num_tokens, -1)

    def forward(self, question_ids: Tensor) -> Tensor:
        """question_ids long [N, L<=context_length] -> tokens [N, num_tokens, output_dim]."""
        ids = self._check_ids(question_ids)
        pooled, words = self.text(ids)
        no_question = self.no_question_embed.weight  # [1, C]
        has_question = (ids != self.pad_id).any(dim=1)  # [N]
        tokens = self.pooled_proj(pooled).unsqueeze(1)
        if self.word_proj is not None:
            real_word = (ids != self.pad_id).unsqueeze(-1)
            words = torch.where(real_word, self.word_proj(words), no_question)
            tokens = torch.cat([tokens, words], dim=1)
        return torch.where(has_question[:, None, None], tokens, no_question)

    def _check_ids(self, question_ids: Tensor) -> Tensor:
        if question_ids.dim() != 2 or question_ids.dtype not in (torch.long, torch.int32, torch.int64):
            raise ValueError(
                f"QuestionEncoder: question_ids must be integer [N, L], got {question_ids.dtype} "
                f"{list(question_ids.shape)}; flatten prompt_ids [B, Q, L] to [B*Q, L]"
            )
        n, length = question_ids.shape
        if length > self.context_length:
            raise ValueError(
                f"QuestionEncoder: question_ids have length {length} > context_length {self.context_length}; "
                f"tokenize with QuestionEncoder.tokenize or open_clip.tokenize(..., context_length={self.context_length})"
            )
        if length < self.context_length:  # the tower's causal mask is sized for the full context
            question_ids = torch.nn.functional.pad(question_ids, (0, self.context_length - length), value=self.pad_id)
        return question_ids.long()

    def load_open_clip_checkpoint(self, checkpoint_path: str | os.PathLike) -> None:
        """Load the text-tower weights of a local open_clip checkpoint (strict, with readable errors)."""
        path = os.fspath(checkpoint_path)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"QuestionEncoder: open_clip checkpoint {path!r} does not exist; pass a local .pt/.bin/.safetensors "
                "file saved from an open_clip model, or checkpoint_path=None for random weights"
            )
        state = load_open_clip_state_dict(path, weights_only=True)
        if any(k.startswith("text.") for k in state):  # CustomTextCLIP keeps the tower under `text.`
            state = strip_prefix(state, ("text.",))
        else:  # CLIP keeps the text tower at the top level, next to `visual.*`
            state = {k: v for k, v in state.items()
                     if not k.startswith("visual.") and k not in ("logit_scale", "logit_bias", "attn_mask")}
        pos = state.get("positional_embedding")
        if pos is not None and pos.shape[0] > self.context_length:
            if not self.causal:
                raise ValueError(
                    f"QuestionEncoder: checkpoint {path!r} has context length {pos.shape[0]} but the tower "
                    f"has {self.context_length}; with a bidirectional tower set text_cfg.context_length={pos.shape[0]}"
                )
            # Under the causal mask position i never sees positions > i, so keeping the first
            # context_length rows reproduces the checkpoint exactly on questions that fit.
            state["positional_embedding"] = pos[: self.context_length]
        own = self.text.state_dict()
        bad = [f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}"
               for k, v in state.items() if k in own and own[k].shape != v.shape]
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own))
        if bad or missing or unexpected:
            raise ValueError(
                f"QuestionEncoder: checkpoint {path!r} does not match the text tower "
                f"(shape mismatches {bad}, missing {missing[:8]}, unexpected {unexpected[:8]}); "
                "build the QuestionEncoder with the model name/config the checkpoint was trained with"
            )
        self.text.load_state_dict(state, strict=True)


class RandomFourierPositionEncoding(nn.Module):
    """Positional encoding by random spatial frequencies (Tancik et al. 2020; SAM's PositionEmbeddingRandom).

    A fixed Gaussian matrix [2, C/2] maps (x, y) in [0, 1]^2 to C/2 frequencies; the encoding is
    their sin and cos. It is a persistent buffer so checkpoints reproduce the same encoding.
    """

    def __init__(self, num_pos_feats: int = 64, scale: float | None = None) -> None:
        super().__init__()
        scale = scale if scale is not None and scale > 0 else 1.0
        self.register_buffer("gaussian_matrix", scale * torch.randn(2, num_pos_feats))

    def _encode(self, coords01: Tensor) -> Tensor:
        proj = 2 * math.pi * ((2 * coords01 - 1) @ self.gaussian_matrix)
        return torch.cat([torch.sin(proj), torch.cos(proj)], dim=-1)

    def forward(self, size: tuple[int, int]) -> Tensor:
        """Encoding of the centres of an h x w grid -> [C, h, w]."""
        h, w = size
        device = self.gaussian_matrix.device
        ys = (torch.arange(h, device=device, dtype=torch.float32) + 0.5) / h
        xs = (torch.arange(w, device=device, dtype=torch.float32) + 0.5) / w
        grid = torch.stack(torch.meshgrid(xs, ys, indexing="xy"), dim=-1)  # [h, w, (x, y)]
        return self._encode(grid).permute(2, 0, 1)

    def encode_coords(self, coords: Tensor, image_size: tuple[int, int]) -> Tensor:
        """Pixel coordinates [..., 2] as (x, y) in an image of size (H, W) -> [..., C]."""
        scale = coords.new_tensor([image_size[1], image_size[0]], dtype=torch.float32)
        return self._encode(coords.float() / scale)


class PromptEncoder(nn.Module):
    """Encodes questions, points, boxes and mask prompts into sparse tokens and a dense map."""

    def __init__(
        self,
        embed_dim: int = 256,
        image_embedding_size: tuple[int, int] = (64, 64),
        input_image_size: tuple[int, int] = (1024, 1024),
        mask_in_chans: int = 16,
        question_model: str | Mapping[str, Any] | None = None,
        question_checkpoint: str | os.PathLike | None = None,
        question_word_tokens: bool = True,
        activation: type[nn.Module] = nn.GELU,
    ) -> None:
        """
        embed_dim: width of every prompt token (= the mask decoder's transformer_dim).
        image_embedding_size: (h, w) of the image embedding the decoder sees.
        input_image_size: (H, W) of the image in pixels; point and box coordinates are in it.
        mask_in_chans: hidden channels of the mask-prompt downscaling convs (SAM: 16).
        question_model: QuestionEncoder model name / config, or None for no question input.
        question_checkpoint: local open_clip checkpoint for the question tower.
        question_word_tokens: emit per-word question tokens besides the pooled one.
        """
        super().__init__()
        if embed_dim % 2 != 0:
            raise ValueError(f"PromptEncoder embed_dim must be even (sin/cos halves), got {embed_dim}")
        self.embed_dim = embed_dim
        self.image_embedding_size = tuple(image_embedding_size)
        self.input_image_size = tuple(input_image_size)
        self.mask_input_size = (4 * self.image_embedding_size[0], 4 * self.image_embedding_size[1])
        self.pe_layer = RandomFourierPositionEncoding(embed_dim // 2)
        # Learned embedding per point kind, indexed by label: neg, pos, box top-left, box bottom-right.
        self.point_kind_embed = nn.Embedding(4, embed_dim)
        self.not_a_point_embed = nn.Embedding(1, embed_dim)
        self.mask_downscaling = nn.Sequential(
            nn.Conv2d(1, mask_in_chans // 4, kernel_size=2, stride=2),
            LayerNorm2d(mask_in_chans // 4),
            activation(),
            nn.Conv2d(mask_in_chans // 4, mask_in_chans, kernel_size=2, stride=2),
            LayerNorm2d(mask_in_chans),
            activation(),
            nn.Conv2d(mask_in_chans, embed_dim, kernel_size=1),
        )
        self.no_mask_embed = nn.Embedding(1, embed_dim)
        self.question_encoder = (
            QuestionEncoder(question_model, embed_dim, question_checkpoint, question_word_tokens)
            if question_model is not None else None
        )

    def get_dense_pe(self) -> Tensor:
        """Positional encoding of the image-embedding grid, [1, embed_dim, h, w] (the decoder's image_pe)."""
        return self.pe_layer(self.image_embedding_size).unsqueeze(0)

    def forward(
        self,
        points: tuple[Tensor, Tensor] | None = None,
        boxes: Tensor | None = None,
        masks: Tensor | None = None,
        question_ids: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """
        points: (coords float [N, P, 2] pixels (x, y), labels long [N, P] in -1/0/1 (2/3 = box corners)).
        boxes: float [N, 4] pixels x0, y0, x1, y1.
        masks: float [N, 1, 4h, 4w] mask-prompt logits (e.g. the previous round's low-res output).
        question_ids: long [N, L] open_clip token ids (all-pad rows = no question).

        Returns sparse [N, S, embed_dim] and dense [N, embed_dim, h, w] embeddings.
        """
        n = self._batch_size(points, boxes, masks, question_ids)
        device = self.no_mask_embed.weight.device
        sparse = [torch.empty(n, 0, self.embed_dim, device=device)]
        if points is not None:
            sparse.append(self._embed_points(*points, pad=boxes is None))
        if boxes is not None:
            sparse.append(self._embed_boxes(boxes))
        if question_ids is not None:
            if self.question_encoder is None:
                raise ValueError(
                    "PromptEncoder got question_ids but was built without a question tower; "
                    "set question_model (e.g. 'tiny' or an open_clip model name)"
                )
            sparse.append(self.question_encoder(question_ids.to(device)))
        sparse_embeddings = torch.cat(sparse, dim=1)

        if masks is not None:
            if masks.dim() != 4 or masks.shape[1] != 1 or tuple(masks.shape[-2:]) != self.mask_input_size:
                raise ValueError(
                    f"PromptEncoder: masks must be [N, 1, {self.mask_input_size[0]}, {self.mask_input_size[1]}] "
                    f"(4x the image embedding), got {list(masks.shape)}; resize the mask prompt with F.interpolate"
                )
            dense_embeddings = self.mask_downscaling(masks)
        else:
            h, w = self.image_embedding_size
            dense_embeddings = self.no_mask_embed.weight.reshape(1, -1, 1, 1).expand(n, -1, h, w)
        return sparse_embeddings, dense_embeddings

    def _embed_points(self, coords: Tensor, labels: Tensor, pad: bool) -> Tensor:
        if coords.dim() != 3 or coords.shape[-1] != 2 or labels.shape != coords.shape[:2]:
            raise ValueError(
                f"PromptEncoder: points must be coords [N, P, 2] and labels [N, P], got {list(coords.shape)} "
                f"and {list(labels.shape)}; flatten points [B, Q, P, 2] to [B*Q, P, 2]"
            )
        if not exporting() and ((labels < NOT_A_POINT) | (labels > BOX_BOTTOM_RIGHT)).any():
            raise ValueError(
                "PromptEncoder: point labels must be -1 (pad), 0 (negative), 1 (positive), "
                f"2/3 (box corners), got values {sorted(labels.unique().tolist())}"
            )
        coords = coords + 0.5  # pixel index -> pixel centre
        if pad:  # SAM appends one not-a-point when there is no box
            coords = torch.cat([coords, coords.new_zeros(coords.shape[0], 1, 2)], dim=1)
            labels = torch.cat([labels, labels.new_full((labels.shape[0], 1), NOT_A_POINT)], dim=1)
        pe = self.pe_layer.encode_coords(coords, self.input_image_size)
        is_point = (labels != NOT_A_POINT).unsqueeze(-1)
        kind = self.point_kind_embed(labels.clamp(min=0).long())
        return torch.where(is_point, pe + kind, self.not_a_point_embed.weight)

    def _embed_boxes(self, boxes: Tensor) -> Tensor:
        if boxes.dim() != 2 or boxes.shape[-1] != 4:
            raise ValueError(
                f"PromptEncoder: boxes must be [N, 4] (x0, y0, x1, y1 pixels), got {list(boxes.shape)}; "
                "flatten boxes [B, Q, 4] to [B*Q, 4]"
            )
        corners = (boxes + 0.5).reshape(-1, 2, 2)
        pe = self.pe_layer.encode_coords(corners, self.input_image_size)
        return pe + self.point_kind_embed.weight[BOX_TOP_LEFT:BOX_BOTTOM_RIGHT + 1]

    @staticmethod
    def _batch_size(points, boxes, masks, question_ids) -> int:
        sizes = {name: t.shape[0] for name, t in (
            ("points", points[0] if points is not None else None), ("boxes", boxes),
            ("masks", masks), ("question_ids", question_ids)) if t is not None}
        values = list(sizes.values())
        if any(v != values[0] for v in values[1:]):   # not a set: traced sizes do not hash
            raise ValueError(f"PromptEncoder: prompt inputs disagree on the number of prompts N: {sizes}")
        return next(iter(sizes.values()), 1)


# --- loading segment-anything prompt-encoder weights -------------------------------------------

def sam_prompt_encoder_state_dict_to_dociq(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Rename a segment-anything PromptEncoder state dict (or a full SAM checkpoint) to this module's keys.

    SAM stores four separate 1-row embeddings `point_embeddings.{0..3}` (neg, pos, top-left,
    bottom-right); here they are the rows of one `point_kind_embed` table.
    """
    state = strip_prefix(load_state_dict_like(state_dict, "sam_prompt_encoder_state_dict_to_dociq"),
                          ("prompt_encoder.", "sam_prompt_encoder."))
    out, kinds = {}, {}
    for key, value in state.items():
        if key.startswith("point_embeddings."):
            kinds[int(key.split(".")[1])] = value
        elif key == "pe_layer.positional_encoding_gaussian_matrix":
            out["pe_layer.gaussian_matrix"] = value
        else:
            out[key] = value
    if kinds:
        if sorted(kinds) != [0, 1, 2, 3]:
            raise KeyError(f"SAM prompt encoder state dict has point_embeddings {sorted(kinds)}, expected 0..3")
        out["point_kind_embed.weight"] = torch.cat([kinds[i] for i in range(4)], dim=0)
    return out


def load_sam_prompt_encoder_state_dict(
    encoder: PromptEncoder, state_dict_or_path: Mapping[str, Tensor] | str | os.PathLike
) -> None:
    """Load SAM's point/box/mask prompt weights (state dict or checkpoint path) into `encoder`.

    Strict on the SAM parts; the question tower is left as it is (SAM has none).
    """
    mapped = sam_prompt_encoder_state_dict_to_dociq(
        load_state_dict_like(state_dict_or_path, "load_sam_prompt_encoder_state_dict"))
    own = {k: v for k, v in encoder.state_dict().items() if not k.startswith("question_encoder.")}
    bad = [f"{k}: checkpoint {tuple(v.shape)} vs encoder {tuple(own[k].shape)}"
           for k, v in mapped.items() if k in own and own[k].shape != v.shape]
    missing, unexpected = sorted(set(own) - set(mapped)), sorted(set(mapped) - set(own))
    if bad or missing or unexpected:
        raise ValueError(
            f"load_sam_prompt_encoder_state_dict: shape mismatches {bad}, missing {missing}, unexpected {unexpected}; "
            "build the encoder with the checkpoint's embed_dim/mask_in_chans (e.g. configs/model/base.yaml's)"
        )
    encoder.load_state_dict(mapped, strict=False)
