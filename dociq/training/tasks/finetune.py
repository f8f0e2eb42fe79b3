"""`stage=finetune`: promptable document segmentation (question / points / box / mask prompts).

Model (`dociq.models.segmenter.SegmentationModel`, an nn.Module the Predictor uses too): the
document model (Hiera image encoder + layout text encoder + fusion trunk) encodes the page and its
OCR words once per step; a neck turns the fused image tokens into the decoder's stride-16 image
embedding; the word grounding (`dociq.models.grounding`) paints, per prompt, which OCR words
answer the question onto the decoder's stride-16 and stride-4 grids; box prompts are painted
there too; SAM's mask decoder with SAM 2's high-resolution skips predicts masks at stride 4.

Training step (SAM's recipe, docs/finetune.md):
- prompts per question: the question with probability `prompts.question`, plus a box and/or a
  positive point with probabilities `prompts.box` / `prompts.point`, drawn per prompt, so one
  batch mixes question-only, question+point, box-only, ... prompts. Box corners travel as points
  with labels 2/3 (SAM 2), which lets every combination share one batch.
- `rounds` interactive rounds: after each prediction a correction click is drawn from the error
  region of the chosen mask and that mask's logits are fed back as the mask prompt; the loss
  (focal : dice + IoU MSE, lowest-loss candidate only; `task.loss`) is summed over rounds, plus
  the word-relevance BCE of the grounding once per step.
- every round is `SegmentationModel.answer`, the Predictor's prompt path too: what validation
  scores is what the Predictor serves.
- a prompt that is one click and nothing else is ambiguous: it gets the 3 multimask outputs (the
  lowest-loss one is trained); every other prompt gets the single-mask output (SAM 2's rule).
  Its target is the clicked region (the collator's `region_masks`: one region of the answer, the
  click drawn inside it), not the question's whole answer, which a click cannot name.
Validation runs each prompt set of `val_prompts` (default: question only, then box only), one
round: `val/miou`, `val/dice`, `val/miou_<kind>` for the first, `val/<set>_miou...` for the others.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dociq.io.checkpoint import model_state_dict, read_checkpoint
from dociq.models.grounding import Grounding
from dociq.models.image_encoder import load_image_encoder_from_checkpoint
from dociq.models.prompt_encoder import (BOX_BOTTOM_RIGHT, BOX_TOP_LEFT, NOT_A_POINT,
                                         POSITIVE_POINT)
from dociq.models.segmenter import Answer, SegmentationModel, remove_ocr_words
from dociq.models.text_encoder import load_text_encoder_from_checkpoint
from dociq.training.tasks.base import DociqTask
from dociq.training.tasks.init_weights import load_part
from dociq.training.tasks.segment_losses import (append_points, check_loss_targets, loss_grid_targets,
                                                 sample_correction_points, segmentation_loss)
from dociq.data.scoring import SegmentationMetrics

log = logging.getLogger(__name__)

PROMPT_KINDS = ("question", "box", "point")
# focal 1 : dice 1 (not SAM's 20 : 1, which a small model trained for minutes answers with
# "background everywhere"), IoU-head MSE, and the word-grounding BCE.
DEFAULT_LOSS = {"focal": 1.0, "dice": 1.0, "iou": 1.0, "word": 1.0, "word_class": 1.0}
FREEZABLE = ("image_encoder", "text_encoder", "fusion")
HEAD_PARTS = ("neck", "prompt_encoder", "mask_decoder", "grounding", "box_maps", "click_maps", "word_class_head")


# ---- the task ----------------------------------------------------------------------------------

class FinetuneTask(DociqTask):
    def __init__(self, model: Mapping[str, Any], init: Mapping[str, Any] | None = None,
                 prompts: Mapping[str, float] | None = None,
                 val_prompts: Sequence[str] | Mapping[str, Sequence[str]] = ("question",),
                 rounds: int = 2, box_noise: float = 0.1,
                 loss: Mapping[str, float] | None = None,
                 freeze: Mapping[str, bool] | None = None,
                 ocr: bool = True, loss_size: int | None = None, loss_targets: str = "area",
                 lexical_match: bool = True, optimizer=None, scheduler=None) -> None:
        super().__init__(optimizer, scheduler)
        self.save_hyperparameters(ignore=["optimizer", "scheduler"])
        self.prompt_probs = self._check_prompts(prompts)
        self.val_prompt_sets = self._check_val_prompts(val_prompts)
        self.val_prompts = next(iter(self.val_prompt_sets.values()))
        if int(rounds) < 1:
            raise ValueError(f"task.rounds must be >= 1, got {rounds}")
        self.rounds, self.box_noise, self.use_ocr = int(rounds), float(box_noise), bool(ocr)
        self.use_lexical_match = bool(lexical_match)
        if loss_size is not None and int(loss_size) < 1:
            raise ValueError(f"task.loss_size must be a positive side length or null, got {loss_size}")
        self.loss_size = None if loss_size is None else int(loss_size)
        self.loss_targets = check_loss_targets(loss_targets)
        loss = dict(DEFAULT_LOSS) | dict(loss or {})
        if set(loss) - set(DEFAULT_LOSS):
            raise KeyError(f"unknown task.loss key(s) {sorted(set(loss) - set(DEFAULT_LOSS))}; "
                           f"allowed: {', '.join(DEFAULT_LOSS)}")
        self.loss_weights = {k: float(v) for k, v in loss.items()}

        self.model = SegmentationModel.from_config(model)
        self.init_report: dict[str, dict[str, list[str]]] = {}
        self._load_init(dict(init or {}))
        self.frozen = self._freeze(dict(freeze or {}))
        self.val_metrics = SegmentationMetrics()
        # the first prompt set is `val/miou` (the monitored metric); the others log as val/<name>_*
        self.extra_val_metrics = nn.ModuleDict({name: SegmentationMetrics()
                                                for name in list(self.val_prompt_sets)[1:]})

    # ---- setup -------------------------------------------------------------------------------

    @staticmethod
    def _check_prompts(prompts: Mapping[str, float] | None) -> dict[str, float]:
        probs = {"question": 1.0, "box": 0.3, "point": 0.5} | dict(prompts or {})
        unknown = set(probs) - set(PROMPT_KINDS)
        if unknown:
            raise KeyError(f"unknown task.prompts key(s) {sorted(unknown)}; allowed: {', '.join(PROMPT_KINDS)}")
        bad = {k: v for k, v in probs.items() if not 0.0 <= float(v) <= 1.0}
        if bad:
            raise ValueError(f"task.prompts are probabilities in [0, 1], got {bad}")
        return {k: float(v) for k, v in probs.items()}

    @staticmethod
    def _check_val_prompts(val_prompts) -> dict[str, tuple[str, ...]]:
        """A list of prompt kinds (one set) or {name: kinds} (several; the first is `val/miou`)."""
        sets = dict(val_prompts) if isinstance(val_prompts, Mapping) else {"question": val_prompts}
        for name, kinds in sets.items():
            kinds = [kinds] if isinstance(kinds, str) else list(kinds or [])
            unknown = set(kinds) - set(PROMPT_KINDS)
            if unknown or not kinds:
                raise KeyError(f"task.val_prompts.{name} {kinds}: choose a non-empty subset of {PROMPT_KINDS}")
            sets[name] = tuple(kinds)
        if not sets:
            raise KeyError(f"task.val_prompts is empty: give at least one set of prompt kinds from {PROMPT_KINDS}")
        return sets

    def _freeze(self, freeze: dict[str, bool]) -> list[str]:
        unknown = set(freeze) - set(FREEZABLE)
        if unknown:
            raise KeyError(f"unknown task.freeze key(s) {sorted(unknown)}; allowed: {', '.join(FREEZABLE)}")
        frozen = [part for part in FREEZABLE if freeze.get(part, False)]
        for part in frozen:
            getattr(self.model, part).requires_grad_(False)
        return frozen

    def train(self, mode: bool = True):
        super().train(mode)
        for part in self.frozen:   # frozen parts keep eval behaviour (no drop path / dropout)
            getattr(self.model, part).eval()
        return self

    def _load_init(self, init: dict[str, Any]) -> None:
        """init.from: a pretrain (or finetune) checkpoint's `model.*`; init.image_encoder /
        init.text_encoder: the encoders of ijepa / mlm (or any stage's) checkpoints."""
        unknown = set(init) - {"image_encoder", "text_encoder", "from"}
        if unknown:
            raise KeyError(f"unknown init key(s) {sorted(unknown)}; allowed: image_encoder, text_encoder, from")
        if init.get("from"):
            state = _model_state(init["from"])
            self._check_carries_document_model(state, init["from"])
            self.init_report["model"] = load_part(self.model, state, "model", init["from"],
                                                  expected_missing=HEAD_PARTS)
        if init.get("image_encoder"):
            self.init_report["image encoder"] = load_part(
                self.model.image_encoder, load_image_encoder_from_checkpoint(init["image_encoder"]),
                "image encoder", init["image_encoder"], expected_missing=())
        if init.get("text_encoder"):
            self.init_report["text encoder"] = load_part(
                self.model.text_encoder, load_text_encoder_from_checkpoint(init["text_encoder"]),
                "text encoder", init["text_encoder"], expected_missing=())

    @staticmethod
    def _check_carries_document_model(state: Mapping[str, Tensor], path: str) -> None:
        """init.from is for checkpoints that hold the whole document model (pretrain, finetune):
        one of an encoder-stage checkpoint would leave the other parts random without a word."""
        absent = [part for part in FREEZABLE if not any(k.startswith(f"{part}.") for k in state)]
        present = [part for part in FREEZABLE if part not in absent]
        if absent and present:
            hint = {"image_encoder": "init.image_encoder=<ckpt> (an ijepa checkpoint)",
                    "text_encoder": "init.text_encoder=<ckpt> (an mlm or distill checkpoint)"}
            options = " or ".join(hint[p] for p in present if p in hint) or "init.image_encoder / init.text_encoder"
            raise ValueError(f"init.from={path} holds {', '.join(present)} but no {', '.join(absent)}: it is not "
                             f"a stage=pretrain or stage=finetune checkpoint. Load its parts with {options}")

    # ---- prompts -----------------------------------------------------------------------------

    def sample_prompts(self, batch: Mapping[str, Any], kinds: Sequence[str] | None = None,
                       probs: Mapping[str, float] | None = None,
                       ) -> tuple[Tensor | None, tuple[Tensor, Tensor] | None, Tensor]:
        """First-round prompts for every (page, question) slot, flattened image-major.

        kinds: use exactly these prompt kinds for every prompt (validation), or None to draw them
        with `probs` (training). Prompts without a question (no text in the data, or dropped) get
        a point when they would otherwise be empty.
        Returns question ids [N, L] (zero rows = none) or None, points (coords [N, 3, 2] pixel
        indices, labels [N, 3]: the click then the box corners, -1 = unused) or None, and
        `ambiguous` bool [N] (a single click alone)."""
        valid = batch["prompt_valid"].reshape(-1)
        n = valid.shape[0]
        device = valid.device
        ids = batch["prompt_ids"].reshape(n, -1)
        has_text = (ids != 0).any(1)
        if kinds is not None:
            use = {k: torch.full((n,), k in kinds, dtype=torch.bool, device=device) for k in PROMPT_KINDS}
        else:
            probs = probs or self.prompt_probs
            use = {k: torch.rand(n, device=device) < probs[k] for k in PROMPT_KINDS}
        use["question"] = use["question"] & has_text
        empty = ~(use["question"] | use["box"] | use["point"])
        use["point"] = use["point"] | empty

        question_ids = torch.where(use["question"][:, None], ids, torch.zeros_like(ids)) \
            if bool(use["question"].any()) else None
        ambiguous = use["point"] & ~use["box"] & ~use["question"]
        if not bool((use["point"] | use["box"]).any()):
            return question_ids, None, ambiguous

        click = batch["points"].reshape(n, -1, 2)[:, :1] - 0.5        # collator: pixel centres
        boxes = batch["boxes"].reshape(n, 4).clone()
        if kinds is None and self.box_noise > 0:
            boxes = self._jitter_boxes(boxes)
        coords = torch.cat([click, boxes.view(n, 2, 2)], dim=1)
        labels = torch.tensor([POSITIVE_POINT, BOX_TOP_LEFT, BOX_BOTTOM_RIGHT], device=device).expand(n, 3)
        on = torch.stack([use["point"], use["box"], use["box"]], dim=1)
        labels = torch.where(on, labels, torch.full_like(labels, NOT_A_POINT))
        coords = torch.where(on[..., None], coords, torch.zeros_like(coords))
        return question_ids, (coords, labels), ambiguous

    def _jitter_boxes(self, boxes: Tensor) -> Tensor:
        """SAM's box noise: each coordinate moves by N(0, (box_noise * side)^2), at most 20 px."""
        side = torch.stack([boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]] * 2, dim=1)
        noise = (torch.randn_like(boxes) * self.box_noise * side).clamp(-20, 20)
        size = float(self.model.prompt_encoder.input_image_size[0])
        return (boxes + noise).clamp(0, size)

    # ---- forward / loss ----------------------------------------------------------------------

    def _check_batch(self, batch: Mapping[str, Any]) -> None:
        for key in ("prompt_ids", "prompt_valid", "masks", "points", "boxes"):
            if key not in batch:
                raise KeyError(f"finetune batch has no `{key}`: set data.questions=true "
                               "(configs/stage/finetune.yaml sets it)")

    def run_rounds(self, batch: dict, rounds: int, kinds: Sequence[str] | None = None) -> dict[str, Any]:
        """Prompt, predict, correct, `rounds` times. Returns the summed loss, per-round losses and
        the last round's chosen masks [N, H, W] (logits at the input size)."""
        self._check_batch(batch)
        if not self.use_ocr:
            batch = remove_ocr_words(batch)
        valid = batch["prompt_valid"].reshape(-1)
        question_ids, points, ambiguous = self.sample_prompts(batch, kinds)
        targets = batch["masks"].flatten(0, 1)                               # [N, H, W]
        if "region_masks" in batch:
            # A click alone points at one region, not at the question's whole answer (which may be
            # many regions: "all paragraphs"): its target is the clicked region (SAM).
            regions = batch["region_masks"].flatten(0, 1)
            targets = torch.where(ambiguous[:, None, None], regions, targets)
        # The loss compares at the input size (SAM) or, cheaper, at `loss_size` (soft targets as
        # `task.loss_targets` says); clicks and metrics always use the input-size targets.
        loss_targets = targets if self.loss_size is None else \
            loss_grid_targets(targets, self.loss_size, self.loss_targets)
        page = self.model.embed_page(batch)
        match, word_pos = batch.get("prompt_match"), batch.get("prompt_word_pos")
        if match is not None and not self.use_lexical_match:   # ablation: the words, but no match feature
            match = torch.zeros_like(match)
        match = None if match is None else match.flatten(0, 1)
        word_pos = None if word_pos is None else word_pos.flatten(0, 1)
        mask_prompt, total, per_round = None, 0.0, []
        w = self.loss_weights
        word = word_class = None
        answer: Answer | None = None
        for r in range(rounds):
            # the Predictor's path; a later round reuses the questions (and regrounds the clicks)
            answer = self.model.answer(page, question_ids, match, word_pos, points, mask_prompt, ambiguous,
                                       previous=answer)
            if r == 0:   # the word losses, once per step; the relevance one reads this round's grounding
                word_class = word_class_loss(self.model.word_class_logits(page), batch.get("ocr_word_class"))
                if word_class is not None and w["word_class"] > 0:
                    total = total + w["word_class"] * word_class.loss
                if answer.grounding is not None:
                    word = word_relevance_loss(answer.grounding, targets, valid & answer.grounding.active)
                    if w["word"] > 0:
                        total = total + w["word"] * word.loss
            seg = segmentation_loss(answer.candidates, answer.candidate_iou, loss_targets, valid,
                                    focal_weight=w["focal"], dice_weight=w["dice"], iou_weight=w["iou"])
            total = total + seg.loss
            per_round.append(seg)
            chosen = answer.chosen                                          # [N, 1, h, w], detached
            if r + 1 < rounds:
                # Clicks are drawn where the loss looks (the loss grid), then mapped to pixel indices
                # of the input frame: drawing them at 256x256 cost ~5% of a CPU step.
                grid = F.interpolate(chosen, size=loss_targets.shape[-2:], mode="bilinear", align_corners=False) \
                    if chosen.shape[-2:] != loss_targets.shape[-2:] else chosen
                new_points, new_labels = sample_correction_points(grid, loss_targets)
                cell = targets.shape[-1] / loss_targets.shape[-1]
                points = append_points(points, (new_points + 0.5) * cell - 0.5, new_labels)
                mask_prompt = chosen
                ambiguous = torch.zeros_like(ambiguous)   # clicks + a mask prompt: single output
        final = F.interpolate(chosen, size=targets.shape[-2:], mode="bilinear", align_corners=False)[:, 0]
        return {"loss": total, "rounds": per_round, "masks": final, "candidates": answer.candidates.detach(),
                "targets": targets, "valid": valid,
                "points": points, "mask_prompt": mask_prompt, "word": word, "word_class": word_class,
                "relevance": None if answer.grounding is None else answer.grounding.relevance}

    # ---- Lightning hooks ---------------------------------------------------------------------

    def training_step(self, batch, batch_idx):
        out = self.run_rounds(batch, self.rounds)
        bs = batch["image"].shape[0]
        self.log("train/loss", out["loss"].detach(), prog_bar=True, on_step=True, batch_size=bs)
        first, last = out["rounds"][0], out["rounds"][-1]
        valid = out["valid"]
        self.log_dict({"train/focal": first.focal.detach(), "train/dice_loss": first.dice.detach(),
                       "train/iou_mse": first.iou_mse.detach(),
                       "train/iou_round1": first.actual_iou[valid].mean() if valid.any() else 0.0,
                       f"train/iou_round{len(out['rounds'])}": last.actual_iou[valid].mean()
                       if valid.any() else 0.0}, on_step=True, batch_size=bs)
        if out["word"] is not None:
            self.log_dict({"train/word_bce": out["word"].loss.detach(), "train/word_acc": out["word"].accuracy},
                          on_step=True, batch_size=bs)
        if out["word_class"] is not None:
            self.log_dict({"train/word_class_ce": out["word_class"].loss.detach(),
                           "train/word_class_acc": out["word_class"].accuracy}, on_step=True, batch_size=bs)
        return out["loss"]

    def validation_step(self, batch, batch_idx):
        kinds = [k for page in batch["prompt_kind"] for k in page]
        main_loss = None
        for i, (name, prompt_kinds) in enumerate(self.val_prompt_sets.items()):
            out = self.run_rounds(batch, 1, kinds=prompt_kinds)
            valid = out["valid"]
            metrics = self.val_metrics if i == 0 else self.extra_val_metrics[name]
            metrics.update(out["masks"][valid] > 0, out["targets"][valid] > 0.5, kinds)
            if i == 0:
                main_loss = out["loss"]
                self.log("val/loss", out["loss"].detach(), prog_bar=True, on_epoch=True,
                         batch_size=batch["image"].shape[0])
                if out["word_class"] is not None:   # how well the page's words are classified
                    self.log("val/word_class_acc", out["word_class"].accuracy, on_epoch=True,
                             batch_size=batch["image"].shape[0])
        return main_loss

    def on_fit_start(self) -> None:
        self._fit_started = time.monotonic()

    def on_validation_epoch_end(self) -> None:
        if getattr(self, "_fit_started", None) is not None:   # learning curves against wall-clock
            self.log("val/wall_min", (time.monotonic() - self._fit_started) / 60.0)
        for name, value in self.val_metrics.compute().items():
            self.log(f"val/{name}", value, prog_bar=name == "miou")
        self.val_metrics.reset()
        for set_name, metrics in self.extra_val_metrics.items():
            for name, value in metrics.compute().items():
                self.log(f"val/{set_name}_{name}", value)
            metrics.reset()


# ---- word-level supervision ---------------------------------------------------------------------

@dataclass
class WordLoss:
    loss: Tensor        # BCE of the word relevance logits, averaged over the scored words
    accuracy: Tensor    # share of scored words whose relevance sign matches its label


def word_relevance_loss(grounding: Grounding, targets: Tensor, prompts: Tensor) -> WordLoss:
    """A word's label is the share of its box inside the prompt's target mask (soft, 0..1), read
    at the grounding's stride-4 grid; scored over the words of the prompts in `prompts` [N]."""
    cov = grounding.coverage_high_res                                     # [B, T, S]
    b, t, s = cov.shape
    n = targets.shape[0]
    side = int(round(s ** 0.5))
    small = F.interpolate(targets[:, None].float(), size=(side, side), mode="area").view(b, n // b, s)
    area = cov.sum(-1, keepdim=True)                                       # [B, T, 1]
    labels = (cov @ small.transpose(1, 2)) / area.clamp(min=1e-6)          # [B, T, Q]
    labels = labels.transpose(1, 2).reshape(n, t).clamp(0, 1)
    scored = (grounding.words & (area[..., 0] > 0)).repeat_interleave(n // b, dim=0) & prompts[:, None]
    logits = grounding.relevance
    if not bool(scored.any()):
        zero = logits.sum() * 0.0
        return WordLoss(zero, zero.detach())
    bce = F.binary_cross_entropy_with_logits(logits[scored], labels[scored])
    acc = ((logits[scored] > 0) == (labels[scored] > 0.5)).float().mean()
    return WordLoss(bce, acc.detach())


def word_class_loss(logits: Tensor | None, labels: Tensor | None) -> WordLoss | None:
    """Cross-entropy of the word-class head over the tokens with a class (labels >= 0); None
    without the head, the labels, or a labelled token (a page without OCR words)."""
    if logits is None or labels is None:
        return None
    scored = labels >= 0
    if not bool(scored.any()):
        return None
    ce = F.cross_entropy(logits[scored], labels[scored])
    acc = (logits[scored].argmax(-1) == labels[scored]).float().mean()
    return WordLoss(ce, acc.detach())


# ---- checkpoint reading ------------------------------------------------------------------------

def _read_state(path: str) -> dict[str, Tensor]:
    if not Path(path).is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist (init.from): give a .ckpt of "
                                "stage=pretrain or stage=finetune")
    ckpt = read_checkpoint(path, option="init.from")
    state = ckpt.get("state_dict", ckpt)
    if not isinstance(state, dict):
        raise ValueError(f"{path} is not a Lightning checkpoint or state dict (init.from)")
    return state


def _model_state(path: str) -> dict[str, Tensor]:
    """`model.*` tensors of a pretrain/finetune checkpoint (prefix stripped); a plain state dict
    of a DocumentModel / SegmentationModel is taken as is."""
    state = _read_state(path)
    prefixed = model_state_dict(state, "model.", tensors_only=True)
    if prefixed:
        return prefixed
    return {k: v for k, v in state.items() if torch.is_tensor(v)}
