"""Model folders in the Hugging Face layout: a stage=finetune checkpoint as a self-contained folder.

    <dir>/config.json                 the model config, image size, OCR/lexical-match switches, tokenizers
    <dir>/model.safetensors           the SegmentationModel's weights (safetensors: no pickle)
    <dir>/ocr_tokenizer/              the OCR WordPiece tokenizer (vocab.txt, tokenizer.json, ...)
    <dir>/question_tokenizer/         open_clip's BPE merges the question tokenizer reads
    <dir>/README.md                   model card: training config, metrics, how to load

    dociq export outputs/finetune/runs/<run>/checkpoints/last.ckpt models/dociq-tiny   # dociq/cli/export.py
    from dociq.inference.model_folder import DociqSegmenter
    segmenter = DociqSegmenter.from_pretrained("models/dociq-tiny")      # nn.Module, .model is the SegmentationModel
    from dociq.inference.predictor import Predictor
    predictor = Predictor.from_pretrained("models/dociq-tiny")           # = predictor_from_pretrained there

Saving and loading go through huggingface_hub's `PyTorchModelHubMixin` (config.json from the
constructor's arguments, weights with safetensors' `save_model`/`load_model`, which handle tied
tensors); this module adds the tokenizer files, the model card and checks that turn a wrong folder
into a ValueError naming the folder and the fix. Loading reads only local files and safetensors.
It knows nothing of the Predictor: `dociq.inference.predictor` builds one from what it loads.
docs/model_folders.md describes the folder and how to push it to the hub.
"""
from __future__ import annotations

import copy
import csv
import hashlib
import json
import math
import os
import re
import shutil
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import torch
from huggingface_hub import PyTorchModelHubMixin
from huggingface_hub import constants as hf_constants
from safetensors import SafetensorError
from safetensors.torch import load_model
from torch import nn

from dociq.data.tokenize import OcrTokenizer, QuestionTokenizer, default_vocab_dir
from dociq.io.atomic import atomic_folder
from dociq.io.checkpoint import CheckpointError, model_state_dict, read_finetune_checkpoint
from dociq.models.sizes import IncompleteModelConfig, ModelConfigError, check_model_config, checkpoint_model_config


LIBRARY_NAME = "dociq"
FOLDER_FORMAT = 1                       # bump when the folder layout changes incompatibly
CONFIG_NAME = hf_constants.CONFIG_NAME                      # config.json
WEIGHTS_NAME = hf_constants.SAFETENSORS_SINGLE_FILE         # model.safetensors
OCR_TOKENIZER_DIR = "ocr_tokenizer"
QUESTION_TOKENIZER_DIR = "question_tokenizer"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
DEFAULT_MAX_QUESTION_WORDS = 12         # content words per question matched against the OCR words (Predictor's default)
EXPORT_HINT = "export a stage=finetune checkpoint with `dociq export CKPT DIR`"

MODEL_CARD_TEMPLATE = """---
{{ card_data }}
---

# {{ title }}

A promptable document segmentation model trained with dociq (`stage=finetune`): a page image, its OCR words and prompts (questions, points, boxes) in, one
mask per prompt out.

- Exported from: `{{ source }}`{% if step is not none %} (training step {{ step }}){% endif %}
- Input: pages resized to {{ image_size }} px on the longest side; OCR words {{ 'used' if ocr else 'not used (layout-only model)' }}
- Files: `config.json`, `model.safetensors`, `ocr_tokenizer/`, `question_tokenizer/` (everything loads offline)

## How to load

```python
from dociq.inference.predictor import predictor_from_pretrained
predictor = predictor_from_pretrained("{{ folder }}")      # offline, safetensors only
masks, scores = predictor.predict("page.png", question=["the page footer"], ocr="tesseract")
```

or the bare `nn.Module`: `from dociq.inference.model_folder import DociqSegmenter; DociqSegmenter.from_pretrained("{{ folder }}").model`.

## Metrics

{{ metrics }}

## Training config

The checkpoint's hyper-parameters (the `task` arguments of the run):

```yaml
{{ hyper_parameters }}```
{% if hydra_config %}
The run's full Hydra config (`.hydra/config.yaml`):

```yaml
{{ hydra_config }}```
{% endif %}"""


def _folder_error(folder: Path | str, problem: str, fix: str) -> ValueError:
    return ValueError(f"model folder {folder}: {problem}. Fix: {fix}")


class DociqSegmenter(nn.Module, PyTorchModelHubMixin, library_name=LIBRARY_NAME, license="apache-2.0",
                     tags=["dociq", "document-segmentation", "promptable-segmentation", "image-segmentation"],
                     pipeline_tag="image-segmentation", model_card_template=MODEL_CARD_TEMPLATE):
    """The SegmentationModel plus what the Predictor needs to run it as it was trained.

    The constructor's arguments are the folder's config.json (the mixin records them); the
    weights are `self.model`'s, saved under the same `model.` keys as the Lightning checkpoint."""

    def __init__(self, model: dict, image_size: int, ocr: bool = True, lexical_match: bool = True,
                 max_question_words: int = DEFAULT_MAX_QUESTION_WORDS, ocr_tokenizer: dict | None = None,
                 question_tokenizer: dict | None = None) -> None:
        # deferred: dociq.models imports timm, open_clip and transformers (`dociq export` of a wrong path fails fast)
        from dociq.models.segmenter import SegmentationModel

        super().__init__()
        self.model_config = dict(model)
        self.model = SegmentationModel.from_config(model)
        self.image_size = int(image_size)
        self.ocr = bool(ocr)
        self.lexical_match = bool(lexical_match)
        self.max_question_words = int(max_question_words)
        self.ocr_tokenizer = dict(ocr_tokenizer or {"folder": OCR_TOKENIZER_DIR})
        question_encoder = self.model.prompt_encoder.question_encoder
        if question_tokenizer is None and question_encoder is not None:   # the installed open_clip's BPE
            question_tokenizer = {"library": "open_clip", "class": "open_clip.tokenizer.SimpleTokenizer",
                                  "context_length": int(question_encoder.context_length),
                                  "folder": QUESTION_TOKENIZER_DIR, "bpe_file": _open_clip_bpe().name,
                                  "bpe_sha256": _sha256(_open_clip_bpe())}
        self.question_tokenizer = dict(question_tokenizer or {})
        # Where the tokenizer files come from when this module is saved: the package defaults for a
        # model built from a checkpoint, the folder's own copies for a model loaded from a folder.
        self.ocr_vocab_source: Path | None = None
        self.question_bpe_source: Path | None = None
        self.model_card_text: str | None = None   # the folder's README.md: re-saving / push_to_hub keep it

    def hub_config(self) -> dict:
        """What config.json holds: the constructor's arguments (as this module has them) plus the
        library name and folder format, so a loader can tell a dociq folder from another library's."""
        return {"library_name": LIBRARY_NAME, "dociq_folder_format": FOLDER_FORMAT, "model": self.model_config,
                "image_size": self.image_size, "ocr": self.ocr, "lexical_match": self.lexical_match,
                "max_question_words": self.max_question_words, "ocr_tokenizer": self.ocr_tokenizer,
                "question_tokenizer": self.question_tokenizer or None}

    # ---- saving ------------------------------------------------------------------------------

    def save_pretrained(self, save_directory: str | Path, *, config: dict | None = None, **kwargs) -> str | None:
        """The mixin's save_pretrained with config.json = `hub_config()` (also what push_to_hub writes)."""
        return super().save_pretrained(save_directory, config=config or self.hub_config(), **kwargs)

    def generate_model_card(self, *args, **kwargs):
        """The card of the folder this module was loaded from (with its metrics), unless card
        arguments are given (export gives them)."""
        from huggingface_hub import ModelCard

        if self.model_card_text and not args and not kwargs:
            return ModelCard(self.model_card_text)
        return super().generate_model_card(*args, **kwargs)

    def _save_pretrained(self, save_directory: Path) -> None:
        super()._save_pretrained(save_directory)          # model.safetensors via safetensors.torch.save_model
        self._save_ocr_tokenizer(save_directory / OCR_TOKENIZER_DIR)
        if self.question_tokenizer:
            target = save_directory / QUESTION_TOKENIZER_DIR / self.question_tokenizer["bpe_file"]
            target.parent.mkdir(parents=True, exist_ok=True)
            _copy(Path(self.question_bpe_source or _open_clip_bpe()), target)

    def _save_ocr_tokenizer(self, target: Path) -> None:
        source = Path(self.ocr_vocab_source or default_vocab_dir())
        if not (source / "vocab.txt").is_file():
            raise FileNotFoundError(f"OCR tokenizer folder {source} has no vocab.txt: set data.tokenizer.vocab_dir "
                                    "to a Hugging Face tokenizer folder (with vocab.txt), or leave it null")
        target.mkdir(parents=True, exist_ok=True)
        # Copy the files as they are (no re-serialisation by transformers): the exported tokenizer is the
        # one the model was trained with, byte for byte.
        for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if (source / name).is_file():
                _copy(source / name, target / name)

    # ---- loading -----------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | Path, *, map_location: str = "cpu",
                        **kwargs) -> "DociqSegmenter":
        """A local dociq model folder -> the module with its weights (strict: every weight must be there).

        Only local folders are read here: fetch a hub repository first (`huggingface_hub.snapshot_download`)
        and pass its folder, so loading never reaches the network."""
        folder = Path(pretrained_model_name_or_path)
        config = check_model_folder(folder)
        kwargs.setdefault("local_files_only", True)
        try:
            segmenter = super().from_pretrained(folder, map_location=map_location, strict=True, **kwargs)
        except (RuntimeError, SafetensorError) as err:   # missing / unexpected / mis-shaped weights, bad file
            raise _weights_error(folder, err) from err
        segmenter.ocr_vocab_source = folder / OCR_TOKENIZER_DIR
        card = folder / "README.md"
        segmenter.model_card_text = card.read_text(encoding="utf-8") if card.is_file() else None
        if segmenter.question_tokenizer:
            segmenter.question_bpe_source = folder / QUESTION_TOKENIZER_DIR / config["question_tokenizer"]["bpe_file"]
        return segmenter

    @classmethod
    def _from_pretrained(cls, *, model_id: str, map_location: str = "cpu", strict: bool = True, **model_kwargs):
        """The mixin's local-folder path without its print and its pickle fallback: model.safetensors only."""
        for key in ("revision", "cache_dir", "force_download", "local_files_only", "token"):
            model_kwargs.pop(key, None)
        try:
            model = cls(**model_kwargs)
        except (KeyError, TypeError, ValueError) as err:   # an edited or foreign model config
            raise _folder_error(model_id, f"{CONFIG_NAME} describes a model dociq cannot build "
                                f"({type(err).__name__}: {' '.join(str(err).split())[:300]})",
                                f"restore the exported {CONFIG_NAME}, or {EXPORT_HINT} again") from err
        # what the mixin's loader does, through safetensors' public API
        load_model(model, os.path.join(model_id, WEIGHTS_NAME), strict=strict, device=map_location)
        return model.eval()


def _copy(source: Path, target: Path) -> None:
    if not (target.exists() and target.samefile(source)):     # re-saving into the folder it came from
        shutil.copyfile(source, target)


def _weights_error(folder: Path, err: RuntimeError) -> ValueError:
    text = " ".join(str(err).split())
    missing = re.search(r"Missing key\(s\) in state_dict: (.*?)\.?(?: Unexpected|$)", text)
    if missing:
        keys = [k.strip(' "\'') for k in missing.group(1).split(",") if k.strip()]
        problem = f"{WEIGHTS_NAME} lacks {len(keys)} weights of the model described by {CONFIG_NAME} " \
                  f"(e.g. {', '.join(keys[:3])})"
    else:
        problem = f"{WEIGHTS_NAME} does not match the model described by {CONFIG_NAME} ({text[:300]})"
    return _folder_error(folder, problem, f"the folder's files come from different models or a copy was cut "
                         f"short: {EXPORT_HINT} again (or copy the whole folder again)")


def check_model_folder(folder: Path) -> dict:
    """The folder's config.json after checking that the folder is a complete dociq model folder
    whose model config is complete (an older one names `dociq convert-checkpoint`)."""
    config = read_folder_config(folder)
    try:
        check_model_config(config["model"])
    except IncompleteModelConfig as err:
        raise _folder_error(folder, f"{CONFIG_NAME}'s {err.problem}", f"convert the folder once with "
                            f"`dociq convert-checkpoint {folder} NEW_FOLDER` and use NEW_FOLDER") from err
    except ModelConfigError as err:
        raise _folder_error(folder, f"{CONFIG_NAME} describes a model dociq cannot build ({err.problem})",
                            f"restore the exported {CONFIG_NAME}, or {EXPORT_HINT} again") from err
    return config


def read_folder_config(folder: Path) -> dict:
    """The folder's config.json after checking that the folder holds every file of a dociq model
    folder (its model config is not checked)."""
    if not folder.exists():
        raise _folder_error(folder, "does not exist", f"give the folder written by export ({EXPORT_HINT}); for a "
                            "hub repository, download it first with huggingface_hub.snapshot_download(repo_id) "
                            "and give the folder it returns")
    if not folder.is_dir():
        hint = "this is a Lightning checkpoint: " if folder.suffix in PICKLE_SUFFIXES else ""
        raise _folder_error(folder, "is a file, not a folder", f"{hint}{EXPORT_HINT}, then give DIR")
    for name in (CONFIG_NAME, WEIGHTS_NAME):
        if not (folder / name).is_file():
            pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)[:3]
            held = f" (it holds {', '.join(pickles)}; pickled weights are not loaded)" if pickles else ""
            raise _folder_error(folder, f"has no {name}{held}", EXPORT_HINT)
    try:
        config = json.loads((folder / CONFIG_NAME).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise _folder_error(folder, f"{CONFIG_NAME} is not valid JSON ({err})", EXPORT_HINT) from err
    if not isinstance(config, dict) or config.get("library_name") != LIBRARY_NAME:
        other = config.get("library_name") or config.get("model_type") or config.get("architectures") \
            if isinstance(config, dict) else type(config).__name__
        what = f" (it describes {other!r})" if other else ""
        raise _folder_error(folder, f"{CONFIG_NAME} is not a dociq model config{what}",
                            f"give a folder exported by dociq; {EXPORT_HINT}")
    if int(config.get("dociq_folder_format", 0)) > FOLDER_FORMAT:
        raise _folder_error(folder, f"was written in folder format {config['dociq_folder_format']}, newer than this "
                            f"dociq reads ({FOLDER_FORMAT})", "upgrade dociq")
    missing = [k for k in ("model", "image_size") if k not in config]
    if missing:
        raise _folder_error(folder, f"{CONFIG_NAME} lacks {', '.join(missing)}", EXPORT_HINT)
    if not (folder / OCR_TOKENIZER_DIR / "vocab.txt").is_file():
        raise _folder_error(folder, f"has no {OCR_TOKENIZER_DIR}/vocab.txt (the OCR tokenizer)",
                            f"copy the whole folder again, or {EXPORT_HINT}")
    question = config.get("question_tokenizer") or {}
    if question:
        bpe = folder / QUESTION_TOKENIZER_DIR / str(question.get("bpe_file", ""))
        if not bpe.is_file():
            raise _folder_error(folder, f"has no {QUESTION_TOKENIZER_DIR}/{question.get('bpe_file')} (the question "
                                "tokenizer)", f"copy the whole folder again, or {EXPORT_HINT}")
        if question.get("bpe_sha256") and _sha256(bpe) != question["bpe_sha256"]:
            raise _folder_error(folder, f"{QUESTION_TOKENIZER_DIR}/{bpe.name} is not the file {CONFIG_NAME} names "
                                "(its sha256 differs): questions would be tokenized differently than in training",
                                f"copy the whole folder again, or {EXPORT_HINT}")
    return config


# ---- the question tokenizer read from the folder ---------------------------------------------

def _open_clip_bpe() -> Path:
    from open_clip.tokenizer import default_bpe

    return Path(default_bpe())


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@lru_cache(maxsize=4)
def _simple_tokenizer(bpe_path: str):
    from open_clip.tokenizer import SimpleTokenizer

    return SimpleTokenizer(bpe_path=bpe_path)


def folder_question_tokenizer(bpe_path: Path, context_length: int):
    """A `dociq.data.tokenize.QuestionTokenizer` that reads the folder's BPE merges instead of the ones
    in the installed open_clip (the same SimpleTokenizer, so the same ids when the files are equal)."""
    class FolderQuestionTokenizer(QuestionTokenizer):
        def __call__(self, texts: list[str]) -> torch.Tensor:
            if not texts:
                return torch.zeros(0, self.context_length, dtype=torch.long)
            return _simple_tokenizer(str(bpe_path))(texts, context_length=self.context_length)

    return FolderQuestionTokenizer(context_length)


# ---- checkpoint -> folder --------------------------------------------------------------------

def _plain(value: Any) -> Any:
    """A JSON-able copy of a config (tuples -> lists, mappings -> dicts), or a TypeError naming the key."""
    return json.loads(json.dumps(value, default=lambda v: dict(v) if isinstance(v, Mapping) else _unjsonable(v)))


def _unjsonable(value: Any):
    raise TypeError(f"{type(value).__name__} {value!r} cannot be written to config.json")


def without_file_paths(model_cfg: dict) -> dict:
    """Drop `checkpoint_path` entries: they loaded weights at the start of training that the folder's
    model.safetensors already holds, and the files need not exist where the folder is loaded."""
    cfg = copy.deepcopy(model_cfg)

    def visit(node):
        if isinstance(node, dict):
            for key in list(node):
                if key == "checkpoint_path":
                    node[key] = None
                else:
                    visit(node[key])
    visit(cfg)
    return cfg


def _run_folder(ckpt_path: Path) -> Path | None:
    """<run>/checkpoints/<name>.ckpt -> <run> (the Hydra output folder), else None."""
    return ckpt_path.parent.parent if ckpt_path.parent.name == "checkpoints" else None


def _read_hydra_config(run: Path | None) -> str | None:
    """The text of the run's `.hydra/config.yaml` (interpolations unresolved), or None. Read as
    plain YAML: exporting needs no Hydra or OmegaConf (the lean install)."""
    if run is None or not (run / ".hydra" / "config.yaml").is_file():
        return None
    return (run / ".hydra" / "config.yaml").read_text(encoding="utf-8")


_REFERENCE = re.compile(r"^\$\{([\w.]+)\}$")


def _hydra_value(hydra: str | None, key: str, default: Any) -> Any:
    """`key` of the run's config text; `${other.key}` is followed, an interpolation through a
    resolver (train.py's own, e.g. `${div:a,b}`) counts as absent."""
    if hydra is None:
        return default
    import yaml

    config = yaml.safe_load(hydra) or {}
    for _ in range(8):                                   # references to references, not cycles
        value: Any = config
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        reference = _REFERENCE.match(value) if isinstance(value, str) else None
        if reference is None:
            break
        key = reference.group(1)
    if value is None or (isinstance(value, str) and "${" in value):
        return default
    return value


def _number(value: Any) -> float | None:
    try:
        out = float(value.item() if torch.is_tensor(value) else value)
    except (TypeError, ValueError, RuntimeError):
        return None
    return out if math.isfinite(out) else None


def checkpoint_metrics(ckpt: Mapping[str, Any], run: Path | None) -> tuple[dict[str, float], list[str]]:
    """val/* metrics of the checkpoint: the last logged value of each val/* column of the run's
    metrics.csv up to the checkpoint's step, and ModelCheckpoint's best/current score of its monitor.
    -> (metrics, where they came from)."""
    metrics: dict[str, float] = {}
    sources = []
    step = ckpt.get("global_step")
    csv_files = sorted(run.glob("csv/**/metrics.csv")) + sorted(run.glob("*/metrics.csv")) if run else []
    if csv_files:
        path = csv_files[0]
        with open(path, newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                row_step = _number(row.get("step"))
                if step is not None and row_step is not None and row_step > step:
                    continue
                for key, value in row.items():
                    number = _number(value) if key and key.startswith("val/") and value not in (None, "") else None
                    if number is not None:
                        metrics[key] = number
        sources.append(f"{path.relative_to(run)} (last value of each val/ column"
                       f"{'' if step is None else f' up to step {step}'})")
    for name, state in (ckpt.get("callbacks") or {}).items():
        if str(name).startswith("ModelCheckpoint") and isinstance(state, Mapping) and state.get("monitor"):
            monitor = state["monitor"]
            best = _number(state.get("best_model_score"))
            current = _number(state.get("current_score"))
            if best is not None:
                metrics[f"{monitor} (best checkpoint)"] = best
            if current is not None:
                metrics.setdefault(monitor, current)
            sources.append("the checkpoint's ModelCheckpoint state")
    return metrics, sources


def _metrics_markdown(metrics: dict[str, float], sources: list[str]) -> str:
    if not metrics:
        return "No validation metrics were found (the checkpoint holds no ModelCheckpoint score and the run " \
               "folder no csv/metrics.csv)."
    rows = "\n".join(f"| {k} | {v:.4f} |" for k, v in sorted(metrics.items()))
    return f"| metric | value |\n|---|---|\n{rows}\n\nFrom {' and '.join(sources)}."


def _yaml(data: Any) -> str:
    import yaml

    return yaml.safe_dump(_plain(data), sort_keys=False, default_flow_style=False)


def segmenter_from_checkpoint(ckpt_path: str | Path) -> tuple["DociqSegmenter", dict]:
    """A stage=finetune Lightning checkpoint -> (DociqSegmenter with its weights, the checkpoint dict).
    The Predictor settings are the ones `Predictor.from_checkpoint` uses; the OCR tokenizer and the
    question-word budget come from the run's Hydra config (data.tokenizer, data.max_question_words)
    when the run folder has one, else from the defaults the Predictor uses."""
    path = Path(ckpt_path)
    ckpt = read_finetune_checkpoint(path)
    hparams = ckpt["hyper_parameters"]
    hydra = _read_hydra_config(_run_folder(path))
    vocab_dir = _hydra_value(hydra, "data.tokenizer.vocab_dir", None)
    if vocab_dir is not None and not Path(vocab_dir).is_dir():
        raise FileNotFoundError(f"the run's .hydra/config.yaml sets data.tokenizer.vocab_dir={vocab_dir}, which does "
                                f"not exist from {Path.cwd()}: run the export from the directory training ran in, "
                                "or copy that tokenizer folder there")
    max_length = _hydra_value(hydra, "data.tokenizer.max_length", None)
    ocr_tokenizer = OcrTokenizer(vocab_dir=vocab_dir, **({} if max_length is None else {"max_length": int(max_length)}))
    max_question_words = int(_hydra_value(hydra, "data.max_question_words", DEFAULT_MAX_QUESTION_WORDS))
    model_cfg = without_file_paths(_plain(checkpoint_model_config(hparams["model"], path)))
    segmenter = DociqSegmenter(
        model=model_cfg, image_size=int(model_cfg["image_size"]), ocr=bool(hparams.get("ocr", True)),
        lexical_match=bool(hparams.get("lexical_match", True)),
        max_question_words=max_question_words,
        ocr_tokenizer={"folder": OCR_TOKENIZER_DIR, "max_length": ocr_tokenizer.max_length,
                       "vocab_size": ocr_tokenizer.vocab_size})
    segmenter.ocr_vocab_source = Path(ocr_tokenizer.vocab_dir)
    model_vocab = segmenter.model.text_encoder.vocab_size
    if ocr_tokenizer.vocab_size > model_vocab:   # a checkpoint trained with another vocabulary than this one
        raise CheckpointError(path, f"was trained with an OCR vocabulary of at most {model_vocab} ids, but the OCR "
                              f"tokenizer {ocr_tokenizer.vocab_dir} has {ocr_tokenizer.vocab_size}",
                              "export from the run folder (<run>/checkpoints/...) so its .hydra/config.yaml names "
                              "the tokenizer (data.tokenizer.vocab_dir)")
    state = model_state_dict(ckpt["state_dict"])
    result = segmenter.model.load_state_dict(state, strict=False)
    if result.missing_keys:
        raise CheckpointError(path, f"lacks {len(result.missing_keys)} weights of the segmentation model (e.g. "
                              f"{result.missing_keys[:3]})", "give the checkpoint of a `python train.py "
                              "stage=finetune` run")
    return segmenter.eval(), ckpt


def _is_dociq_folder(folder: Path) -> bool:
    try:
        return json.loads((folder / CONFIG_NAME).read_text(encoding="utf-8")).get("library_name") == LIBRARY_NAME
    except (OSError, ValueError, AttributeError):
        return False


def export_checkpoint(ckpt_path: str | Path, out_dir: str | Path, overwrite: bool = False) -> Path:
    """A stage=finetune Lightning checkpoint -> a model folder (see the module doc). The folder is
    written next to `out_dir` under a temporary name and renamed into place when complete."""
    ckpt_path, out_dir = Path(ckpt_path), Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        if not overwrite:
            raise ValueError(f"output folder {out_dir} already exists and is not empty: give a new folder "
                             "(or --overwrite to replace an earlier export)")
        if not _is_dociq_folder(out_dir):
            raise ValueError(f"output folder {out_dir} is not an earlier dociq export (no dociq {CONFIG_NAME}); "
                             "refusing to replace it: give a new folder")
    segmenter, ckpt = segmenter_from_checkpoint(ckpt_path)
    run = _run_folder(ckpt_path)
    metrics, sources = checkpoint_metrics(ckpt, run)
    hydra = _read_hydra_config(run)
    card = {"title": out_dir.name, "source": str(ckpt_path), "step": ckpt.get("global_step"),
            "image_size": segmenter.image_size, "ocr": segmenter.ocr, "folder": f"path/to/{out_dir.name}",
            "metrics": _metrics_markdown(metrics, sources),
            "hyper_parameters": _yaml(ckpt["hyper_parameters"]),
            "hydra_config": hydra or ""}
    with atomic_folder(out_dir) as tmp:
        segmenter.save_pretrained(tmp, model_card_kwargs=card)
    return out_dir


def folder_ocr_tokenizer(folder: str | Path, segmenter: DociqSegmenter) -> OcrTokenizer:
    """The OCR tokenizer of a model folder `segmenter` was loaded from (its ocr_tokenizer/ files)."""
    return OcrTokenizer(vocab_dir=Path(folder) / OCR_TOKENIZER_DIR,
                        **({"max_length": int(segmenter.ocr_tokenizer["max_length"])}
                           if segmenter.ocr_tokenizer.get("max_length") else {}))


def folder_question_tokenizer_of(folder: str | Path, segmenter: DociqSegmenter, context_length: int):
    """The question tokenizer of a model folder whose model has a question tower (the folder's BPE
    merges), or a ValueError when its config.json names none."""
    if not segmenter.question_tokenizer:
        raise _folder_error(Path(folder), f"the model has a question tower but {CONFIG_NAME} names no "
                            "question_tokenizer", EXPORT_HINT)
    return folder_question_tokenizer(segmenter.question_bpe_source, context_length)
