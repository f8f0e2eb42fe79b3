"""Real-page check: a stage=finetune checkpoint on born-digital PDF pages it never saw.

    python scripts/real_pages.py CKPT [--pdf FILE ...] [--pages 4] [--out real_pages.png] [--question Q ...]

Training and validation pages are synthetic; this shows what the model does on real ones. By
default the pages come from the ReportLab manuals of Debian's `python-reportlab-doc`
(`sudo apt-get install -y python-reportlab-doc`). `--pages` pages spread evenly through the
document(s) are rendered with their PDF text layer as the OCR words (`PdfTextLayer`), and asked
the layout questions below plus, per page, `--reading` questions "which paragraph mentions
“<word>”?" for words that match exactly one word of that page. `--question` replaces them all.

There is no ground truth, so the script prints what can be checked without one: each mask's
area, its predicted IoU and, for a reading question, whether the centre of the named word's box
lies inside the mask. The hit rate is printed next to the reading masks' mean area, the rate a
mask placed without reading would reach. The figure (one row per page, one panel per question)
outlines the named word so a reader can judge whether the mask is that word's paragraph.
"""
from __future__ import annotations

import argparse
import random
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DEFAULT_PDF_GLOB = "/usr/share/doc/python-reportlab-doc/**/*.pdf"
APT_HINT = "sudo apt-get install -y python-reportlab-doc"
LAYOUT_QUESTIONS = ["segment the title", "all section headings", "all paragraphs", "the page footer",
                    "segment the table", "segment the figure"]
# The template the synthetic reading questions use (dociq/data/synthetic/questions.py).
READING_TEMPLATE = "which paragraph mentions \u201c{}\u201d?"
_NAMED_WORD = re.compile(r"mentions\s+[\u201c\"'](.+?)[\u201d\"']")
MIN_LETTERS = 5


@dataclass
class RealPage:
    name: str                 # "<pdf stem> p.<1-based page>"
    image: np.ndarray         # uint8 [H, W, 3]
    words: list[str]
    boxes: np.ndarray         # float32 [N, 4] pixels of `image`


# ---- pages ---------------------------------------------------------------------------------

def default_pdfs() -> list[Path]:
    import glob

    return sorted(Path(p) for p in glob.glob(DEFAULT_PDF_GLOB, recursive=True))


def spread_pages(counts: list[int], n: int) -> list[tuple[int, int]]:
    """(document, page) of n pages at the centres of n equal slices of all documents' pages:
    deterministic, and it skips the cover and the last (index) page of a long manual."""
    total = sum(counts)
    n = min(n, total)                     # a short PDF: every page once
    picks = sorted({int((k + 0.5) * total / n) for k in range(n)})
    out, starts = [], np.cumsum([0, *counts])
    for g in picks:
        doc = int(np.searchsorted(starts, g, side="right") - 1)
        out.append((doc, g - int(starts[doc])))
    return out


def load_pages(pdfs: list[Path], n: int, dpi: float = 96.0) -> list[RealPage]:
    from dociq.data.ocr import PdfTextLayer
    from dociq.data.pdf import page_count

    layer = PdfTextLayer(dpi=dpi)
    pages = []
    for doc, index in spread_pages([page_count(p) for p in pdfs], n):
        image, words = layer.read(pdfs[doc], index)
        pages.append(RealPage(f"{pdfs[doc].stem} p.{index + 1}", image, list(words.words), words.boxes))
    return pages


# ---- questions -----------------------------------------------------------------------------

def _matches(word: str, words: list[str]) -> list[int]:
    """Indices of the page words the collator's lexical match links to `word` (exact, case or one
    edit): the word names one place on the page only if this is a single index."""
    from dociq.data.lexical import NO_MATCH, match_code

    return [i for i, w in enumerate(words) if match_code(word, w) != NO_MATCH]


def choose_reading_words(words: list[str], rng: random.Random, n: int = 1) -> list[tuple[int, str]]:
    """Up to n (index, word) of words of >= 5 letters that match exactly one word of the page."""
    from dociq.data.lexical import normalise

    candidates = sorted({(i, normalise(w)) for i, w in enumerate(words)
                         if normalise(w).isalpha() and len(normalise(w)) >= MIN_LETTERS})
    rng.shuffle(candidates)
    chosen = []
    for i, word in candidates:            # checked lazily: _matches scans the whole page
        if len(chosen) == n:
            break
        if _matches(word, words) == [i]:
            chosen.append((i, word))
    return chosen


def page_questions(page: RealPage, reading: int, seed: int) -> list[str]:
    # seeded by the page's name, so a page gets the same words whatever else is checked with it
    rng = random.Random(f"{seed}:{page.name}")
    return LAYOUT_QUESTIONS + [READING_TEMPLATE.format(w) for _, w in choose_reading_words(page.words, rng, reading)]


def named_word(question: str, words: list[str]) -> int | None:
    """Index of the page word a reading question names, if it names exactly one."""
    found = _NAMED_WORD.search(question)
    if not found:
        return None
    hits = _matches(found.group(1), words)
    return hits[0] if len(hits) == 1 else None


# ---- the check -----------------------------------------------------------------------------

def check_pages(predictor, pages: list[RealPage], questions: list[str] | None = None,
                reading: int = 2, seed: int = 0) -> list[dict]:
    """One row per (page, question): mask, predicted IoU, area and the named word's hit."""
    rows = []
    for page in pages:
        qs = list(questions) if questions else page_questions(page, reading, seed)
        masks, scores = predictor.predict(page.image, question=qs, words=page.words, word_boxes=page.boxes)
        for q, mask, score in zip(qs, masks, scores):
            row = {"page": page.name, "question": q, "mask": mask, "score": float(score),
                   "area": float(mask.mean()), "word": None, "word_box": None, "hit": None}
            i = named_word(q, page.words)
            if i is not None:
                box = page.boxes[i]
                cx = int(np.clip((box[0] + box[2]) / 2, 0, mask.shape[1] - 1))
                cy = int(np.clip((box[1] + box[3]) / 2, 0, mask.shape[0] - 1))
                row.update(word=page.words[i], word_box=box, hit=bool(mask[cy, cx]))
            rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    """A Markdown table the docs can quote, and the reading hit rate against its chance level."""
    lines = ["| page | question | mask % of page | predicted IoU | named word in mask |",
             "|---|---|---|---|---|"]
    for r in rows:
        hit = "" if r["hit"] is None else ("yes" if r["hit"] else "no")
        lines.append(f"| {r['page']} | {r['question'].replace('|', '/')} | {100 * r['area']:.1f} | "
                     f"{r['score']:.3f} | {hit} |")
    reading = [r for r in rows if r["hit"] is not None]
    if reading:
        hits = sum(r["hit"] for r in reading)
        chance = 100 * float(np.mean([r["area"] for r in reading]))
        lines.append(f"\nreading questions: {hits}/{len(reading)} named words inside their mask "
                     f"({100 * hits / len(reading):.0f}%); their masks cover {chance:.0f}% of the page "
                     "on average, the hit rate of a mask placed without reading")
    return "\n".join(lines)


def plot(pages: list[RealPage], rows: list[dict], out: Path, title: str = "") -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    from dociq.inference.overlay import overlay

    by_page = {p.name: [r for r in rows if r["page"] == p.name] for p in pages}
    cols = max(1, max(len(rs) for rs in by_page.values()))
    fig, axes = plt.subplots(len(pages), cols, figsize=(2.1 * cols, 3.4 * len(pages)), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for axes_row, page in zip(axes, pages):
        axes_row[0].axis("on")             # on for the page name in the y label; no ticks or frame
        axes_row[0].set_xticks([]), axes_row[0].set_yticks([])
        for spine in axes_row[0].spines.values():
            spine.set_visible(False)
        axes_row[0].set_ylabel(page.name, fontsize=9)
        for ax, r in zip(axes_row, by_page[page.name]):
            ax.imshow(overlay(page.image, r["mask"][None], alpha=0.5))
            label = f"pred IoU {r['score']:.2f}, {100 * r['area']:.0f}% of page"
            if r["word_box"] is not None:
                x0, y0, x1, y1 = r["word_box"]
                pad = 0.006 * max(page.image.shape[:2])    # a word is a few pixels tall at this scale
                ax.add_patch(Rectangle((x0 - pad, y0 - pad), x1 - x0 + 2 * pad, y1 - y0 + 2 * pad,
                                       fill=False, edgecolor="cyan", linewidth=1.6))
                label += "\nword " + ("inside" if r["hit"] else "outside") + " the mask"
            ax.set_title(textwrap.fill(r["question"], 30) + "\n" + label, fontsize=7)
    fig.suptitle(title + "red: predicted mask; cyan box: the word a reading question names", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a stage=finetune checkpoint")
    p.add_argument("--pdf", type=Path, action="append",
                   help=f"a born-digital PDF (repeat for several; default: {DEFAULT_PDF_GLOB})")
    p.add_argument("--pages", type=int, default=4, help="pages, spread evenly through the PDFs")
    p.add_argument("--out", type=Path, default=Path("real_pages.png"))
    p.add_argument("--question", action="append",
                   help="ask this instead of the default questions (repeat for several)")
    p.add_argument("--reading", type=int, default=2, help="reading questions per page (default questions)")
    p.add_argument("--seed", type=int, default=0, help="seed of the reading words")
    p.add_argument("--dpi", type=float, default=96.0, help="render resolution of the pages")
    args = p.parse_args(argv)

    pdfs = args.pdf or default_pdfs()
    if not pdfs:
        p.error(f"no PDF given and none found at {DEFAULT_PDF_GLOB}. Fix: `{APT_HINT}` "
                "(the ReportLab manuals), or pass --pdf FILE")
    for pdf in pdfs:
        if not pdf.is_file():
            p.error(f"PDF not found: {pdf}")
    if args.pages < 1:
        p.error("--pages must be >= 1")

    from dociq.data.errors import BadSampleError
    from dociq.inference.predictor import Predictor

    try:
        pages = load_pages(pdfs, args.pages, args.dpi)
        predictor = Predictor.from_checkpoint(args.checkpoint)
    except (BadSampleError, FileNotFoundError, ValueError, KeyError) as err:
        p.error(str(err))
    rows = check_pages(predictor, pages, args.question, args.reading, args.seed)
    print(table(rows))
    plot(pages, rows, args.out, f"{Path(args.checkpoint).name} on {len(pages)} real PDF pages it never saw\n")
    print(f"wrote {args.out} ({len(pages)} pages from {', '.join(pdf.name for pdf in pdfs)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
