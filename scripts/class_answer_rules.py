"""Layout questions that name a text class: which answer, the decoder's or the word-class head's, or a
mix of both, per class, on a corpus split (the Predictor itself names units with its unit classifier,
dociq.inference.class_answers; scripts/fit_unit_classifier.py measures that one).

    python scripts/class_answer_rules.py CKPT --corpus data/corpus --split val --dump outputs/rules/val.pkl
    python scripts/class_answer_rules.py --load outputs/rules/val.pkl          # the table again, no model

Asks the questions `dociq eval --prompts question` asks (the same pages, the same draw of up to eight
questions a page), keeps those that name a text class (code listings too), and for each records
the target, the decoder's mask as the Predictor snaps it without class answers, and the page's text units with the head's mean class
probability and the decoder's mean mask probability over each. Then it prints mIoU x100 per class for
each rule (the units are boxes, the answer their union, as the Predictor draws them).
"""
from __future__ import annotations

import numpy as np

from dociq.data.masks import mask_iou
from dociq.inference.class_answers import DRAWN_CLASSES, best_units

FRAMED = DRAWN_CLASSES + ("code",)   # classes a rule below leaves to the decoder's mask
from rule_collections import pack, run, unpack  # a sibling: `python scripts/...` puts scripts/ on sys.path

STRIDE = 4       # the decoder's probability over a unit is read at a quarter of the page's resolution


def _units_mask(shape, boxes: np.ndarray, chosen) -> np.ndarray:
    """bool [H, W]: the union of the chosen units' boxes, as `class_answer` draws them."""
    out = np.zeros(shape, bool)
    for i in chosen:
        x0, y0, x1, y1 = boxes[i].astype(int)
        out[y0:y1, x0:x1] = True
    return out


def collect(checkpoint: str, corpus: str, split: str) -> list[dict]:
    # deferred: --load scores a saved collection without torch, a corpus reader or a model
    import torch

    from dociq.data.collate import choose_questions
    from dociq.data.datasets.corpus.dataset import CorpusDocuments
    from dociq.data.scoring import VAL_SEED
    from dociq.evaluation.answers import page_seed
    from dociq.inference.class_answers import named_class, phrased_classes, text_units
    from dociq.inference.predictor import load_predictor
    from dociq.models.word_snap import pixel_boxes
    from dociq.data.schema import REGION_CLASSES

    # every class whose units are text, code listings too (the Predictor leaves them to the decoder)
    phrasings = phrased_classes(skip=DRAWN_CLASSES)
    predictor = load_predictor(checkpoint)
    predictor.class_answers = False
    pages = CorpusDocuments(root=corpus, split=None if split == "all" else split)
    rows = []
    for i in range(len(pages)):
        page = pages[i]
        if page is None:
            continue
        g = torch.Generator().manual_seed(page_seed(page, VAL_SEED))
        questions = [page.questions[k] for k in choose_questions(page, 8, g)]
        named = [(q, named_class(q.text, phrasings)) for q in questions if q.kind == "layout"]
        named = [(q, n) for q, n in named if n is not None]
        if not named:
            continue
        predictor.set_image(page.image, words=list(page.words), word_boxes=np.asarray(page.word_boxes))
        texts = [q.text for q, _ in named]
        snapped = predictor.predict(question=texts)[0]
        logits = predictor.predict(question=texts, return_logits=True)[0]
        probs = predictor.word_class_probabilities()
        state = predictor.page
        units = text_units(state.text_blocks, state.word_boxes, state.words, state.slope or 0.0)
        pixels = pixel_boxes(state.word_boxes, state.original_size)
        boxes = np.array([[*pixels[u, :2].min(0), *pixels[u, 2:].max(0)] for u in units]).reshape(-1, 4)
        read = probs.sum(1) > 0
        head = np.array([probs[u][read[u]].mean(0) if read[u].any() else np.full(len(REGION_CLASSES), -1.0)
                         for u in units]).reshape(-1, len(REGION_CLASSES))
        for k, (q, (label, one)) in enumerate(named):
            p = 1 / (1 + np.exp(-logits[k][::STRIDE, ::STRIDE]))
            dec = snapped[k][::STRIDE, ::STRIDE]
            cover = [(float(p[y0:max(y1, y0 + 1), x0:max(x1, x0 + 1)].mean()),
                      float(dec[y0:max(y1, y0 + 1), x0:max(x1, x0 + 1)].mean()))
                     for x0, y0, x1, y1 in (boxes // STRIDE).astype(int)]
            rows.append(dict(package=page.meta.get("package", ""), label=label, one=one, text=q.text,
                             target=pack(np.asarray(q.mask, bool)), decoder=pack(snapped[k]), boxes=boxes,
                             head=head[:, REGION_CLASSES.index(label)] if len(head) else np.zeros(0),
                             prob=np.array([c[0] for c in cover]), cover=np.array([c[1] for c in cover])))
        print(f"page {i + 1}/{len(pages)}: {len(rows)} questions", flush=True)
    return rows


def _touching(decoder: np.ndarray, answer: np.ndarray) -> np.ndarray:
    """The decoder's mask parts that overlap `answer`."""
    from scipy import ndimage

    parts, _ = ndimage.label(decoder)
    hit = np.unique(parts[answer & (parts > 0)])
    return np.isin(parts, hit[hit > 0])


def _inside_target(row: dict, share: float) -> list[int]:
    target = unpack(row["target"])
    return [i for i, (x0, y0, x1, y1) in enumerate(row["boxes"].astype(int))
            if target[y0:max(y1, y0 + 1), x0:max(x1, x0 + 1)].mean() > share]


# rule -> (units chosen from a row, whether the decoder's parts touching them are added); None: the decoder's mask
RULES = {
    "decoder": None,
    "head, every class": (lambda r: best_units(r["head"], r["one"]), False),
    "head, code listings from the decoder":
        (lambda r: [] if r["label"] in FRAMED else best_units(r["head"], r["one"]), False),
    "0.7 head + 0.3 decoder probability": (lambda r: best_units(0.7 * np.clip(r["head"], 0, None) + 0.3 * r["prob"], r["one"]), False),
    "head, with the decoder's parts it touches": (lambda r: best_units(r["head"], r["one"]), True),
    "head, the decoder's when the best unit is under 0.1":
        (lambda r: best_units(r["head"], r["one"]) if len(r["head"]) and r["head"].max() >= 0.1 else [], False),
    "the units at least 30 % inside the target (an oracle)": (lambda r: _inside_target(r, 0.3), False),
}


def answer(rule, row: dict, target_shape) -> np.ndarray:
    decoder = unpack(row["decoder"])
    if rule is None:
        return decoder
    choose, touching = rule
    chosen = choose(row)
    if not chosen:
        return decoder
    out = _units_mask(target_shape, row["boxes"], chosen)
    return out | _touching(decoder, out) if touching else out


def table(rows: list[dict]) -> None:
    labels = sorted({r["label"] for r in rows})
    scores = {name: np.array([mask_iou(answer(rule, r, (t := unpack(r["target"])).shape), t) for r in rows])
              for name, rule in RULES.items()}
    print(f"| rule | all ({len(rows)}) | " + " | ".join(
        f"{lab} ({sum(r['label'] == lab for r in rows)})" for lab in labels) + " |")
    print("|" + "---|" * (len(labels) + 2))
    for name, v in scores.items():
        cells = [f"{100 * v[[r['label'] == lab for r in rows]].mean():.1f}" for lab in labels]
        print(f"| {name} | {100 * v.mean():.1f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    run(__doc__.split("\n\n")[0], collect, table, needs_checkpoint=True)
