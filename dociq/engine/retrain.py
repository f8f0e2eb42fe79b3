"""One retrain round of the data engine: the annotators' accepted masks become training data.

    result = run_round(store, steps=300)          # export -> fine-tune -> evaluate -> promote or refuse
    dociq engine retrain --data DIR --steps 300   # the same from the command line (dociq.cli.engine_retrain)

A round
  1. exports the accepted annotations of the store's `train` pages (and, for inspection, of its
     `heldout` pages) as COCO JSON (`dociq.engine.coco_export.export_coco`);
  2. fine-tunes FROM the current checkpoint (`store.checkpoint()`, else `base_checkpoint`) with
     `python train.py stage=finetune init.from=<ckpt>` in a subprocess, on the user's pages MIXED
     with synthetic pages (`dociq.data.mixture.MixedDocuments`, weights [1 - f, f]): a few hundred
     pages of one user's documents alone would make the model forget the rest of its training
     distribution. The run's Hydra config groups (data, model, callbacks) are written to
     `<round dir>/conf/` and passed with `--config-dir`; the data group starts from the shipped
     `data=corpus_mixed` and replaces only its train set (and drops validation); the model group is
     the checkpoint's own model config, so any model size works;
  3. evaluates the old and the new checkpoint on the held-out pages' accepted annotations
     (per-prompt IoU of the question's mask; mean = mIoU);
  4. promotes the new checkpoint (`store.set_checkpoint`) only if held-out mIoU does not drop by
     more than `tolerance` (default 0: new >= old), else keeps the old one ("refused");
  5. records the round (`store.record_round`).
Everything a round writes goes to `<data>/rounds/round_<k>/` (exports, conf, train/ with the log
and checkpoints, round.json). A failed training run changes nothing in the store: the error names
its log file.
"""
from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from dociq.data.datasets.coco import CocoDocuments
from dociq.data.masks import mask_iou
from dociq.engine.coco_export import export_coco
from dociq.engine.store import EngineStore
from dociq.io.checkpoint import read_checkpoint
from dociq.models.sizes import checkpoint_model_config, complete_model_config

log = logging.getLogger(__name__)

TRAIN_SPLIT = "train"
HELDOUT_SPLIT = "heldout"
ROUNDS_DIR = "rounds"
DEFAULT_LR = 2e-4          # a tenth-ish of the fine-tuning recipe's 1e-3: the model is already trained
DEFAULT_HELDOUT_MIN = 8    # fewer held-out prompts than this cannot tell a better model from noise
REPO_ROOT = Path(__file__).resolve().parents[2]


class RoundFailedError(RuntimeError):
    """The training subprocess of a round failed; the store and its checkpoint are unchanged."""

    def __init__(self, message: str, log_path: Path):
        super().__init__(message)
        self.log_path = log_path


# ---------------------------------------------------------------------------------------------
# the training data: the user's pages mixed with synthetic ones (dociq.data.mixture.MixedDocuments)

# the shipped data group the round's data config starts from: a MixedDocuments train set whose
# `datasets` and `weights` lists the round replaces (Hydra replaces lists whole), and the data
# module's defaults (tokenizer, image size, ...) every data group shares
BASE_DATA_CONFIG = "corpus_mixed"
# how the round reads its own export (the store's words are the ground truth)
USER_SET = {"ocr": "groundtruth", "on_bad_sample": "raise"}
NO_USER_PAGES_FIX = "Fix: annotate (accept) masks on train pages first"
# the synthetic pages of the mix: the fine-tuning recipe's training data (data=synthetic), fixed seed
DEFAULT_SYNTHETIC = {"num_pages": 4000, "seed": 0, "degrade": 0.3}


def check_mix(synthetic_fraction: float, synthetic: dict | None, num_pages: int | None = None) -> None:
    """Refuse a training mix MixedDocuments could not build, with the round's own words, before
    anything is exported or trained."""
    f = float(synthetic_fraction)
    if not 0.0 <= f < 1.0:
        raise ValueError(f"synthetic_fraction={synthetic_fraction!r}: need 0 <= f < 1 (1 would leave no "
                         "user page); 0 trains on the user's pages only")
    if f > 0 and not (synthetic or {}).get("num_pages"):
        raise ValueError(f"synthetic_fraction={f} but the synthetic set is empty: give synthetic pages "
                         "(synthetic={'num_pages': N, ...}) or synthetic_fraction=0")
    if num_pages is not None and (isinstance(num_pages, bool) or not isinstance(num_pages, (int, np.integer))
                                  or num_pages < 1):
        raise ValueError(f"num_pages={num_pages!r}: need a positive int (or None: every user page at least "
                         "once plus its share of synthetic pages, and at least steps x batch_size pages)")


# ---------------------------------------------------------------------------------------------
# held-out evaluation


def heldout_miou(checkpoint: Path, annotations: list, store, predictor_factory: Callable | None = None) -> dict:
    """Per-prompt IoU of the checkpoint's answer to each held-out annotation's question against its
    accepted mask; -> {"miou", "prompts", "per_kind": {kind: miou}}. One embedding per page."""
    if predictor_factory is None:
        # deferred: the model stack (several seconds to import); tests and callers may pass their own
        from dociq.inference.predictor import Predictor
        predictor_factory = Predictor.from_checkpoint
    predictor = predictor_factory(checkpoint)
    by_page: dict[str, list] = {}
    for ann in annotations:
        if ann.question.strip():
            by_page.setdefault(ann.page_id, []).append(ann)
    ious, kinds = [], []
    for page_id, anns in by_page.items():
        words, boxes = store.page_words(page_id)
        predictor.set_image(store.page_image(page_id), words=list(words), word_boxes=boxes)
        masks, _, _ = predictor.predict_masks(question=[a.question for a in anns])
        for ann, mask in zip(anns, masks):
            ious.append(mask_iou(np.asarray(mask, bool), ann.mask))
            kinds.append(ann.kind)
    if not ious:
        raise ValueError("no held-out annotation has a question to ask the model")
    per_kind = {k: float(np.mean([v for v, kk in zip(ious, kinds) if kk == k])) for k in sorted(set(kinds))}
    return {"miou": float(np.mean(ious)), "prompts": len(ious), "per_kind": per_kind}


# ---------------------------------------------------------------------------------------------
# the training subprocess


@dataclass
class TrainJob:
    """Everything the training subprocess needs; `command()` is what runs.

    synthetic_fraction: f, the share of synthetic pages in the training mix (0 <= f < 1).
    synthetic: the SyntheticDocuments settings of those pages (None: none; then f must be 0).
    num_pages: the mix's length; None: every user page at least once plus its share of synthetic
               pages (ceil(n_user / (1 - f))), and at least steps x batch_size pages, so one pass
               covers the run and synthetic pages do not repeat."""
    init_from: Path
    train_json: Path
    work_dir: Path
    steps: int
    synthetic_fraction: float
    seed: int = 0
    lr: float = DEFAULT_LR
    batch_size: int = 4
    synthetic: dict | None = field(default_factory=lambda: dict(DEFAULT_SYNTHETIC))
    overrides: Sequence[str] = ()
    task: dict = field(default_factory=dict)   # task.* settings the checkpoint was trained with
    num_pages: int | None = None

    def __post_init__(self) -> None:
        check_mix(self.synthetic_fraction, self.synthetic, self.num_pages)

    @property
    def output_dir(self) -> Path:
        return self.work_dir / "train"

    @property
    def log_path(self) -> Path:
        return self.work_dir / "train.log"

    @property
    def config_dir(self) -> Path:
        return self.work_dir / "conf"

    def mix_length(self, user_pages: int) -> int:
        """The mix's length for `user_pages` exported pages (see num_pages)."""
        if self.num_pages is not None:
            return int(self.num_pages)
        every_user_page = math.ceil(user_pages / (1.0 - float(self.synthetic_fraction)) - 1e-9)
        return max(every_user_page, max(self.steps, 1) * self.batch_size)

    def train_set(self) -> dict:
        """The run's train set: MixedDocuments of the user's exported pages and synthetic pages at
        weights [1 - f, f], seeded by the run's seed (the round's). Raises when the export holds no page."""
        user = {"_target_": "dociq.data.datasets.coco.CocoDocuments", "annotation_file": str(self.train_json),
                **USER_SET}
        user_pages = len(CocoDocuments(self.train_json, **USER_SET))
        if user_pages == 0:
            raise ValueError(f"the train export {self.train_json} holds no page: the store exported no accepted "
                             f"annotations of the '{TRAIN_SPLIT}' split. {NO_USER_PAGES_FIX}")
        f = float(self.synthetic_fraction)
        datasets, weights = [user], [1.0]
        if f > 0:
            datasets.append({"_target_": "dociq.data.synthetic.generator.SyntheticDocuments",
                             "image_size": "${model.image_size}", **self.synthetic})
            weights = [1.0 - f, f]
        return {"_target_": "dociq.data.mixture.MixedDocuments", "datasets": datasets, "weights": weights,
                "length": self.mix_length(user_pages), "seed": "${seed}"}

    def write_config(self, model_config: dict) -> None:
        """The run's own Hydra groups: data (the shipped `data=corpus_mixed` with `train_set()` in
        place of its train set and no validation), model (the checkpoint's, written complete:
        `complete_model_config`), callbacks (only the
        last checkpoint: the round evaluates it itself). stage=finetune sets the data module's
        questions, batch size and masking."""
        data = {"defaults": [BASE_DATA_CONFIG, "_self_"], "train_set": self.train_set(), "val_set": None}
        conf = self.config_dir
        for group in ("data", "model", "callbacks"):
            (conf / group).mkdir(parents=True, exist_ok=True)
        callbacks = {"model_checkpoint": {
            "_target_": "lightning.pytorch.callbacks.ModelCheckpoint",
            "dirpath": "${paths.output_dir}/checkpoints", "monitor": None, "save_top_k": 0, "save_last": True}}
        # JSON is YAML: no quoting surprises in paths or interpolations
        (conf / "data" / "engine_round.yaml").write_text(json.dumps(data, indent=1))
        (conf / "model" / "engine_round.yaml").write_text(json.dumps(complete_model_config(model_config), indent=1))
        (conf / "callbacks" / "engine_round.yaml").write_text(json.dumps(callbacks, indent=1))

    def command(self) -> list[str]:
        entry = REPO_ROOT / "train.py"
        head = [sys.executable, str(entry)] if entry.is_file() else [
            sys.executable, "-c", "from dociq.training.train import main; main()"]
        own = ["stage=finetune", "model=engine_round", "data=engine_round", "callbacks=engine_round",
               f"init.from={hydra_quote(self.init_from)}", f"trainer.max_steps={self.steps}",
               f"trainer.val_check_interval={self.steps}", "trainer.limit_val_batches=0",
               "trainer.enable_progress_bar=false", f"seed={self.seed}",
               f"optim.optimizer.lr={self.lr}", f"data.batch_size={self.batch_size}",
               f"paths.output_dir={hydra_quote(self.output_dir)}",
               *[f"task.{k}={json.dumps(v)}" for k, v in self.task.items()]]
        # the caller's overrides win: drop ours for the same keys (Hydra refuses a key given twice)
        given = {override_key(o) for o in self.overrides}
        return [*head, "--config-dir", str(self.config_dir),
                *[a for a in own if override_key(a) not in given], *self.overrides]


def hydra_quote(value) -> str:
    """A value for a Hydra override, single-quoted so paths with spaces or '=' stay one value."""
    return "'" + str(value).replace("'", "\\'") + "'"


def override_key(override: str) -> str:
    """'trainer.max_steps=5' -> 'trainer.max_steps' ('+key=v', '~key' and '++key=v' alike)."""
    return override.split("=", 1)[0].lstrip("+~")


# task settings that change what the model reads: a round keeps the checkpoint's
INHERITED_TASK_KEYS = ("ocr", "lexical_match", "loss_size")


def checkpoint_hparams(path: Path) -> dict:
    """The hyper-parameters a stage=finetune checkpoint was trained with (`model` among them)."""
    hparams = read_checkpoint(path).get("hyper_parameters") or {}
    if "model" not in hparams:
        raise ValueError(f"checkpoint {path} has no hyper_parameters.model: it is not a stage=finetune "
                         "checkpoint. Fix: start the engine from a `python train.py stage=finetune` checkpoint")
    return dict(hparams, model=checkpoint_model_config(hparams["model"], path))


def train_subprocess(job: TrainJob) -> Path:
    """Run `python train.py stage=finetune ...` for the job; -> the new last.ckpt.
    Raises RoundFailedError naming the log when it fails."""
    hparams = checkpoint_hparams(job.init_from)
    job.write_config(dict(hparams["model"]))
    job.task = {k: hparams[k] for k in INHERITED_TASK_KEYS if k in hparams} | dict(job.task)
    cmd = job.command()
    job.log_path.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HYDRA_FULL_ERROR="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    with open(job.log_path, "w") as logf:
        logf.write("$ " + " ".join(cmd) + "\n\n")
        logf.flush()
        rc = subprocess.run(cmd, cwd=REPO_ROOT, stdout=logf, stderr=subprocess.STDOUT, env=env).returncode
    ckpt = job.output_dir / "checkpoints" / "last.ckpt"
    if rc != 0:
        raise RoundFailedError(f"the round's training run failed (exit code {rc}); its log is {job.log_path}:\n"
                               + _tail(job.log_path), job.log_path)
    if not ckpt.is_file():
        raise RoundFailedError(f"the round's training run ended without writing {ckpt}; its log is "
                               f"{job.log_path}", job.log_path)
    return ckpt


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# ---------------------------------------------------------------------------------------------
# the round


@dataclass
class RoundResult:
    round: int
    promoted: bool
    status: str                    # "promoted" | "refused"
    steps: int
    miou_old: float
    miou_new: float
    old_checkpoint: str
    new_checkpoint: str
    checkpoint: str                # the store's checkpoint after the round
    train_annotations: int
    train_pages: int
    heldout_annotations: int
    new_annotations: int           # accepted train annotations since the previous round
    mean_clicks_new: float | None  # their mean clicks per mask
    train_seconds: float
    wall_seconds: float
    work_dir: str
    log: str
    per_kind_old: dict = field(default_factory=dict)
    per_kind_new: dict = field(default_factory=dict)
    exported_at: float = 0.0       # unix time the round read the store: later saves belong to the next

    def to_json(self) -> dict:
        return asdict(self)


def _round_dir(store, k: int) -> Path:
    """`<data>/rounds/round_<k>`; a failed earlier attempt at round k keeps its folder (and log)."""
    base = store.data_dir / ROUNDS_DIR / f"round_{k:03d}"
    path, attempt = base, 1
    while path.exists():
        attempt += 1
        path = base.with_name(f"{base.name}_attempt{attempt}")
    return path


def _pages_split(store, split: str) -> set[str]:
    return {p.id for p in store.pages(split=split)}


def run_round(store, base_checkpoint: str | Path | None = None, steps: int = 300, synthetic_fraction: float = 0.5,
              overrides: Sequence[str] = (), heldout_min: int = DEFAULT_HELDOUT_MIN, work_dir: str | Path | None = None,
              tolerance: float = 0.0, lr: float = DEFAULT_LR, seed: int | None = None,
              evaluate: Callable | None = None, train: Callable[[TrainJob], Path] | None = None,
              num_pages: int | None = None) -> RoundResult:
    """Retrain on the store's accepted train annotations; promote the result only if held-out mIoU
    does not drop (new >= old - tolerance). See the module doc.

    synthetic_fraction: the share of synthetic pages in the training mix (0 <= f < 1);
    num_pages: the mix's length (None: see TrainJob).

    evaluate(checkpoint, heldout_annotations, store) -> {"miou": float, ...}: default heldout_miou.
    train(job) -> new checkpoint path: default train_subprocess (tests inject both)."""
    evaluate = evaluate or heldout_miou
    train = train or train_subprocess
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"steps={steps!r}: need a positive number of optimizer steps")
    check_mix(synthetic_fraction, DEFAULT_SYNTHETIC, num_pages)   # before anything is written
    current = store.checkpoint() or (Path(base_checkpoint) if base_checkpoint else None)
    if current is None:
        raise ValueError(f"the store {store.data_dir} has no checkpoint and no base_checkpoint was given. Fix: "
                         "pass base_checkpoint=<stage=finetune ckpt> (CLI: --checkpoint PATH)")
    current = Path(current).expanduser().resolve()
    if not current.is_file():
        raise FileNotFoundError(f"checkpoint {current} does not exist. Fix: pass an existing stage=finetune "
                                "checkpoint (--checkpoint PATH), or store.set_checkpoint(<path>)")
    start = time.time()
    train_pages, heldout_pages = _pages_split(store, TRAIN_SPLIT), _pages_split(store, HELDOUT_SPLIT)
    accepted = store.annotations(status="accepted")
    train_anns = [a for a in accepted if a.page_id in train_pages]
    heldout_anns = [a for a in accepted if a.page_id in heldout_pages and a.question.strip()]
    if not train_anns:
        raise ValueError(f"the store {store.data_dir} has no accepted annotations on '{TRAIN_SPLIT}' pages: "
                         f"nothing to train on. {NO_USER_PAGES_FIX}")
    if len(heldout_anns) < heldout_min:
        raise ValueError(f"the store {store.data_dir} has {len(heldout_anns)} accepted held-out annotations with a "
                         f"question, fewer than heldout_min={heldout_min}: a round could not tell a better model "
                         f"from a worse one. Fix: move pages to the '{HELDOUT_SPLIT}' split "
                         "(dociq.engine.importer.split_heldout) and annotate them, or lower heldout_min")
    previous = store.rounds()
    # "new" = accepted after the previous round's export (saves made while it trained count here)
    since = previous[-1]["metrics"].get("exported_at", previous[-1]["created"]) if previous else float("-inf")
    new_anns = [a for a in train_anns if a.created > since]

    k = len(previous) + 1
    work = Path(work_dir) if work_dir is not None else _round_dir(store, k)
    work.mkdir(parents=True, exist_ok=True)
    train_json = export_coco(store, work / "export_train" / "annotations.json", split=TRAIN_SPLIT)
    export_coco(store, work / "export_heldout" / "annotations.json", split=HELDOUT_SPLIT)
    job = TrainJob(init_from=current, train_json=train_json, work_dir=work, steps=steps,
                   synthetic_fraction=synthetic_fraction, seed=k if seed is None else seed, lr=lr,
                   overrides=tuple(overrides), num_pages=num_pages)
    t0 = time.time()
    new = Path(train(job))
    train_s = time.time() - t0
    old_eval, new_eval = evaluate(current, heldout_anns, store), evaluate(new, heldout_anns, store)
    old_miou, new_miou = float(old_eval["miou"]), float(new_eval["miou"])
    promoted = new_miou >= old_miou - tolerance
    if promoted:
        store.set_checkpoint(new)
    elif store.checkpoint() is None:
        store.set_checkpoint(current)   # the base stays the model to beat (and to annotate with)
    clicks = [a.clicks for a in new_anns]
    result = RoundResult(
        round=k, promoted=promoted, status="promoted" if promoted else "refused", steps=steps,
        miou_old=old_miou, miou_new=new_miou, old_checkpoint=str(current), new_checkpoint=str(new),
        checkpoint=str(new if promoted else current), train_annotations=len(train_anns),
        train_pages=len({a.page_id for a in train_anns}), heldout_annotations=len(heldout_anns),
        new_annotations=len(new_anns), mean_clicks_new=float(np.mean(clicks)) if clicks else None,
        train_seconds=train_s, wall_seconds=time.time() - start, work_dir=str(work), log=str(job.log_path),
        per_kind_old=old_eval.get("per_kind", {}), per_kind_new=new_eval.get("per_kind", {}), exported_at=start)
    recorded = store.record_round(result.to_json())
    if recorded != k:   # another round was recorded meanwhile: keep the store's numbering
        result.round = recorded
    (work / "round.json").write_text(json.dumps(result.to_json(), indent=1))
    log.info("round %d: held-out mIoU %.4f -> %.4f, %s", result.round, old_miou, new_miou, result.status)
    return result
