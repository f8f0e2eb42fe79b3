"""`stage=distill`: distil a bidirectional LLM teacher into the layout-aware text encoder.

Student = `TextEncoder` on the MLM-corrupted OCR tokens (`mlm_ids`). Its loss is a weighted sum of
  * hidden-state distillation: the student's word vectors, through a learned linear projection to
    the teacher's width, match the teacher's word vectors of the *clean* text — by cosine
    (direction) and MSE against layer-normed targets (scale-free; LLM hidden states carry a few
    huge outlier channels that would otherwise dominate the MSE);
  * MLM on the masked tokens (as `stage=mlm`);
  * KL(teacher || student) on the masked tokens' vocabulary distributions at temperature T
    (scaled by T², Hinton et al.) — only when teacher and student share the vocabulary. The teacher
    then reads the same corrupted ids, and its distribution for token i is read at position i-1
    (the masked next-token convention of LLM2Vec's MNTP).

Aligning two tokenisations: the teacher's tokenizer splits the OCR text differently from the
student's WordPiece ("invoice#12" is 4 WordPiece tokens, maybe 3 BPE tokens), so token i on one
side means nothing on the other. The unit both sides share is the OCR word. Each side's sub-token
states are averaged per word (`pool_words`), giving one vector per word on both sides with the
same index, and the hidden-state loss compares those. Words either side lost (truncation, a word
that tokenises to nothing) are left out. With a shared vocabulary the teacher reads the student's
own ids, so the alignment is exact token by token as well.

Teacher: `teacher.path` is a local Hugging Face causal LM made bidirectional (LLM2Vec step 1,
`dociq.models.teacher`); `teacher.mntp.steps > 0` first adapts it with masked next-token
prediction on the training data (LLM2Vec step 2). The teacher is frozen, kept out of the module
tree (so it is neither optimised nor stored in checkpoints; `teacher.path` in the hyperparameters
says where it came from). If `teacher.path` does not exist and `teacher.build_if_missing` is set
(the default config), a *random* tiny Llama with the student's vocabulary is built there, so the
stage runs offline; it is a smoke-test teacher and the log says so.
"""
from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from dociq.data.masking import MLMMasking
from dociq.models.teacher import Teacher, adapt_with_mntp, build_tiny_teacher
from dociq.models.document_model import text_encoder_from_config
from dociq.models.text_encoder import MLMHead, load_tokenizer
from dociq.training.tasks.base import DociqTask
from dociq.training.tasks.mlm import IGNORE_INDEX, MLM_BATCH_KEYS, init_text_encoder, mlm_loss, require_keys

log = logging.getLogger(__name__)

RANDOM_TEACHER_MARKER = "DOCIQ_RANDOM_TINY_TEACHER"
DEFAULT_TEACHER = dict(path=None, build_if_missing=False, bidirectional=True, layer=-1,
                       max_length=512, dtype=None,
                       mntp=dict(steps=0, lr=5e-5, prob=0.2, save_to=None))
DEFAULT_WEIGHTS = dict(hidden_cosine=1.0, hidden_mse=1.0, mlm=1.0, kl=1.0)


def pool_words(features: torch.Tensor, word_index: torch.Tensor,
               num_words: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean of the token features of each word: ([B, W, H], valid bool [B, W]).

    word_index [B, T] holds each token's word (-1: special/padding, ignored)."""
    b, _, h = features.shape
    keep = (word_index >= 0) & (word_index < num_words)
    flat = (torch.arange(b, device=features.device)[:, None] * num_words + word_index)[keep]
    sums = features.new_zeros(b * num_words, h).index_add_(0, flat, features[keep])
    counts = features.new_zeros(b * num_words).index_add_(
        0, flat, torch.ones_like(flat, dtype=features.dtype))
    pooled = sums / counts.clamp(min=1)[:, None]
    return pooled.view(b, num_words, h), (counts > 0).view(b, num_words)


def words_from_wordpiece(ids: torch.Tensor, word_index: torch.Tensor, tokenizer) -> list[list[str]]:
    """Rebuild each page's OCR words from its WordPiece tokens (so the teacher can re-tokenise them).

    Word w of a page is at list index w; a word with no tokens becomes "" (and drops out of the
    alignment). The default vocabulary is uncased, so the teacher sees lower-cased words."""
    pages = []
    for row_ids, row_words in zip(ids.tolist(), word_index.tolist()):
        pieces: dict[int, list[str]] = {}
        for token, w in zip(tokenizer.convert_ids_to_tokens(row_ids), row_words):
            if w >= 0:
                pieces.setdefault(w, []).append(token[2:] if token.startswith("##") else token)
        count = max(pieces) + 1 if pieces else 0
        pages.append(["".join(pieces.get(w, [])) for w in range(count)])
    return pages


def resolve_teacher_dir(path: str | os.PathLike | None, build_if_missing: bool) -> Path:
    if path is None:
        raise ValueError("stage=distill needs teacher.path: a local Hugging Face causal LM directory "
                         "(e.g. teacher.path=/models/Llama-3.2-1B), or teacher.build_if_missing=true")
    path = Path(path)
    if (path / "config.json").exists():
        return path
    if not build_if_missing:
        raise FileNotFoundError(f"teacher.path={path} has no config.json: point it at a local Hugging "
                                "Face causal LM, or make a test teacher with "
                                f"`python scripts/make_tiny_teacher.py --out {path}`")
    log.warning("teacher.path=%s does not exist: building a RANDOM tiny Llama there "
                "(scripts/make_tiny_teacher.py). It makes stage=distill run offline but teaches "
                "nothing; for real distillation set teacher.path=<local HF causal LM dir>.", path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    build_tiny_teacher(tmp)
    (tmp / RANDOM_TEACHER_MARKER).write_text("random weights, built by dociq for offline runs\n")
    try:
        tmp.rename(path)  # atomic; another process may have built it meanwhile
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (path / "config.json").exists():
            raise
    return path


class DistillTask(DociqTask):
    def __init__(self, model: Mapping[str, Any], init: Mapping[str, Any] | None = None,
                 teacher: Mapping[str, Any] | None = None, weights: Mapping[str, float] | None = None,
                 temperature: float = 2.0, optimizer=None, scheduler=None) -> None:
        super().__init__(optimizer, scheduler)
        self.save_hyperparameters(ignore=["optimizer", "scheduler"])
        teacher_cfg = _merge(DEFAULT_TEACHER, teacher or {}, "teacher")
        self.weights = _merge(DEFAULT_WEIGHTS, weights or {}, "weights")
        self.temperature = float(temperature)
        self.teacher_cfg = teacher_cfg

        self.text_encoder = text_encoder_from_config(model)
        self.mlm_head = MLMHead(self.text_encoder.hidden_size, self.text_encoder.vocab_size)
        self.mlm_head.tie_to(self.text_encoder.word_embeddings)
        init_text_encoder(self.text_encoder, init)
        self.student_tokenizer = load_tokenizer(self.text_encoder.tokenizer_path)

        teacher_dir = resolve_teacher_dir(teacher_cfg["path"], teacher_cfg["build_if_missing"])
        if (teacher_dir / RANDOM_TEACHER_MARKER).exists():
            log.warning("teacher %s is a RANDOM tiny model (smoke test only); set teacher.path to a "
                        "real local causal LM to distil something useful", teacher_dir)
        dtype = getattr(torch, teacher_cfg["dtype"]) if teacher_cfg["dtype"] else None
        loaded = Teacher.from_pretrained(teacher_dir, bidirectional=teacher_cfg["bidirectional"],
                                         layer=teacher_cfg["layer"], dtype=dtype)
        loaded.model.eval().requires_grad_(False)
        self._teacher = (loaded,)  # a tuple keeps it out of parameters() and the state dict
        self.projection = nn.Linear(self.text_encoder.hidden_size, loaded.hidden_size)
        # KL needs the same vocabulary; the teacher then reads the student's ids directly.
        self.shared_vocab = (loaded.vocab_size == self.text_encoder.vocab_size
                             and loaded.vocab() == self.student_tokenizer.get_vocab())
        if not loaded.has_lm_head:
            _require_no_head_losses(teacher_dir, loaded, teacher_cfg,
                                    self.weights["kl"] if self.shared_vocab else 0.0)
        log.info("distill: teacher %s hidden %d -> student %d; vocabularies %s, KL term %s",
                 teacher_dir, loaded.hidden_size, self.text_encoder.hidden_size,
                 "match" if self.shared_vocab else "differ (word-level alignment)",
                 "on" if self.shared_vocab and self.weights["kl"] > 0 else "off")

    @property
    def teacher(self) -> Teacher:
        teacher = self._teacher[0]
        if next(teacher.model.parameters()).device != self.device:
            teacher.model.to(self.device)
        return teacher

    # ---- teacher inputs -------------------------------------------------------------------
    def teacher_tokens(self, batch: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(ids, mask, word_index) of the clean OCR text in the teacher's tokenisation."""
        if self.shared_vocab:  # the page's own tokens, cut to what the teacher can read
            length = self.teacher_length()
            return (batch["ocr_ids"][:, :length], batch["ocr_mask"][:, :length],
                    batch["ocr_word_index"][:, :length])
        words = words_from_wordpiece(batch["ocr_ids"], batch["ocr_word_index"], self.student_tokenizer)
        return self.teacher.tokenize_words(words, self.teacher_length(), device=self.device)

    def teacher_length(self) -> int:
        limits = [self.teacher_cfg["max_length"], self.teacher.max_positions]
        return min(int(x) for x in limits if x)

    def on_fit_start(self) -> None:
        mntp = self.teacher_cfg["mntp"]
        if int(mntp["steps"]) <= 0:
            return
        datamodule = getattr(self.trainer, "datamodule", None)
        if datamodule is None:
            raise RuntimeError("teacher.mntp.steps>0 needs a datamodule (trainer.fit(task, datamodule=...))")
        self.adapt_teacher(datamodule.train_dataloader())

    def adapt_teacher(self, loader) -> list[float]:
        """LLM2Vec step 2 on this stage's data: MNTP for teacher.mntp.steps batches, then freeze."""
        cfg, teacher = self.teacher_cfg["mntp"], self.teacher

        def teacher_batches():
            for batch in loader:
                batch = {k: (v.to(self.device) if torch.is_tensor(v) else v) for k, v in batch.items()}
                ids, mask, word_index = self.teacher_tokens(batch)
                yield ids, mask, word_index < 0

        masking = MLMMasking(teacher.mask_token_id, teacher.vocab_size, prob=float(cfg["prob"]))
        losses = adapt_with_mntp(teacher, _Reiterable(teacher_batches), masking,
                                 steps=int(cfg["steps"]), lr=float(cfg["lr"]))
        if cfg["save_to"]:
            teacher.model.save_pretrained(cfg["save_to"])
            teacher.tokenizer.save_pretrained(cfg["save_to"])
            log.info("MNTP-adapted teacher saved to %s (use it as teacher.path, mntp.steps=0)",
                     cfg["save_to"])
        return losses

    # ---- losses -----------------------------------------------------------------------------
    def forward(self, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        require_keys(batch, MLM_BATCH_KEYS + ("ocr_ids", "ocr_word_index"), "distill")
        labels = batch["mlm_labels"]
        student = self.text_encoder(batch["mlm_ids"], batch["ocr_boxes"], batch["ocr_mask"])
        loss_mlm, accuracy, student_logits = mlm_loss(student, labels, self.mlm_head)

        teacher = self.teacher
        t_ids, t_mask, t_words = self.teacher_tokens(batch)
        use_kl = self.shared_vocab and self.weights["kl"] > 0
        with torch.no_grad():
            if use_kl:  # one call: the clean ids for hidden targets, the corrupted ids for KL
                masked_ids = batch["mlm_ids"][:, : t_ids.shape[1]]
                selected, final = teacher.encode(torch.cat([t_ids, masked_ids]),
                                                 torch.cat([t_mask, t_mask]))
                t_hidden, t_final_masked = selected[: len(t_ids)], final[len(t_ids):]
            else:
                t_hidden, _ = teacher.encode(t_ids, t_mask)

        num_words = int(max(batch["ocr_word_index"].max(), t_words.max())) + 1
        s_vec, s_valid = pool_words(student, batch["ocr_word_index"], num_words)
        t_vec, t_valid = pool_words(t_hidden.float(), t_words, num_words)
        valid = s_valid & t_valid
        pred, target = self.projection(s_vec[valid]), t_vec[valid]
        loss_cos = (1 - F.cosine_similarity(pred, target, dim=-1)).mean()
        loss_mse = F.mse_loss(pred, F.layer_norm(target, target.shape[-1:]))

        out = {"mlm_loss": loss_mlm, "mlm_acc": accuracy, "hidden_cos": loss_cos,
               "hidden_mse": loss_mse}
        total = (self.weights["mlm"] * loss_mlm + self.weights["hidden_cosine"] * loss_cos
                 + self.weights["hidden_mse"] * loss_mse)
        if use_kl:
            out["kl"] = self.kl_loss(student_logits, t_final_masked, labels)
            total = total + self.weights["kl"] * out["kl"]
        out["loss"] = total
        return out

    def kl_loss(self, student_logits: torch.Tensor, teacher_final: torch.Tensor,
                labels: torch.Tensor) -> torch.Tensor:
        """KL(teacher || student) over the masked tokens at temperature T, times T²."""
        where = (labels != IGNORE_INDEX).nonzero()  # row-major, the order of student_logits
        seen = where[:, 1] < teacher_final.shape[1]  # tokens past the teacher's length have no target
        where, student_logits = where[seen], student_logits[seen]
        if where.numel() == 0:
            return student_logits.sum() * 0.0
        # token i is predicted at position i-1; position 0 ([CLS]) is never masked
        with torch.no_grad():
            teacher_logits = self.teacher.logits_at(teacher_final[where[:, 0], where[:, 1] - 1])
        t = self.temperature
        return F.kl_div(F.log_softmax(student_logits.float() / t, -1),
                        F.log_softmax(teacher_logits.float() / t, -1),
                        log_target=True, reduction="batchmean") * t * t

    def _step(self, batch: Mapping[str, Any], split: str) -> torch.Tensor:
        out = self(batch)
        size = batch["mlm_ids"].shape[0]
        self.log(f"{split}/loss", out["loss"], prog_bar=True, batch_size=size)
        for name in ("mlm_loss", "mlm_acc", "hidden_cos", "hidden_mse", "kl"):
            if name in out:
                self.log(f"{split}/{name}", out[name], batch_size=size)
        return out["loss"]

    def training_step(self, batch, batch_idx):
        return self._step(batch, "train")

    def validation_step(self, batch, batch_idx):
        return self._step(batch, "val")


def _require_no_head_losses(teacher_dir: Path, teacher: Teacher, teacher_cfg: Mapping[str, Any],
                            kl_weight: float) -> None:
    """A teacher without a trained LM head (e.g. a sentence encoder) teaches hidden states only."""
    problem = (f"teacher.path={teacher_dir} has no trained LM head "
               f"({', '.join(teacher.untrained_head)} are not in the checkpoint)")
    if kl_weight > 0:
        raise ValueError(f"{problem}, so the KL term would match random logits: set "
                         "task.weights.kl=0 to distil its hidden states only")
    if int(teacher_cfg["mntp"]["steps"]) > 0:
        raise ValueError(f"{problem}; MNTP adapts a causal LM through its head: set "
                         "task.teacher.mntp.steps=0")


class _Reiterable:
    """An iterable that restarts a generator function (MNTP may need more than one epoch)."""

    def __init__(self, make) -> None:
        self.make = make

    def __iter__(self):
        return self.make()


def _merge(defaults: Mapping[str, Any], given: Mapping[str, Any], name: str) -> dict[str, Any]:
    unknown = set(given) - set(defaults)
    if unknown:
        raise KeyError(f"unknown task.{name} key(s) {sorted(unknown)}; allowed: {', '.join(defaults)}")
    merged = dict(defaults)
    for key, value in given.items():
        if isinstance(defaults[key], dict):
            merged[key] = _merge(defaults[key], value or {}, f"{name}.{key}")
        else:
            merged[key] = value
    return merged
