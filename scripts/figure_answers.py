"""Questions that name figures ("segment the figure", "all figures") answered from the page's own
drawings, with no model: which pictures, at what size, on a corpus split.

    python scripts/figure_answers.py --corpus data/corpus --split val --dump outputs/rules/figures_val.pkl
    python scripts/figure_answers.py --load outputs/rules/figures_val.pkl        # the table again
    python scripts/figure_answers.py CKPT --corpus data/corpus_unseen --split all  # with the decoder's masks

Asks the questions `dociq eval --prompts question` asks (the same pages, the same draw of up to eight
questions a page), keeps those whose target is figures, and records the target and the page's
drawings (`word_snap.drawing_boxes`: ink off every word, pieces joined across a line's height) with
the share of each drawing's box that words cover. Then it prints mIoU x100 per package for each rule
(`dociq.inference.figure_answers.figure_answer` with its settings varied; a single figure is the
largest picture). With a checkpoint it also records the decoder's mask as the Predictor snaps it
without figure answers, and scores it, the Predictor's answer (the rule, the decoder's mask on a
page without a picture) and a variant where the decoder's mask chooses the single figure. The
detector's answer is scored by `dociq eval --baseline detector`.
"""
from __future__ import annotations

import numpy as np

from dociq.data.masks import mask_iou
from dociq.inference.figure_answers import FIGURE_TEXT, MIN_FIGURE_SHARE, figure_answer
from dociq.models.word_snap import text_shares
from rule_collections import pack, run, unpack  # a sibling: `python scripts/...` puts scripts/ on sys.path


def collect(checkpoint: str | None, corpus: str, split: str) -> list[dict]:
    # deferred: --load scores a saved collection without torch or a corpus reader
    import torch

    from dociq.data.collate import choose_questions
    from dociq.data.datasets.corpus.dataset import CorpusDocuments
    from dociq.data.scoring import VAL_SEED, layout_class
    from dociq.data.text_blocks import page_ink
    from dociq.evaluation.answers import page_seed
    from dociq.inference.figure_answers import picture_question
    from dociq.inference.predictor import load_predictor
    from dociq.models.word_snap import drawing_boxes

    predictor = load_predictor(checkpoint) if checkpoint else None
    if predictor is not None:
        predictor.class_answers = False          # the decoder's masks, snapped as the Predictor does
    pages = CorpusDocuments(root=corpus, split=None if split == "all" else split)
    rows = []
    for i in range(len(pages)):
        page = pages[i]
        if page is None:
            continue
        g = torch.Generator().manual_seed(page_seed(page, VAL_SEED))
        questions = [page.questions[k] for k in choose_questions(page, 8, g)]
        asked = [q for q in questions if layout_class(page, q) == "figure"]
        if not asked:
            continue
        word_boxes = np.asarray(page.word_boxes, np.float64).reshape(-1, 4)
        drawings = drawing_boxes(page_ink(page.image), word_boxes)
        decoder = [None] * len(asked)
        if predictor is not None:
            predictor.set_image(page.image, words=list(page.words), word_boxes=word_boxes)
            decoder = [pack(m) for m in predictor.predict(question=[q.text for q in asked])[0]]
        for q, mask in zip(asked, decoder):
            rows.append(dict(package=page.meta.get("package", ""), page_id=page.meta.get("page_id", ""),
                             text=q.text, one=picture_question(q.text)[1], target=pack(np.asarray(q.mask, bool)),
                             drawings=drawings, text_share=text_shares(drawings, word_boxes), decoder=mask))
        print(f"page {i + 1}/{len(pages)}: {len(rows)} figure questions", flush=True)
    return rows


def rule_answer(row: dict, shape, max_text: float, min_share: float, mode: str = "no model") -> np.ndarray:
    """The figure answer from the row's drawings under these settings. mode "no model": empty where
    no picture answers; "predictor": the decoder's mask there, as the Predictor does; "decoder
    chooses": the same, and a single figure is the picture the decoder's mask covers most."""
    pictures = row["drawings"][row["text_share"] < max_text]
    decoder = None if mode == "no model" else unpack(row["decoder"])
    out = figure_answer(shape, pictures, row["one"], min_share=min_share)
    if out is None:
        return np.zeros(shape, bool) if decoder is None else decoder
    if mode == "decoder chooses" and row["one"]:
        h, w = shape
        kept = [b for b in pictures if (b[2] - b[0]) * (b[3] - b[1]) >= min_share * h * w]
        covered = [decoder[y0:y1, x0:x1].sum() for x0, y0, x1, y1 in kept]
        if max(covered) > 0:
            x0, y0, x1, y1 = kept[int(np.argmax(covered))]
            out = np.zeros(shape, bool)
            out[y0:y1, x0:x1] = True
    return out


def rules(with_decoder: bool) -> dict[str, tuple | None]:
    out: dict[str, tuple | None] = {}
    if with_decoder:
        out["the decoder's mask (snapped)"] = None
        out[f"text < {FIGURE_TEXT}, at least {MIN_FIGURE_SHARE:.1%}, the largest (the Predictor's)"] = \
            (FIGURE_TEXT, MIN_FIGURE_SHARE, "predictor")
        out[f"text < {FIGURE_TEXT}, at least {MIN_FIGURE_SHARE:.1%}, the decoder's mask choosing one"] = \
            (FIGURE_TEXT, MIN_FIGURE_SHARE, "decoder chooses")
    out[f"text < {FIGURE_TEXT}, at least {MIN_FIGURE_SHARE:.1%} of the page, the largest (no model)"] = \
        (FIGURE_TEXT, MIN_FIGURE_SHARE, "no model")
    for max_text in (0.05, 0.15, 0.3, 0.4):
        for min_share in (0.002, 0.005, 0.01):
            if (max_text, min_share) != (FIGURE_TEXT, MIN_FIGURE_SHARE):
                out[f"text < {max_text}, at least {min_share:.1%} of the page"] = (max_text, min_share, "no model")
    return out


def table(rows: list[dict]) -> None:
    packages = sorted({r["package"] for r in rows})
    print(f"| rule | all ({len(rows)}) | " + " | ".join(
        f"{p} ({sum(r['package'] == p for r in rows)})" for p in packages) + " |")
    print("|" + "---|" * (len(packages) + 2))
    for name, rule in rules(all(r.get("decoder") is not None for r in rows)).items():
        v = np.array([mask_iou(unpack(r["decoder"]) if rule is None else rule_answer(r, t.shape, *rule), t)
                      for r in rows for t in [unpack(r["target"])]])
        cells = [f"{100 * v[[r['package'] == p for r in rows]].mean():.1f}" for p in packages]
        print(f"| {name} | {100 * v.mean():.1f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    run(__doc__.split("\n\n")[0], collect, table, needs_checkpoint=False,
        checkpoint_help="also score the decoder's masks and the Predictor's rule")
