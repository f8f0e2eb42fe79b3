"""COCO layout detection through the Predictor (DocLayNet / PubLayNet / `scripts/make_synthetic.py` folders):

    dociq eval CKPT --data coco --annotations DIR/annotations.json [--image-dir DIR/images]
               [--max-pages N] [--ocr groundtruth|tesseract|pdf] --json results.json

runs the automatic page segmenter (dociq.inference.automatic.PageSegmenter) on every page and scores its
regions with COCO mAP (dociq.evaluation.coco_map: bbox and segm, AP@[.5:.95], AP50, AP75, per class); the
segmenter's class names map to the file's category ids by name (case-insensitive, '-' / '_' / ' '
alike; `--category-map model_name=coco_name` adds others); regions of other classes are dropped
and counted per class. On the same embedded pages, each page's questions (the stored ones, or one
"segment every <category>" per category) are asked and scored as above: mIoU per question kind.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from dociq.data.datasets.coco import CocoDocuments
from dociq.data.scoring import SegmentationMetrics
from dociq.evaluation.coco_map import coco_map, load_coco
from dociq.inference.automatic import PageSegmenter, normalise_name, to_coco_results
from dociq.io.track import track


@torch.no_grad()
def evaluate_coco(predictor, annotations: str | Path, image_dir: str | Path | None = None,
                  max_pages: int | None = None, ocr: str = "groundtruth",
                  category_map: dict[str, str] | None = None, **segmenter_options) -> dict:
    """COCO mAP of the automatic segmenter's regions and per-kind mIoU of the pages' questions.

    -> {"bbox": {AP, AP50, AP75, ..., per_class}, "segm": {...}, "questions": {miou, miou_<kind>,
    count_<kind>, ...}, "pages", "skipped_pages", "regions", "dropped_regions": {class: count},
    "unmatched_categories": [COCO categories no model class maps to]}"""
    data = CocoDocuments(annotations, image_dir=image_dir, ocr=ocr, on_bad_sample="skip")
    gt = load_coco(annotations)
    segmenter = PageSegmenter(predictor, **segmenter_options)
    by_name = {normalise_name(c["name"]): c["id"] for c in gt.loadCats(gt.getCatIds())}
    category_ids = {name: by_name[normalise_name(name)] for name in segmenter.categories
                    if normalise_name(name) in by_name}
    for model_name, coco_name in (category_map or {}).items():
        if normalise_name(coco_name) not in by_name:
            raise ValueError(f"--category-map {model_name}={coco_name}: {coco_name!r} is not a category of "
                             f"{annotations} ({sorted(by_name)})")
        if model_name not in segmenter.categories:
            raise ValueError(f"--category-map {model_name}={coco_name}: {model_name!r} is not a class of the "
                             f"segmenter ({sorted(segmenter.categories)})")
        category_ids[model_name] = by_name[normalise_name(coco_name)]
    mapped = set(category_ids.values())
    unmatched = sorted(c["name"] for c in gt.loadCats(gt.getCatIds()) if c["id"] not in mapped)
    metrics = SegmentationMetrics()
    results, image_ids, dropped, skipped, found = [], [], {}, 0, 0
    pages = len(data) if max_pages is None else min(max_pages, len(data))
    for index in track(range(pages), desc="COCO pages"):
        page = data[index]
        if page is None:                               # a bad page: logged and listed by CocoDocuments
            skipped += 1
            continue
        image_id = page.meta["image_id"]
        regions = segmenter.segment(page.image, words=page.words, word_boxes=page.word_boxes)
        found += len(regions)
        for r in regions:
            if r.category not in category_ids:
                dropped[r.category] = dropped.get(r.category, 0) + 1
        results += to_coco_results(regions, image_id, category_ids)
        image_ids.append(image_id)
        if page.questions:                             # the page is still set: its embedding is reused
            masks, _scores, _low_res = predictor.predict_masks(question=[q.text for q in page.questions])
            targets = torch.from_numpy(np.stack([q.mask for q in page.questions]))
            metrics.update(torch.from_numpy(masks), targets, [q.kind for q in page.questions])
    if not image_ids:
        first = data.bad_samples[0] if data.bad_samples else None
        reason = f"; the first: {first.path}: {first.reason}" if first else ""
        raise ValueError(f"{annotations}: no page could be read ({skipped} skipped{reason}). Pages without "
                         "'words' need --ocr tesseract (or --ocr pdf with the PDFs beside the images)")
    scores = coco_map(gt, results, image_ids=image_ids)
    out = {t: {k: v for k, v in scores[t].items() if k != "summary"} for t in ("bbox", "segm")}
    return out | {"questions": metrics.results(), "pages": len(image_ids), "skipped_pages": skipped,
                  "regions": found, "results": len(results), "dropped_regions": dropped,
                  "unmatched_categories": unmatched}


def format_coco_table(results: dict[str, dict]) -> str:
    lines = ["| checkpoint | type | AP | AP50 | AP75 | per-class AP |", "|---|---|---|---|---|---|"]
    pct = lambda v: "-" if v is None else f"{100 * v:.1f}"                      # noqa: E731
    for ckpt, r in results.items():
        for t in ("bbox", "segm"):
            per_class = ", ".join(f"{n} {pct(c['AP'])}" for n, c in r[t]["per_class"].items() if c["AP"] is not None)
            lines.append(f"| {ckpt} | {t} | {pct(r[t]['AP'])} | {pct(r[t]['AP50'])} | {pct(r[t]['AP75'])} | "
                         f"{per_class} |")
    for ckpt, r in results.items():
        q = r["questions"]
        kinds = ", ".join(f"{k[5:]} {100 * v:.1f} (n={q.get('count_' + k[5:], '?')})"
                          for k, v in q.items() if k.startswith("miou_"))
        lines.append(f"\n{ckpt}: {r['pages']} pages ({r['skipped_pages']} skipped), {r['regions']} regions, "
                     f"{r['results']} scored; dropped (class not in the file): {r['dropped_regions'] or 'none'}; "
                     f"categories no class maps to: {r['unmatched_categories'] or 'none'}; question mIoU "
                     f"{100 * q.get('miou', float('nan')):.1f} ({kinds})")
    return "\n".join(lines)
