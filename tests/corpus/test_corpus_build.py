"""`dociq corpus build` end to end on a folder the test writes: good PDFs, every kind of bad input,
HTML printed by Chromium, near-duplicates across documents, and a killed build that resumes."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from dociq.corpus.build import BuildSettings, build_corpus, split_of
from dociq.data.datasets.corpus.dataset import CorpusDocuments
from dociq.corpus.label_document import LabelSettings
from pdfs import encrypted_pdf, manual_pages, write_pdf

HAS_CHROMIUM = any(shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome"))
HAS_TESSERACT = shutil.which("tesseract") is not None

HTML = """<!doctype html><html><head><meta charset="utf-8"><title>Field guide</title></head><body>
<h1>Field guide to printed pages</h1>
<p>Printed manuals carry headings, paragraphs, lists and tables, and each of them answers a
different question a reader may ask about the page in front of them.</p>
<h2>Lists</h2><ul><li>First point about the lists of a page</li><li>Second point with more words</li></ul>
<h2>Tables</h2><table><tr><th>Package</th><th>Pages</th></tr><tr><td>alpha</td><td>12</td></tr>
<tr><td>beta</td><td>30</td></tr></table>
<pre><code>def label(page):
    return regions(page)</code></pre>
<p>Closing paragraph that explains what the corpus builder does with pages it cannot read.</p>
""" + "".join(f"<p>Paragraph {k} adds running text about page {k}, so the page holds what a real "
              "manual page holds: sentences that wrap over several lines of the printed column.</p>"
              for k in range(12)) + """
</body></html>"""


def _image_only_pdf(path: Path) -> None:
    image = Image.new("RGB", (1240, 1754), "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.truetype("DejaVuSans.ttf", 40) if _has_font("DejaVuSans.ttf") else None
    for k in range(12):
        draw.text((120, 160 + 90 * k), f"Scanned line number {k} of a page without text", fill="black", font=font)
    image.save(path, "PDF", resolution=150)


def _has_font(name: str) -> bool:
    try:
        ImageFont.truetype(name, 10)
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    (src / "manuals").mkdir()
    for v in range(4):
        (src / "manuals" / f"manual{v}.pdf").write_bytes(write_pdf(manual_pages(3, variant=v)))
    # the same manual again under another name: every page is a near-duplicate
    (src / "manuals" / "manual0-copy.pdf").write_bytes(write_pdf(manual_pages(3, variant=0)))
    bad = src / "bad"
    bad.mkdir()
    (bad / "broken.pdf").write_bytes(b"%PDF-1.4\nnot a pdf")
    (bad / "empty.pdf").write_bytes(write_pdf([]))
    (bad / "locked.pdf").write_bytes(encrypted_pdf())
    _image_only_pdf(bad / "scan.pdf")
    return src


def _settings(**kw) -> BuildSettings:
    kw = {"val_fraction": 0.3, "shard_pages": 2, **kw}
    return BuildSettings(label=LabelSettings(min_words=5, page_size=512, max_pages_per_doc=3), **kw)


@pytest.fixture(scope="module")
def built(source, tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus") / "out"
    summary = build_corpus(source, out, _settings(), workers=1, progress=lambda *_: None)
    return out, summary


def test_build_counts_every_bad_input_by_reason(built):
    _, summary = built
    bad = summary["bad_documents"]
    assert bad.get("broken") == 1 and bad.get("encrypted") == 1 and bad.get("zero_pages") == 1
    assert summary["dropped_pages"].get("near_duplicate") == 3


def test_pages_without_a_text_layer_are_read_by_tesseract_or_counted(built):
    out, _ = built
    pages = [CorpusDocuments(out, split=None)[i] for i in range(len(CorpusDocuments(out, split=None)))]
    scans = [p for p in pages if p.meta["doc_id"] == "bad/scan.pdf"]
    if HAS_TESSERACT:
        assert len(scans) == 1 and scans[0].meta["text_layer"] == "tesseract"
        assert "Scanned" in scans[0].words and scans[0].regions
    else:
        assert scans == []


def test_built_pages_read_back_with_document_splits(built):
    out, summary = built
    train, val = CorpusDocuments(out, split="train"), CorpusDocuments(out, split="val")
    # of the two identical manuals the one built first ("-copy" sorts first) keeps its pages
    manuals = ["manuals/manual0-copy.pdf"] + [f"manuals/manual{v}.pdf" for v in range(1, 4)]
    expected = {d: split_of(d, 0.3) for d in manuals}
    seen: dict[str, set] = {}
    for split, ds in (("train", train), ("val", val)) if len(val) else (("train", train),):
        for i in range(len(ds)):
            page = ds[i]
            seen.setdefault(page.meta["doc_id"], set()).add(split)
            assert page.image.shape[:2] == page.size and max(page.size) == 512
            assert page.regions and page.questions and len(page.words) == len(page.word_boxes)
    for doc in manuals:
        assert seen[doc] == {expected[doc]}, "a document's pages are all in one split"
    assert "manuals/manual0.pdf" not in seen
    assert summary["pages"] == sum(len(ds) for ds in (train, val))


def test_a_second_build_redoes_nothing(built, source):
    out, summary = built
    before = sorted(p.name for p in (out / "shards").iterdir())
    again = build_corpus(source, out, _settings(), workers=1, progress=lambda *_: None)
    assert sorted(p.name for p in (out / "shards").iterdir()) == before
    assert again["pages"] == summary["pages"]


def test_other_settings_on_the_same_folder_are_refused(built, source):
    out, _ = built
    with pytest.raises(ValueError, match="page_size"):
        build_corpus(source, out, BuildSettings(label=LabelSettings(page_size=640)), workers=1,
                     progress=lambda *_: None)


def test_missing_or_empty_source_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such folder"):
        build_corpus(tmp_path / "nope", tmp_path / "out", _settings(), workers=1)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no PDF, HTML"):
        build_corpus(tmp_path / "empty", tmp_path / "out", _settings(), workers=1)


@pytest.mark.skipif(not HAS_CHROMIUM, reason="Chromium prints HTML (apt-get install chromium)")
def test_html_is_printed_to_a_tagged_pdf_and_labelled_from_its_tags(tmp_path):
    src = tmp_path / "src" / "site"
    src.mkdir(parents=True)
    (src / "guide.html").write_text(HTML)
    # a file named .html that is not HTML (a binary saved under the wrong name)
    (src / "binary.html").write_bytes(b"\x89PNG\x00\x00\x00" + b"word " * 600)
    summary = build_corpus(tmp_path / "src", tmp_path / "out", _settings(print_timeout_s=5.0, val_fraction=0.0),
                           workers=1, progress=lambda *_: None)
    assert summary["bad_documents"] == {"print_failed": 1}
    ds = CorpusDocuments(tmp_path / "out", split="train")
    assert len(ds) >= 1
    page = ds[0]
    assert page.meta["labeller"].startswith("tags")
    labels = {r.label for r in page.regions}
    assert {"title", "section_heading", "paragraph", "list_item", "table", "table_cell"} <= labels
    title = next(r for r in page.regions if r.label == "title")
    assert title.text == "Field guide to printed pages"


def test_a_killed_build_resumes_without_redoing_or_corrupting(source, tmp_path):
    out, reference = tmp_path / "killed", tmp_path / "reference"
    cmd = [sys.executable, "-m", "dociq.cli", "corpus", "build", str(source), str(out), "--workers", "1",
           "--shard-pages", "1", "--max-pages-per-doc", "3", "--page-size", "512", "--val-fraction", "0.3"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                            start_new_session=True)
    deadline = time.time() + 120
    try:
        while time.time() < deadline and proc.poll() is None:
            if (out / "shards").is_dir() and any(not p.name.endswith(".tmp") for p in (out / "shards").iterdir()):
                break
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    committed = sorted(p.name for p in (out / "shards").iterdir() if not p.name.endswith(".tmp"))
    assert committed, "the build committed a shard before it was killed"
    assert not (out / "corpus.json").exists()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env, timeout=300)
    subprocess.run(cmd[:5] + [str(source), str(reference)] + cmd[7:], check=True, stdout=subprocess.DEVNULL,
                   env=env, timeout=300)
    resumed, fresh = (json.loads((d / "corpus.json").read_text()) for d in (out, reference))
    assert resumed["pages"] == fresh["pages"]
    for split in fresh["splits"]:
        assert (resumed["splits"][split]["pages"], resumed["splits"][split]["documents"]) == (
            fresh["splits"][split]["pages"], fresh["splits"][split]["documents"])
    assert not any(p.name.endswith(".tmp") for p in (out / "shards").iterdir())
    for split in ("train", "val"):
        a, b = CorpusDocuments(out, split=split), CorpusDocuments(reference, split=split)
        assert [a.page_meta(i)["page_id"] for i in range(len(a))] == [b.page_meta(i)["page_id"] for i in range(len(b))]
        if len(a):
            np.testing.assert_array_equal(a[len(a) - 1].image, b[len(b) - 1].image)


SMALL_RUN = ["model.image_size=128", "trainer.max_steps=2", "trainer.val_check_interval=2",
             "trainer.limit_val_batches=1", "data.batch_size=2", "data.num_workers=0",
             "data.tokenizer.max_length=48", "++model.fusion.depth=1", "optim.scheduler.warmup_steps=1",
             "logger=csv", "trainer.enable_progress_bar=false"]


@pytest.mark.parametrize("stage, data, extra", [
    ("pretrain", "corpus", ["++model.predictor.depth=1", "data.image_masking.num_targets=2",
                            "data.image_masking.target_scale=[0.25,0.3]", "data.image_masking.min_keep=1"]),
    ("finetune", "corpus_mixed", ["data.train_set.datasets.1.num_pages=8"]),
])
def test_train_py_trains_on_a_built_corpus(built, tmp_path, stage, data, extra):
    """`data=corpus` and `data=corpus_mixed` as a user composes them: a few steps, finite losses."""
    from omegaconf import open_dict

    from dociq.training.config import compose
    from dociq.training.train import train

    out, _ = built
    roots = ([f"data.train_set.datasets.0.root={out}"] if data == "corpus_mixed" else [f"data.train_set.root={out}"])
    cfg = compose([f"stage={stage}", f"data={data}", f"data.val_set.root={out}", f"paths.root_dir={tmp_path}",
                   *roots, *SMALL_RUN, *extra], return_hydra_config=False)
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp_path / "run")
    metrics = train(cfg)
    assert np.isfinite(float(metrics["train/loss"])) and np.isfinite(float(metrics["val/loss"]))
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
