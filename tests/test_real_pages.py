"""scripts/real_pages.py on a 2-page PDF written here (no Debian package needed) and a random-weight
finetune checkpoint: the table, the reading words, the figure and the errors."""
from __future__ import annotations

import random
import re
import sys
from pathlib import Path

import pytest

from dociq.data.ocr import PdfTextLayer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
try:
    import real_pages
finally:
    sys.path.pop(0)

# (font size, x, baseline y, text) per page, in PDF points; "drawing" and "documents" repeat on
# page 1, so they must never be the named word there.
PAGES = [
    [(20, 40, 780, "Drawing Documents"),
     (11, 40, 740, "Reportlab draws documents with a canvas object."),
     (11, 40, 725, "Every drawing operation paints marks on the page."),
     (11, 40, 690, "Paragraphs flow into frames; tables hold cells."),
     (8, 280, 30, "page footer")],
    [(16, 40, 780, "Graphics Library"),
     (11, 40, 740, "Charts render wedges, bars and legends quickly."),
     (11, 40, 725, "Shapes group together inside a drawing widget.")],
]


@pytest.fixture(scope="module")
def files(tmp_path_factory, finetune_checkpoint, text_pdf):
    root = tmp_path_factory.mktemp("real_pages")
    ckpt = finetune_checkpoint[0]
    pdf = root / "manual.pdf"
    pdf.write_bytes(text_pdf(PAGES, width=595, height=842))
    return ckpt, pdf


def _occurrences(word: str, page_words: list[str]) -> int:
    return sum(re.sub(r"^\W+|\W+$", "", w).casefold() == word.casefold() for w in page_words)


def test_reading_words_are_unique_long_and_deterministic():
    words = ["Drawing", "drawing.", "the", "canvas,", "(object)", "tiny", "2024", "objects", "frames"]
    picks = real_pages.choose_reading_words(words, random.Random(0), n=5)
    # "drawing" twice; "object"/"objects" one edit apart (the collator would link both); short or digits
    assert sorted(w for _, w in picks) == ["canvas", "frames"]
    assert all(words[i].strip(",.()") == w for i, w in picks)
    assert picks == real_pages.choose_reading_words(words, random.Random(0), n=5)


def test_main_prints_one_row_per_page_and_question_and_writes_the_figure(files, tmp_path, capsys):
    ckpt, pdf = files
    out = tmp_path / "real.png"
    assert real_pages.main([str(ckpt), "--pdf", str(pdf), "--pages", "4", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    printed = capsys.readouterr().out
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in printed.splitlines()
            if line.startswith(f"| {pdf.stem} p.")]
    layer = PdfTextLayer()
    page_words = {f"{pdf.stem} p.{i + 1}": layer.words(pdf, i).words for i in range(len(PAGES))}
    assert sorted({r[0] for r in rows}) == sorted(page_words)       # 4 asked, the PDF has 2 pages
    for name in page_words:
        questions = [r[1] for r in rows if r[0] == name]
        reading = [q for q in questions if "mentions" in q]
        assert questions[:6] == real_pages.LAYOUT_QUESTIONS and len(reading) == 2
        assert len(questions) == 8
        for q in reading:
            word = re.search("\u201c(.+)\u201d", q).group(1)
            assert len(word) >= 5 and _occurrences(word, page_words[name]) == 1, (name, q)
    for r in rows:
        assert 0 <= float(r[2]) <= 100 and float(r[3]) == float(r[3])
        assert r[4] in (("yes", "no") if "mentions" in r[1] else ("",))
    assert "named words inside their mask" in printed


def test_question_replaces_the_defaults(files, tmp_path, capsys):
    ckpt, pdf = files
    real_pages.main([str(ckpt), "--pdf", str(pdf), "--pages", "1", "--out", str(tmp_path / "q.png"),
                     "--question", "the page footer", "--question", "which paragraph mentions \u201cwedges\u201d?"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| manual p.")]
    assert len(rows) == 2 and rows[1].rstrip(" |").endswith(("yes", "no"))   # "wedges" is on page 2


def test_missing_pdf_exits_2_naming_it(files, tmp_path, capsys):
    ckpt, _ = files
    missing = tmp_path / "nowhere.pdf"
    with pytest.raises(SystemExit) as exc:
        real_pages.main([str(ckpt), "--pdf", str(missing)])
    assert exc.value.code == 2 and str(missing) in capsys.readouterr().err


def test_no_default_pdf_names_the_apt_command(files, monkeypatch, capsys):
    monkeypatch.setattr(real_pages, "DEFAULT_PDF_GLOB", "/nonexistent/**/*.pdf")
    with pytest.raises(SystemExit) as exc:
        real_pages.main([str(files[0])])
    assert exc.value.code == 2 and "apt-get install -y python-reportlab-doc" in capsys.readouterr().err
