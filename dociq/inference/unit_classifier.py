"""The layout class of each text unit, from what a reader sees of it (`unit_features`).

Gradient-boosted trees fitted on the corpus's labelled training pages (scikit-learn's
`HistGradientBoostingClassifier`, `scripts/fit_unit_classifier.py`) and stored as plain arrays in
an `.npz`, so that the Predictor runs them with numpy alone and a file does not depend on the
scikit-learn version that wrote it. The package ships one (`DEFAULT_PATH`); it answers the layout
questions that name a text class (`dociq.inference.class_answers`). On held-out real pages it names
units' classes better than the model's word-class head does (docs/finetune.md, "Naming a unit's
class from what it looks like").
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from scipy.special import softmax

from dociq.data.schema import REGION_CLASSES
from dociq.inference.unit_features import FEATURE_NAMES, unit_features

DEFAULT_PATH = Path(__file__).parent / "assets" / "unit_classes.npz"
NOT_A_REGION = "none"      # the class of a unit that no labelled region holds


@dataclass(frozen=True)
class UnitClassifier:
    """Boosted trees as flat node arrays: tree t's root is node `roots[t]` and it adds to the raw
    score of class `tree_class[t]`; `baseline` [K] is the score every unit starts from; the
    probabilities are the softmax over `classes`."""
    classes: tuple[str, ...]     # K class names: REGION_CLASSES names or NOT_A_REGION
    features: tuple[str, ...]    # the feature names the trees were fitted on (FEATURE_NAMES)
    baseline: np.ndarray         # float64 [K]
    roots: np.ndarray            # int64 [T]
    tree_class: np.ndarray       # int64 [T]
    feature: np.ndarray          # int64 [M] node's feature (leaves: 0)
    threshold: np.ndarray        # float64 [M] go left when the feature is <= it
    missing_left: np.ndarray     # bool [M] where a NaN feature goes
    left: np.ndarray             # int64 [M] global node indices
    right: np.ndarray            # int64 [M]
    is_leaf: np.ndarray          # bool [M]
    value: np.ndarray            # float64 [M] a leaf's addition to its class's raw score

    def raw_scores(self, features: np.ndarray) -> np.ndarray:
        """float64 [U, K]: the class scores before the softmax of units' features [U, F]."""
        x = np.asarray(features, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != len(self.features):
            raise ValueError(f"unit features of shape {x.shape}: this classifier takes [units, {len(self.features)}] "
                             f"({', '.join(self.features)})")
        node = np.repeat(self.roots[:, None], len(x), 1)                     # [T, U]
        rows = np.arange(len(x))[None, :]
        while not self.is_leaf[node].all():
            value = x[rows, self.feature[node]]
            go_left = np.where(np.isnan(value), self.missing_left[node], value <= self.threshold[node])
            node = np.where(self.is_leaf[node], node, np.where(go_left, self.left[node], self.right[node]))
        out = np.repeat(self.baseline[None, :], len(x), 0)
        np.add.at(out.T, self.tree_class, self.value[node])
        return out

    def probabilities(self, features: np.ndarray) -> np.ndarray:
        """float64 [U, len(REGION_CLASSES)]: each unit's probability of every region class (a class
        the trees never saw gets 0; the rest, NOT_A_REGION, is left out)."""
        raw = softmax(self.raw_scores(features), axis=1)
        out = np.zeros((len(raw), len(REGION_CLASSES)))
        for k, name in enumerate(self.classes):
            if name in REGION_CLASSES:
                out[:, REGION_CLASSES.index(name)] = raw[:, k]
        return out

    def unit_probabilities(self, image: np.ndarray, word_boxes: np.ndarray, words: Sequence[str],
                           units: Sequence[Sequence[int]], ocr: bool = False) -> np.ndarray:
        """float64 [U, len(REGION_CLASSES)]: `probabilities` of the page's text units (`ocr`: the
        words are an OCR engine's, as `unit_features` takes it)."""
        return self.probabilities(unit_features(image, word_boxes, words, units, ocr=ocr))

    # ---- files ----------------------------------------------------------------------------------

    def save(self, path: str | Path) -> None:
        """Writes the arrays to `path` (.npz) through a temporary file beside it, so that a crash
        leaves the previous file whole."""
        path = Path(path)
        arrays = {k: getattr(self, k) for k in ("baseline", "roots", "tree_class", "feature", "threshold",
                                                 "missing_left", "left", "right", "is_leaf", "value")}
        partial = path.with_name(f".{path.name}.partial.npz")
        np.savez_compressed(partial, classes=np.array(self.classes), features=np.array(self.features), **arrays)
        os.replace(partial, path)

    @classmethod
    def load(cls, path: str | Path) -> "UnitClassifier":
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no unit classifier there; fit one with "
                                    "`python scripts/fit_unit_classifier.py --corpus DIR --out FILE.npz`")
        with np.load(path, allow_pickle=False) as f:
            fields = {k: f[k] for k in f.files}
        missing = set(cls.__dataclass_fields__) - set(fields)
        if missing:
            raise ValueError(f"{path}: not a unit classifier file (no {', '.join(sorted(missing))}); "
                             "fit one with `python scripts/fit_unit_classifier.py`")
        return cls(classes=tuple(str(c) for c in fields.pop("classes")),
                   features=tuple(str(c) for c in fields.pop("features")), **fields)

    @classmethod
    def from_sklearn(cls, model: Any, class_names: Sequence[str],
                     features: Sequence[str] = FEATURE_NAMES) -> "UnitClassifier":
        """The trees of a fitted multi-class `HistGradientBoostingClassifier` whose labels index
        `class_names`."""
        if getattr(model, "is_categorical_", None) is not None and np.any(model.is_categorical_):
            raise ValueError("categorical features are not supported: fit on numeric features only")
        nodes, roots, tree_class, offset = [], [], [], 0
        for per_class in model._predictors:                # one list per boosting iteration
            for k, tree in enumerate(per_class):
                roots.append(offset)
                tree_class.append(k)
                n = tree.nodes
                nodes.append((n, offset))
                offset += len(n)
        def cat(field, dtype, shift=False):
            return np.concatenate([(n[field].astype(dtype) + (o if shift else 0)) for n, o in nodes])
        leaf = cat("is_leaf", bool)
        return cls(classes=tuple(str(class_names[int(c)]) for c in model.classes_), features=tuple(features),
                   baseline=np.asarray(model._baseline_prediction, np.float64).reshape(-1),
                   roots=np.asarray(roots, np.int64), tree_class=np.asarray(tree_class, np.int64),
                   feature=np.where(leaf, 0, cat("feature_idx", np.int64)), threshold=cat("num_threshold", np.float64),
                   missing_left=cat("missing_go_to_left", bool), left=cat("left", np.int64, True),
                   right=cat("right", np.int64, True), is_leaf=leaf, value=cat("value", np.float64))


@lru_cache(maxsize=None)
def default_unit_classifier() -> UnitClassifier:
    """The classifier the package ships (`DEFAULT_PATH`), read once per process."""
    return UnitClassifier.load(DEFAULT_PATH)
