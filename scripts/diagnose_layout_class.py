"""Why the layout questions of one class fail, through the Predictor: per question, the IoU of the
decoder's mask and of the default (blocks) mask, how much of the target the decoder's mask covers,
how large it is against the target and where it lies, and what the word-class head says of the
target's words (its probability of the class, and whether they are the page's likeliest words for it).

    python scripts/diagnose_layout_class.py CKPT --corpus data/corpus --split val --classes page_number [--show 14]

Every layout question of the split whose first region has one of `--classes` is asked (not the
sample `dociq eval` draws), so the counts differ slightly from `dociq eval`'s per-class rows.
"""
from __future__ import annotations

import argparse
from collections import Counter, defaultdict

import numpy as np

from dociq.data.datasets.corpus.dataset import CorpusDocuments
from dociq.data.masks import mask_iou
from dociq.data.schema import REGION_CLASSES
from dociq.inference.predictor import load_predictor


def diagnose(predictor, pages, classes) -> dict[str, list[dict]]:
    rows: dict[str, list[dict]] = defaultdict(list)
    for page in pages:
        questions = [q for q in page.questions if q.kind == "layout" and q.region_ids
                     and page.regions[q.region_ids[0]].label in classes]
        if not questions:
            continue
        predictor.set_image(page.image, words=page.words, word_boxes=page.word_boxes)
        probs = predictor.word_class_probabilities()
        height = page.size[0]
        for q in questions:
            label = page.regions[q.region_ids[0]].label
            target_words = sorted({w for r in q.region_ids for w in page.regions[r].word_ids})
            with predictor.snapping(None):
                raw = predictor.predict(question=[q.text])[0][0]
            blocks = predictor.predict(question=[q.text])[0][0]
            p_class = probs[:, REGION_CLASSES.index(label)]
            p_target = float(p_class[target_words].max()) if target_words else 0.0
            ys = np.nonzero(raw)[0]
            rows[label].append(dict(
                raw=mask_iou(raw, q.mask), blocks=mask_iou(blocks, q.mask),
                covered=float((raw & q.mask).sum() / max(q.mask.sum(), 1)),
                area=float(raw.sum() / max(q.mask.sum(), 1)),
                mask_y=float(ys.mean() / height) if len(ys) else -1.0,
                target_y=float(np.nonzero(q.mask)[0].mean() / height),
                p_target=p_target, top_word=bool(target_words) and int((p_class > p_target).sum()) == 0,
                head_says=REGION_CLASSES[int(probs[target_words[0]].argmax())] if target_words else "-",
                words=[page.words[w] for w in target_words[:4]], question=q.text,
                package=str(page.meta.get("package", ""))))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--corpus", default="data/corpus")
    parser.add_argument("--split", default="val")
    parser.add_argument("--classes", nargs="+", default=["page_number"], choices=REGION_CLASSES)
    parser.add_argument("--show", type=int, default=14, help="questions printed per class")
    args = parser.parse_args()
    predictor = load_predictor(args.checkpoint)
    pages = CorpusDocuments(args.corpus, split=args.split)
    for label, rows in diagnose(predictor, (pages[i] for i in range(len(pages))), args.classes).items():
        col = lambda key: np.array([r[key] for r in rows], float)   # noqa: E731
        print(f"== {label}: {len(rows)} questions; decoder's mask {col('raw').mean():.3f}, blocks "
              f"{col('blocks').mean():.3f}; target over half covered {(col('covered') > .5).mean():.2f}; "
              f"median mask / target area {np.median(col('area')):.1f}")
        print(f"   word-class head: median p(target) {np.median(col('p_target')):.2f}; target words the page's "
              f"likeliest for the class {col('top_word').mean():.2f}; its argmax at the target "
              f"{Counter(r['head_says'] for r in rows).most_common(4)}")
        for r in rows[:args.show]:
            print(f"   {r['package'][:16]:16s} raw {r['raw']:.2f} blocks {r['blocks']:.2f} covered {r['covered']:.2f} "
                  f"area {r['area']:7.1f} mask y {r['mask_y']:.2f} target y {r['target_y']:.2f} "
                  f"p {r['p_target']:.2f} {r['words']} | {r['question']}")


if __name__ == "__main__":
    main()
