"""The synthetic document generator: determinism, geometry of the ground truth, questions that are
answerable from the page, class coverage, and degradations that keep the ground truth aligned."""
from __future__ import annotations

import re

import numpy as np
import pytest

from dociq.data.degrade import degrade_page, rotate_page
from dociq.data.schema import QUESTION_KINDS, REGION_CLASSES, SYNTHETIC_CLASSES, Page
from dociq.data.synthetic.generator import SyntheticDocuments, generate_page
from script_module import load_script

SIZE = 384


@pytest.fixture(scope="module")
def pages() -> list[Page]:
    ds = SyntheticDocuments(num_pages=16, image_size=SIZE, seed=7)
    return [ds[i] for i in range(len(ds))]


def page_signature(page: Page):
    return (page.image.tobytes(), page.words, page.word_boxes.tobytes(),
            [(r.label, r.box.tobytes(), np.packbits(r.mask).tobytes(), r.text, r.word_ids) for r in page.regions],
            [(q.text, q.kind, q.region_ids, np.packbits(q.mask).tobytes()) for q in page.questions],
            page.links)


def test_same_seed_same_pages_in_any_order():
    a = SyntheticDocuments(6, SIZE, seed=3)
    b = SyntheticDocuments(6, SIZE, seed=3)
    forward = {i: page_signature(a[i]) for i in range(6)}
    generate_page(0, seed=99, image_size=SIZE)  # another data set in between re-seeds the shared Faker
    backward = {i: page_signature(b[i]) for i in reversed(range(6))}
    assert forward == backward
    assert page_signature(a[-1]) == forward[5]


def test_different_seed_or_index_gives_different_pages():
    a, b = generate_page(0, seed=1, image_size=SIZE), generate_page(0, seed=2, image_size=SIZE)
    assert a.words != b.words and not np.array_equal(a.image, b.image)
    assert generate_page(1, seed=1, image_size=SIZE).words != a.words


def test_image_and_size_arguments():
    page = generate_page(0, seed=0, image_size=(320, 256))
    assert page.image.dtype == np.uint8 and page.image.shape == (320, 256, 3)
    assert page.size == (320, 256) and page.meta["original_size"] == (320, 256)
    with pytest.raises(ValueError, match="image_size"):
        SyntheticDocuments(4, image_size=64)
    with pytest.raises(ValueError, match="degrade"):
        SyntheticDocuments(4, degrade=1.5)
    with pytest.raises(ValueError, match="num_pages"):
        SyntheticDocuments(-1)
    with pytest.raises(IndexError):
        SyntheticDocuments(4, SIZE)[4]


def test_words_inside_page_and_inside_their_regions(pages):
    for page in pages:
        h, w = page.size
        boxes = page.word_boxes
        assert boxes.shape == (len(page.words), 4) and boxes.dtype == np.float32
        assert len(page.words) > 30
        assert (boxes[:, 0] >= 0).all() and (boxes[:, 1] >= 0).all()
        assert (boxes[:, 2] <= w).all() and (boxes[:, 3] <= h).all()
        assert (boxes[:, 2] > boxes[:, 0]).all() and (boxes[:, 3] > boxes[:, 1]).all()
        covered = set()
        for r in page.regions:
            for i in r.word_ids:
                x0, y0, x1, y1 = boxes[i]
                assert r.box[0] <= x0 and r.box[1] <= y0 and x1 <= r.box[2] and y1 <= r.box[3], (r.label, page.words[i])
            assert r.text == " ".join(page.words[i] for i in r.word_ids)
            covered.update(r.word_ids)
        assert covered == set(range(len(page.words))), "every OCR word belongs to a region"


def test_region_masks_match_boxes(pages):
    for page in pages:
        for r in page.regions:
            assert r.label in REGION_CLASSES
            assert r.mask.dtype == bool and r.mask.shape == page.size
            x0, y0, x1, y1 = r.box.astype(int)
            box_mask = np.zeros(page.size, bool)
            box_mask[y0:y1, x0:x1] = True
            if r.label == "stamp" and not r.mask[y0, x0]:  # a round stamp: the inscribed ellipse
                assert not (r.mask & ~box_mask).any()
                ys, xs = np.nonzero(r.mask)
                assert abs(xs.min() - x0) <= 1 and abs(xs.max() + 1 - x1) <= 1
                assert abs(ys.min() - y0) <= 1 and abs(ys.max() + 1 - y1) <= 1
                assert 0.7 < r.mask.sum() / box_mask.sum() < 0.85  # pi/4 of its box
            else:
                np.testing.assert_array_equal(r.mask, box_mask)


def test_question_masks_are_unions_of_their_regions(pages):
    kinds = set()
    for page in pages:
        assert 2 <= len(page.questions) <= 8
        assert len({q.kind for q in page.questions}) >= 2, "questions mix kinds on every page"
        for q in page.questions:
            assert q.kind in QUESTION_KINDS and q.region_ids and q.mask.any()
            union = np.logical_or.reduce([page.regions[i].mask for i in q.region_ids])
            np.testing.assert_array_equal(q.mask, union)
            kinds.add(q.kind)
    assert {"layout", "reading", "cell"} <= kinds


def _text(page: Page, region_id: int) -> str:
    return page.regions[region_id].text


def test_reading_and_cell_answers_hold_the_asked_text(pages):
    checked = {"field": 0, "paragraph": 0, "cell": 0}
    for page in pages:
        key_of = {v: k for k, v in page.links}
        for q in page.questions:
            if m := re.fullmatch(r"where is the (.+) of (.+)\?", q.text):
                field, person = m.groups()
                (answer,) = q.region_ids
                assert page.regions[answer].label == "form_value" and _text(page, answer)
                assert _text(page, key_of[answer]).lower() == field + ":"
                # The person's name heads the answer's form: the nearest "Name:" row above it whose
                # value starts at the same x (a form aligns its values; glyph bearings differ by a pixel or two).
                ax, ay = page.regions[answer].box[0], page.regions[answer].box[1]
                names = [(ay - page.regions[v].box[1], v) for k, v in page.links
                         if _text(page, k) == "Name:" and abs(page.regions[v].box[0] - ax) <= 3
                         and page.regions[v].box[1] <= ay]
                assert _text(page, min(names)[1]) == person
                checked["field"] += 1
            elif m := re.fullmatch(r"which (paragraph|bullet point) mentions \u201c(.+)\u201d\?", q.text):
                label = {"paragraph": "paragraph", "bullet point": "list_item"}[m.group(1)]
                word = m.group(2).lower()
                mentions = [i for i, r in enumerate(page.regions) if r.label == label
                            and word in re.findall(r"[a-z]+", r.text.lower())]
                assert mentions == q.region_ids
                checked["paragraph"] += 1
            elif q.kind == "cell":
                m = re.fullmatch(r"what is the (.+) of (.+)\?", q.text)
                head, key = m.groups()
                (cell,) = q.region_ids
                cx0, cy0, cx1, cy1 = page.regions[cell].box
                cells = [r for r in page.regions if r.label == "table_cell"]
                column = [r for r in cells if r.box[0] == cx0 and r.box[2] == cx1 and r.box[1] <= cy0]
                row = [r for r in cells if r.box[1] == cy0 and r.box[3] == cy1 and r.box[0] <= cx0]
                header = min(column, key=lambda r: r.box[1])  # top cell of the column (same table)
                row_key = min(row, key=lambda r: r.box[0])
                assert header.text.lower() == head and row_key.text == key and _text(page, cell)
                checked["cell"] += 1
    assert all(n > 0 for n in checked.values()), checked


def test_every_region_class_appears_within_a_few_pages(pages):
    seen = {r.label for page in pages[:12] for r in page.regions}
    assert seen == set(SYNTHETIC_CLASSES)
    links = [(page, k, v) for page in pages for k, v in page.links]
    assert links and all(page.regions[k].label == "form_key" and page.regions[v].label == "form_value"
                         for page, k, v in links)


def _ink(image: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Mean ink (darkness below the paper tone, 0..1) inside each box. Unlike a dark-pixel count,
    ink mass survives blur, which spreads thin strokes into lighter grey."""
    grey = image.astype(np.float32).mean(axis=2)
    darkness = np.clip(np.median(grey) - grey, 0, None) / 255
    return np.array([darkness[y0:y1, x0:x1].mean() for x0, y0, x1, y1 in boxes.astype(int)])


def test_rotation_moves_boxes_and_masks_with_the_ink():
    page = generate_page(5, seed=11, image_size=512)
    rotated = rotate_page(page, 2.0)
    big = (page.word_boxes[:, 3] - page.word_boxes[:, 1]) >= 7
    before = _ink(page.image, page.word_boxes[big])
    after = _ink(rotated.image, rotated.word_boxes[big])
    stale = _ink(rotated.image, page.word_boxes[big])  # control: boxes left where they were
    assert before.mean() > 0.15
    assert np.median(after / before) > 0.6 and (after > 0.05).mean() > 0.97
    assert stale.mean() < 0.8 * after.mean(), "the control shows misplaced boxes would be caught"
    for r, r0 in zip(rotated.regions, page.regions):
        x0, y0, x1, y1 = r.box.astype(int)
        assert r.mask.any() and not r.mask[:y0].any() and not r.mask[y1:].any()
        assert not r.mask[:, :x0].any() and not r.mask[:, x1:].any()
        assert abs(int(r.mask.sum()) - int(r0.mask.sum())) <= 0.1 * r0.mask.sum() + 2 * (x1 - x0 + y1 - y0)
    for q in rotated.questions:
        np.testing.assert_array_equal(q.mask, np.logical_or.reduce([rotated.regions[i].mask for i in q.region_ids]))
    with pytest.raises(ValueError, match="at most"):
        rotate_page(page, 5.0)


def test_random_degradations_keep_words_on_ink():
    page = generate_page(2, seed=4, image_size=512)
    big = (page.word_boxes[:, 3] - page.word_boxes[:, 1]) >= 7
    before = _ink(page.image, page.word_boxes[big])
    for s in range(4):
        bad = degrade_page(page, np.random.default_rng(s))
        assert bad.meta["degradations"] and bad.image.shape == page.image.shape and bad.image.dtype == np.uint8
        after = _ink(bad.image, bad.word_boxes[big])
        assert np.median(after / before) > 0.5, bad.meta["degradations"]
    ds = SyntheticDocuments(3, SIZE, seed=1, degrade=1.0)
    assert all(ds[i].meta["degradations"] for i in range(3))
    assert page_signature(ds[1]) == page_signature(SyntheticDocuments(3, SIZE, seed=1, degrade=1.0)[1])


def _identity(page):
    return page


def test_pages_from_dataloader_workers_match_direct_reads():
    from torch.utils.data import DataLoader

    ds = SyntheticDocuments(4, 256, seed=5)
    loader = DataLoader(ds, batch_size=None, num_workers=2, collate_fn=_identity,
                        multiprocessing_context="fork")
    assert [page_signature(p) for p in loader] == [page_signature(ds[i]) for i in range(4)]


def test_make_synthetic_script_writes_pages_the_coco_reader_reads_back(tmp_path):

    from dociq.data.datasets.coco import CocoDocuments

    module = load_script("make_synthetic")
    path = module.main(["--out", str(tmp_path / "synth"), "--pages", "2", "--seed", "9", "--image-size", "192x160"])
    disk = CocoDocuments(path)
    made = SyntheticDocuments(2, (192, 160), seed=9)
    assert len(disk) == 2
    for i in range(2):
        a, b = made[i], disk[i]
        np.testing.assert_array_equal(a.image, b.image)
        assert a.words == b.words and a.links == b.links
        np.testing.assert_allclose(a.word_boxes, b.word_boxes)
        assert [(r.label, r.text) for r in a.regions] == [(r.label, r.text) for r in b.regions]
        assert all(np.array_equal(r.mask, s.mask) for r, s in zip(a.regions, b.regions))
        assert [(q.text, q.kind, q.region_ids) for q in a.questions] == \
            [(q.text, q.kind, q.region_ids) for q in b.questions]
        assert all(np.array_equal(q.mask, s.mask) for q, s in zip(a.questions, b.questions))
    with pytest.raises(SystemExit):
        module.main(["--out", str(tmp_path / "bad"), "--pages", "1", "--image-size", "64"])


def test_missing_fonts_name_the_folders_and_the_fix(tmp_path, monkeypatch):
    from dociq.data.synthetic import fonts as synthetic_fonts

    monkeypatch.setattr(synthetic_fonts, "SYSTEM_FONT_DIR", tmp_path)
    monkeypatch.setattr(synthetic_fonts, "font_dirs", lambda: [tmp_path])
    with pytest.raises(FileNotFoundError, match=r"DejaVuSerif-Bold\.ttf.*fonts-dejavu-core"):
        synthetic_fonts.font_path("serif", "bold")
    with pytest.raises(KeyError, match="unknown font"):
        synthetic_fonts.font_path("comic", "regular")
