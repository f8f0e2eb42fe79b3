"""One click -> region: which of the Predictor's candidate masks to return, on a corpus split.

    python scripts/click_choice_rules.py CKPT --corpus data/corpus --split val --dump outputs/rules/clicks_val.pkl
    python scripts/click_choice_rules.py --load outputs/rules/clicks_val.pkl        # the table again, no model

Asks the clicks `dociq eval --prompts point_region` asks (the same pages, regions and click
positions), and for each records the target, the Predictor's answer as a user gets it (its chosen
mask, snapped), its three candidates (`multimask_output=True`, snapped the same way) with their
predicted IoUs. Then it prints mIoU x100 by region size for each rule that picks one candidate
(the answer's own, the highest predicted IoU, the smallest not empty — the Predictor's default,
`snapping.innermost_candidate` —, the largest, the best: SAM's oracle).
"""
from __future__ import annotations

import numpy as np

from dociq.data.masks import mask_iou
from dociq.inference.snapping import innermost_candidate
from rule_collections import pack, run, unpack  # a sibling: `python scripts/...` puts scripts/ on sys.path


def collect(checkpoint: str, corpus: str, split: str) -> list[dict]:
    # deferred: --load scores a saved collection without torch, a corpus reader or a model
    import torch

    from dociq.data.collate import choose_questions
    from dociq.data.datasets.corpus.dataset import CorpusDocuments
    from dociq.data.scoring import VAL_SEED, regions_as_prompts
    from dociq.evaluation.answers import one_click_each, page_seed
    from dociq.inference.predictor import load_predictor

    predictor = load_predictor(checkpoint)
    pages = CorpusDocuments(root=corpus, split=None if split == "all" else split)
    rows = []
    for i in range(len(pages)):
        page = pages[i]
        if page is None:
            continue
        g = torch.Generator().manual_seed(page_seed(page, VAL_SEED))
        choose_questions(page, 8, g)                          # the draw `dociq eval` makes first
        regions = regions_as_prompts(page, 8, VAL_SEED).questions
        if not regions:
            continue
        targets = [r.mask for r in regions]
        clicks = one_click_each(targets, g)
        labels = np.ones(clicks.shape[:2], np.int64)
        predictor.set_image(page.image, words=list(page.words), word_boxes=np.asarray(page.word_boxes))
        chosen = predictor.predict(points=clicks, point_labels=labels)[0]
        candidates, scores, _ = predictor.predict(points=clicks, point_labels=labels, multimask_output=True)
        for k, region in enumerate(regions):
            rows.append(dict(package=page.meta.get("package", ""), size=region.kind, label=region.text,
                             target=pack(np.asarray(region.mask, bool)), chosen=pack(chosen[k]),
                             candidates=[pack(c) for c in candidates[k]], scores=np.asarray(scores[k])))
        print(f"page {i + 1}/{len(pages)}: {len(rows)} clicks", flush=True)
    return rows


def _pick(rule: str, row: dict, candidates: list[np.ndarray], target: np.ndarray) -> np.ndarray:
    if rule == "the Predictor's answer":
        return unpack(row["chosen"])
    if rule == "highest predicted IoU":
        return candidates[int(np.argmax(row["scores"]))]
    if rule == "the smallest not empty (the innermost)":
        return innermost_candidate(np.stack(candidates)[None], row["scores"][None], np.zeros((1, len(candidates), 1, 1)))[0][0]
    areas = [c.sum() for c in candidates]
    if rule == "largest":
        return candidates[int(np.argmax(areas))]
    if rule == "the best (oracle)":
        return candidates[int(np.argmax([mask_iou(c, target) for c in candidates]))]
    raise ValueError(rule)


RULES = ("the Predictor's answer", "highest predicted IoU", "the smallest not empty (the innermost)", "largest",
         "the best (oracle)")


def table(rows: list[dict]) -> None:
    groups = {"all": [True] * len(rows)}
    groups.update({s: [r["size"] == s for r in rows] for s in ("small", "medium", "large")})
    groups.update({lab: [r["label"] == lab for r in rows]
                   for lab in sorted({r["label"] for r in rows}, key=lambda lab: -sum(r["label"] == lab for r in rows))[:8]})
    scores = {rule: [] for rule in RULES}
    for r in rows:
        target, candidates = unpack(r["target"]), [unpack(c) for c in r["candidates"]]
        for rule in RULES:
            scores[rule].append(mask_iou(_pick(rule, r, candidates, target), target))
    print("| rule | " + " | ".join(f"{g} ({sum(m)})" for g, m in groups.items()) + " |")
    print("|" + "---|" * (len(groups) + 1))
    for rule, v in scores.items():
        v = np.array(v)
        print(f"| {rule} | " + " | ".join(f"{100 * v[np.array(m)].mean():.1f}" for m in groups.values()) + " |")


if __name__ == "__main__":
    run(__doc__.split("\n\n")[0], collect, table, needs_checkpoint=True)
