"""Fit the unit classifier (`dociq.inference.unit_classifier`) on a corpus's labelled training pages.

    python scripts/fit_unit_classifier.py --corpus data/corpus --synthetic 2000 --extra data/forms_train:all \
        --out dociq/inference/assets/unit_classes.npz --eval data/corpus:val --eval data/corpus_unseen:all

Every text unit of a page (`class_answers.text_units` of `text_blocks.page_blocks`: the units the
Predictor answers with) is labelled with the class most of its words have (a word's class is that
of the smallest labelled region holding it), or `none` when fewer than half of its words are in
a region; `unit_features` describes it. `--synthetic N` adds the units of N synthetic pages, drawn as
`data=corpus_mixed` draws them, whose forms teach the form classes a corpus of manuals lacks;
`--extra CORPUS:SPLIT` adds another corpus folder's pages (browser-printed forms:
scripts/make_form_pages.py). `--scanned CORPUS:SPLIT[:N]` adds a split's pages (N of them, spread
over its documents) scanned as `dociq eval --scan` scans a page (degraded, read by tesseract;
`--ocr-cache` keeps the readings), so the trees also learn units made of tesseract's words;
`--eval-scanned CORPUS:SPLIT` prints the unit accuracy on a split scanned the same way.
scikit-learn's HistGradientBoostingClassifier is fitted on
them (100 iterations of trees with 15 leaves, no early stopping), the
trees are stored as arrays, and the stored classifier is checked against scikit-learn's own
probabilities on the training units. `--eval CORPUS:SPLIT` prints the unit accuracy there.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from scipy.special import softmax

from dociq.data.collate import page_word_classes
from dociq.data.datasets.corpus.dataset import CorpusDocuments
from dociq.data.schema import REGION_CLASSES, Page
from dociq.data.scoring import VAL_SEED
from dociq.data.text_blocks import page_blocks, skew_slope
from dociq.inference.class_answers import text_units
from dociq.inference.unit_classifier import NOT_A_REGION, UnitClassifier
from dociq.inference.unit_features import FEATURE_NAMES, unit_features

CLASS_NAMES = REGION_CLASSES + (NOT_A_REGION,)
ITERATIONS, LEAVES, L2 = 100, 15, 1.0


def unit_labels(page: Page, units: list[list[int]]) -> np.ndarray:
    """int [U]: CLASS_NAMES index of each unit's class (the class most of its words have)."""
    per_word = page_word_classes(page)
    out = np.full(len(units), CLASS_NAMES.index(NOT_A_REGION), dtype=np.int64)
    for i, unit in enumerate(units):
        labelled = per_word[unit][per_word[unit] >= 0]
        if len(labelled) and 2 * len(labelled) >= len(unit):
            out[i] = np.bincount(labelled).argmax()
    return out


def page_units(pages) -> tuple[np.ndarray, np.ndarray]:
    """(features [U, F], labels [U]) of every text unit of the pages (a data set of `Page`s)."""
    features, labels = [np.zeros((0, len(FEATURE_NAMES)), np.float32)], [np.zeros(0, np.int64)]
    for i in range(len(pages)):
        page = pages[i]
        if page is None or not len(page.words):
            continue
        boxes = np.asarray(page.word_boxes, np.float64).reshape(-1, 4)
        slope = skew_slope(boxes)                       # as the Predictor finds a scan's units
        ocr = page.word_confidences is not None
        blocks = page_blocks(page.image, boxes, page.words, slope, ocr=ocr)
        units = text_units(blocks, boxes, page.words, slope)
        features.append(unit_features(page.image, boxes, page.words, units, ocr=ocr))
        labels.append(unit_labels(page, units))
    return np.concatenate(features), np.concatenate(labels)


def corpus_units(corpus: str, split: str, scan_seed: int | None = None, max_pages: int | None = None,
                 ocr_cache: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """`page_units` of a corpus split ("all": every page; `max_pages`: that many, spread over its
    documents), each page scanned as scan `scan_seed` of it (`dociq.data.scanned`) unless None."""
    pages = CorpusDocuments(root=corpus, split=None if split == "all" else split, max_pages=max_pages)
    if scan_seed is not None:
        from dociq.data.scanned import ScannedPages   # deferred: tesseract only when scanning
        pages = ScannedPages(pages, seed=scan_seed, cache_dir=ocr_cache)
    x, y = page_units(pages)
    if not len(y):
        raise SystemExit(f"{corpus} ({split}): no pages with words; build the corpus first (make corpus)")
    return x, y


def scanned_spec(spec: str) -> tuple[str, str, int | None]:
    """(corpus, split, pages or None: all) of a --scanned CORPUS:SPLIT[:N]."""
    head, _, last = spec.rpartition(":")
    if last.isdigit() and ":" in head:
        corpus, _, split = head.rpartition(":")
        return corpus, split, int(last)
    return head, last, None


def main() -> None:
    from sklearn.ensemble import HistGradientBoostingClassifier   # deferred: the training extra only

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", required=True, help="a corpus folder (dociq.corpus); its train split is fitted")
    parser.add_argument("--out", type=Path, required=True, help="the .npz to write")
    parser.add_argument("--synthetic", type=int, default=0, metavar="N",
                        help="also fit on N synthetic pages (drawn as data=corpus_mixed draws them): their forms "
                             "teach form labels and values, which the corpus has none of")
    parser.add_argument("--extra", action="append", default=[], metavar="CORPUS:SPLIT",
                        help="also fit on this corpus split (repeatable), e.g. data/forms_train:all")
    parser.add_argument("--scanned", action="append", default=[], metavar="CORPUS:SPLIT[:N]",
                        help="also fit on this corpus split (N of its pages) scanned and read by tesseract as "
                             "`dociq eval --scan` reads a page (repeatable), e.g. data/corpus:train:400")
    parser.add_argument("--ocr-cache", default=None, metavar="DIR",
                        help="keep tesseract's readings of scanned pages here (as dociq eval --ocr-cache)")
    parser.add_argument("--eval", action="append", default=[], metavar="CORPUS:SPLIT",
                        help="print the unit accuracy on this corpus split too (repeatable)")
    parser.add_argument("--eval-scanned", action="append", default=[], metavar="CORPUS:SPLIT",
                        help="print the unit accuracy on this corpus split scanned as `dociq eval --scan` scans it (repeatable)")
    args = parser.parse_args()
    start = time.time()
    x, y = corpus_units(args.corpus, "train")
    if args.synthetic:
        from dociq.data.synthetic.generator import SyntheticDocuments   # deferred: only with --synthetic
        xs, ys = page_units(SyntheticDocuments(args.synthetic, image_size=256, seed=0, degrade=0.3))
        x, y = np.concatenate([x, xs]), np.concatenate([y, ys])
    for spec in args.extra:
        corpus, _, split = spec.rpartition(":")
        xs, ys = corpus_units(corpus, split)
        x, y = np.concatenate([x, xs]), np.concatenate([y, ys])
    for corpus, split, max_pages in map(scanned_spec, args.scanned):   # scan seed 0: ocr_scanned_pages.py's
        xs, ys = corpus_units(corpus, split, 0, max_pages, args.ocr_cache)
        x, y = np.concatenate([x, xs]), np.concatenate([y, ys])
    print(f"{len(y)} training units in {time.time() - start:.0f} s; "
          + ", ".join(f"{CLASS_NAMES[c]} {n}" for c, n in zip(*np.unique(y, return_counts=True))))
    model = HistGradientBoostingClassifier(max_iter=ITERATIONS, max_leaf_nodes=LEAVES, l2_regularization=L2,
                                           early_stopping=False, random_state=0).fit(x, y)
    classifier = UnitClassifier.from_sklearn(model, CLASS_NAMES)
    gap = np.abs(softmax(classifier.raw_scores(x), axis=1) - model.predict_proba(x)).max()
    if gap > 1e-9:
        raise SystemExit(f"the stored trees' probabilities differ from scikit-learn's by {gap:.2e}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    classifier.save(args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB; {len(classifier.roots)} trees, "
          f"{len(classifier.value)} nodes); train accuracy {(model.predict(x) == y).mean():.3f}")
    for spec, scan_seed in [(s, None) for s in args.eval] + [(s, VAL_SEED) for s in args.eval_scanned]:
        corpus, _, split = spec.rpartition(":")
        xe, ye = corpus_units(corpus, split, scan_seed, ocr_cache=args.ocr_cache)
        labelled = ye != CLASS_NAMES.index(NOT_A_REGION)
        guess = np.asarray(model.classes_)[classifier.raw_scores(xe).argmax(1)]
        print(f"{spec}{'' if scan_seed is None else ' scanned'}: {len(ye)} units, accuracy {(guess == ye).mean():.3f}, "
              f"on units in a region {(guess[labelled] == ye[labelled]).mean():.3f}")


if __name__ == "__main__":
    main()
