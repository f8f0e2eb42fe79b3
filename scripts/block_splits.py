"""Why held-out targets fall into several text blocks: the tests of `group_blocks` that kept their lines apart.

For each question the evaluation asks (`snap_ceiling` picks them the same way) of the `--kinds`
whose target is one region (reading and cell questions, by default: a layout question may ask for
every paragraph) and holds two or more of the page's words, the page's blocks as `Predictor()` groups them
(`text_blocks.page_blocks`); where two lines of the target that follow one another lie in different
blocks, which of `text_blocks.join_tests` the lower line fails against the upper one ("below",
"near", "height", "column", "not indented"), or whether it opens a list item or the upper line ends
a contents entry. A "below" between two pieces of one row (`group_lines` parted it at a gap) is
counted as "one row parted". A target's line that also holds words outside it counts as "line crosses the
target". With `--scan`, the pages degraded and read by tesseract as `dociq eval --scan` reads them.
`--regions CLASS` asks the same of every labelled region of a class instead (a code listing's lines).
No model is run.

    python scripts/block_splits.py --corpus data/corpus --split val --pages 80 --scan --ocr-cache outputs/ocr_cache/corpus_val
"""
from __future__ import annotations

import argparse
from collections import Counter

import numpy as np
import torch

from dociq.data.collate import choose_questions
from dociq.data.schema import Page
from dociq.data.scoring import VAL_SEED
from dociq.data.text_blocks import (LEADER_DOTS, drawn_bullets, group_lines, join_tests, leader_words, level_boxes,
                                    line_height, opens_list_item, page_blocks, skew_slope)
from dociq.evaluation.answers import page_seed
from snap_ceiling import add_view_arguments, page_views  # a sibling: `python scripts/...` puts scripts/ on sys.path

QUESTIONS_PER_PAGE = 8          # as the evaluation asks (dociq.evaluation.answers)


def _line_state(boxes: np.ndarray, line: list[int], ocr: bool) -> tuple[np.ndarray, float]:
    b = boxes[line]
    span = np.array([b[:, 0].min(), b[:, 1].min(), b[:, 2].max(), b[:, 3].max()])
    return span, (line_height(b) if ocr else float(span[3] - span[1]))


def _one_row(upper: np.ndarray, lower: np.ndarray) -> bool:
    """Whether two line extents share half the shorter one's height: one row that `group_lines`
    parted at a gap wider than its gutter rule allows, not two lines."""
    overlap = min(upper[3], lower[3]) - max(upper[1], lower[1])
    return bool(overlap >= 0.5 * min(upper[3] - upper[1], lower[3] - lower[1]))


def _targets(page: Page, seed: int, kinds: tuple[str, ...], region_class: str | None) -> list[tuple[str, np.ndarray]]:
    """(kind, bool [H, W] mask) of each target: the questions of `kinds` the evaluation asks of the
    page, or with `region_class` every labelled region of that class (its kind: the class)."""
    if region_class is not None:
        return [(r.label, np.asarray(r.mask, bool)) for r in page.regions if r.label == region_class]
    generator = torch.Generator().manual_seed(page_seed(page, seed))
    questions = [page.questions[k] for k in choose_questions(page, QUESTIONS_PER_PAGE, generator)]
    return [(q.kind, np.asarray(q.mask, bool)) for q in questions if q.kind in kinds]


def split_reasons(page: Page, seed: int = VAL_SEED, kinds: tuple[str, ...] = ("reading", "cell"),
                  region_class: str | None = None) -> list[dict]:
    """One record per question of `kinds` asked of `page` (or, with `region_class`, per labelled region
    of that class) whose target holds two or more words: its kind, the number of blocks its words lie
    in, and a Counter of why its consecutive lines were kept apart."""
    targets = _targets(page, seed, kinds, region_class)
    boxes = np.asarray(page.word_boxes, np.float64).reshape(-1, 4)
    if not targets or not len(boxes):
        return []
    words, ocr = list(page.words), page.word_confidences is not None
    slope = skew_slope(boxes)
    level = level_boxes(boxes, slope)
    block_of = np.full(len(boxes), -1)
    for k, ids in enumerate(page_blocks(page.image, boxes, words, slope, ocr=ocr)):
        block_of[ids] = k
    leaders = leader_words(words, len(boxes))
    bullets = drawn_bullets(page.image, boxes)
    lines = group_lines(level, marks=leaders)              # the lines page_blocks joins
    line_of = np.full(len(boxes), -1)
    for k, ids in enumerate(lines):
        line_of[ids] = k
    h, w = page.size
    centres = ((boxes[:, :2] + boxes[:, 2:]) / 2).astype(int)
    out = []
    for kind, mask in targets:
        inside = np.flatnonzero(mask[centres[:, 1].clip(0, h - 1), centres[:, 0].clip(0, w - 1)])
        if len(inside) < 2:
            continue
        reasons: Counter = Counter()
        own = sorted(set(line_of[inside]), key=lambda k: level[lines[k], 1].min())
        reasons["line crosses the target"] = sum(not set(lines[k]) <= set(inside) for k in own)
        for upper, lower in zip(own, own[1:]):
            if block_of[lines[upper][0]] == block_of[lines[lower][0]]:
                continue
            (prev, prev_height), (span, height) = _line_state(level, lines[upper], ocr), _line_state(level, lines[lower], ocr)
            opens = opens_list_item(words[lines[upper][0]]) or bool(bullets[lines[upper][0]])
            tests = join_tests(prev[None], np.array([prev_height]), span, height, prev_opens=np.array([opens]))
            failed = [name for name, passed in tests.items() if not passed[0]]
            if "below" in failed and _one_row(prev, span):
                failed[failed.index("below")] = "one row parted"
            if opens_list_item(words[lines[lower][0]]) or bool(bullets[lines[lower][0]]):
                failed.append("opens a list item")
            if int(leaders[lines[upper]].sum()) >= LEADER_DOTS:
                failed.append("ends a contents entry")
            reasons.update(failed or ["joined another block"])
        out.append({"kind": kind, "blocks": len(set(block_of[inside])), "reasons": reasons})
    return out


def table(views: dict[str, list[dict]]) -> str:
    """A markdown table: per view and question kind, the targets split into several blocks and the
    line pairs each reason kept apart."""
    names = sorted({name for records in views.values() for r in records for name in r["reasons"]})
    lines = ["| pages | questions | split | " + " | ".join(names) + " |", "|---|---|---|" + "---|" * len(names)]
    for view, records in views.items():
        for kind in sorted({r["kind"] for r in records}):
            rows = [r for r in records if r["kind"] == kind]
            total = sum((r["reasons"] for r in rows), Counter())
            split = sum(r["blocks"] > 1 for r in rows)
            lines.append(f"| {view} | {kind} ({len(rows)}) | {split} ({100 * split / len(rows):.0f} %) | "
                         + " | ".join(str(total[n]) for n in names) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_view_arguments(p)
    p.add_argument("--kinds", nargs="+", default=["reading", "cell"], help="the question kinds whose targets are one region")
    p.add_argument("--regions", default=None, metavar="CLASS",
                   help="instead of questions, every labelled region of this class (e.g. code)")
    args = p.parse_args(argv)

    views, count = page_views(args)
    print(table({view: [r for i in range(count) if data[i] is not None
                        for r in split_reasons(data[i], kinds=tuple(args.kinds), region_class=args.regions)]
                 for view, data in views.items()}))


if __name__ == "__main__":
    main()
