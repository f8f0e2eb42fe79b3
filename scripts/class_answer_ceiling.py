"""Layout questions that name a text class: what the unit classifier's choice costs, and what the units cost.

`Predictor()` answers "the page number", "all section headings", "all code listings" with the page's
text units that its unit classifier names (`dociq.inference.class_answers`); the decoder's weights
play no part, so a randomly initialised model stands in for a checkpoint. For each such question the
evaluation asks (`dociq eval --prompts question`: the same pages, the same draw of up to eight
questions a page), three IoUs with the target:

- `answer`: the Predictor's mask, as `dociq eval` scores it;
- `right units`: the same units, chosen by their labels instead of the classifier — each unit has
  the class most of its words have (`fit_unit_classifier.unit_labels`); a question naming one region
  takes the best unit of its class, one naming several all of them;
- `units inside`: the units lying at least half inside the target (as snap_ceiling's).

`right units` − `answer` is what the classifier's choice costs; 100 − `right units` what the units
themselves cost (blocks split or merged, OCR boxes off the labels, words an OCR missed). With `--scan`,
the pages degraded and read by tesseract as `dociq eval --scan` reads them.

    python scripts/class_answer_ceiling.py --corpus data/corpus --split val --scan --ocr-cache outputs/ocr_cache/corpus_val
"""
from __future__ import annotations

import argparse
from collections import defaultdict
from typing import Iterable

import numpy as np
import torch

from dociq.data.collate import choose_questions
from dociq.data.masks import mask_iou
from dociq.data.schema import Page
from dociq.data.scoring import VAL_SEED
from dociq.evaluation.answers import page_seed, word_inputs
from dociq.inference.class_answers import named_class
from dociq.inference.snapping import page_slope
from fit_unit_classifier import CLASS_NAMES, unit_labels  # siblings: `python scripts/...` puts scripts/ on sys.path
from snap_ceiling import QUESTIONS_PER_PAGE, add_view_arguments, page_views, painted_units, units_inside

MEASURES = ("answer", "right units", "units inside")


def stand_in_predictor(image_size: int = 256):
    """A Predictor over a randomly initialised dociq-tiny: its class answers are the shipped model's."""
    from dociq.inference.predictor import Predictor
    from dociq.models.registry import build_model

    torch.manual_seed(0)
    return Predictor(build_model("dociq-tiny", image_size=image_size).eval(), image_size=image_size)


def right_units(painted: list[np.ndarray], labels: np.ndarray, label: str, one: bool,
                target: np.ndarray) -> np.ndarray:
    """bool [H, W]: the units labelled `label` — the one closest to the target when the question
    names one region, else all of them."""
    mine = [painted[k] for k in np.flatnonzero(labels == CLASS_NAMES.index(label))]
    if not mine:
        return np.zeros_like(target)
    if one:
        return max(mine, key=lambda m: mask_iou(m, target))
    return np.any(mine, 0)


def page_records(predictor, page: Page, seed: int = VAL_SEED) -> list[dict]:
    """One record per question naming a text class asked of `page`: its class and MEASURES."""
    generator = torch.Generator().manual_seed(page_seed(page, seed))
    questions = [page.questions[k] for k in choose_questions(page, QUESTIONS_PER_PAGE, generator)]
    questions = [q for q in questions if q.kind == "layout" and named_class(q.text)]
    if not questions or not len(page.words):
        return []
    predictor.set_image(page.image, **word_inputs(page))
    answers = predictor.predict(question=[q.text for q in questions])[0]
    state = predictor.page
    boxes = np.asarray(state.word_boxes, np.float64).reshape(-1, 4)
    units = state.text_units or []
    labels = unit_labels(page, units)
    slope = page_slope(state, boxes)
    painted = painted_units(page.size, boxes, units, slope)
    out = []
    for question, answer in zip(questions, answers):
        label, one = named_class(question.text)
        target = np.asarray(question.mask, bool)
        out.append({"class": label, "answer": mask_iou(answer, target),
                    "right units": mask_iou(right_units(painted, labels, label, one, target), target),
                    "units inside": mask_iou(units_inside(painted, target), target)})
    return out


def table(views: dict[str, Iterable[dict]]) -> str:
    """A markdown table: per view and class asked, the mean of each measure ×100 (and the count), then all."""
    lines = ["| pages | class asked | " + " | ".join(MEASURES) + " |", "|---|---|" + "---|" * len(MEASURES)]
    for view, records in views.items():
        records = list(records)
        by_class = defaultdict(list)
        for r in records:
            by_class[r["class"]].append(r)
        groups = sorted(by_class.items(), key=lambda kv: (-len(kv[1]), kv[0])) + [("all", records)]
        for name, rows in groups:
            cells = " | ".join(f"{100 * np.mean([r[m] for r in rows]):.1f}" for m in MEASURES)
            lines.append(f"| {view} | {name} ({len(rows)}) | {cells} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_view_arguments(p)
    args = p.parse_args(argv)
    views, count = page_views(args)
    predictor = stand_in_predictor()
    records = {view: [r for i in range(count) if data[i] is not None for r in page_records(predictor, data[i])]
               for view, data in views.items()}
    print(table(records))


if __name__ == "__main__":
    main()
