"""Automatic page segmenter (dociq.inference.automatic): seeds, stability, NMS, classes, COCO results, the
pipeline on a scripted predictor, and on the fine-tune fixture's model."""
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from pycocotools import mask as mask_util
from torchvision.ops import box_iou

from dociq.cli.segment_page import main
from dociq.data.masks import mask_boxes, mask_iou_matrix
from dociq.inference.automatic import (LAYOUT_QUESTIONS, PageSegmenter, SegmentedRegion, assign_categories,
                                       box_text_share, grid_points, nms,
                                       remove_small_regions,
                                       stability_score, to_coco_results)
from dociq.data.text_blocks import block_boxes, group_blocks, group_lines, line_points, page_blocks, skew_slope
from dociq.inference.overlay import draw_overlay


# ---- seeds -------------------------------------------------------------------------------------

def test_words_group_into_lines_split_at_the_column_gutter():
    # two columns (x 10..90 and 150..230), two text lines each; a word 2 px lower still joins its line
    boxes = np.array([
        [10, 10, 40, 20], [45, 12, 90, 22], [150, 10, 190, 20], [195, 10, 230, 20],    # line 1, both columns
        [10, 30, 50, 40], [55, 30, 90, 40], [150, 31, 230, 41],                          # line 2
    ], dtype=np.float32)
    lines = group_lines(boxes)
    assert sorted(map(sorted, lines)) == [[0, 1], [2, 3], [4, 5], [6]]
    points = line_points(boxes)
    assert points.shape == (4, 2)
    for x, y in points:          # every click lies on a word of the page
        assert ((boxes[:, 0] <= x) & (x <= boxes[:, 2]) & (boxes[:, 1] <= y) & (y <= boxes[:, 3])).any()
    assert line_points(np.zeros((0, 4))).shape == (0, 2)


def test_a_contents_line_with_dot_leaders_stays_one_line():
    # "2.1 Installing . . . . . . 17": 3-px dots 27 px apart on a 16-px line (wider than 1.5x the
    # words' height, as a contents page sets them); its own column 200 px to the right still splits off
    words = [[10, 10, 30, 26], [36, 10, 120, 26]] + [[x, 22, x + 3, 25] for x in range(134, 300, 30)]
    words += [[310, 10, 330, 26], [530, 10, 600, 26]]
    lines = group_lines(np.array(words, np.float32))
    assert [len(line) for line in lines] == [len(words) - 1, 1]
    assert len(block_boxes(np.array(words, np.float32))) == 2


def _text_line(x0, y0, x1, height=10, words=3):
    """Boxes of `words` equal words spread over x0..x1 on one line at y0."""
    edges = np.linspace(x0, x1, words + 1)
    return [[a + 1, y0, b - 1, y0 + height] for a, b in zip(edges[:-1], edges[1:])]


def test_lines_join_into_blocks_at_line_spacing_and_split_at_paragraph_gaps():
    boxes = np.array(
        _text_line(10, 10, 200, height=16, words=2)            # a heading: taller than the body
        + _text_line(10, 32, 200) + _text_line(10, 45, 200) + _text_line(10, 58, 120)   # paragraph 1 (3 lines)
        + _text_line(10, 80, 200) + _text_line(10, 93, 200)    # paragraph 2, after a gap of 12 px
        + _text_line(250, 32, 400) + _text_line(250, 45, 400)  # a second column beside paragraph 1
        + _text_line(10, 120, 200) + _text_line(30, 133, 200)  # list item 1 ("•" + a continuation line)
        + _text_line(10, 146, 200),                            # list item 2, as close as a line
        dtype=np.float32)
    words = ["w"] * len(boxes)
    words[23] = "•"                                            # the first word of list item 1's first line
    words[29] = "2."                                           # the first word of list item 2
    blocks = [sorted(b) for b in group_blocks(boxes, words)]
    heading, para1, para2, column = [0, 1], list(range(2, 11)), list(range(11, 17)), list(range(17, 23))
    item1, item2 = list(range(23, 29)), list(range(29, 32))
    assert sorted(blocks) == sorted([heading, para1, para2, column, item1, item2])
    # without the words, the list items are one block (nothing tells them apart)
    assert sorted(item1 + item2) in [sorted(b) for b in group_blocks(boxes)]
    got = block_boxes(boxes, words)
    assert got.shape == (6, 4)
    assert [11, 32, 199, 68] in got.astype(int).tolist()      # paragraph 1's words' box


@pytest.mark.parametrize("degrees", [-2.0, -1.0, 1.0, 2.0])
def test_a_skewed_scans_paragraphs_are_the_blocks_of_the_level_page(degrees):
    # two paragraphs of 600-px lines 13 px apart, a 20-px gap between them; turned 2 degrees a
    # line's last word sits 21 px off its first, more than a line's pitch
    rows = [30, 43, 56, 69, 102, 115, 128]
    level = np.array([box for y in rows for box in _text_line(20, y, 620, words=10)], np.float64)
    slope = np.tan(np.radians(degrees))
    skewed = level.copy()
    shift = slope * (level[:, 0] + level[:, 2]) / 2
    skewed[:, [1, 3]] += shift[:, None]
    blank = np.full((200, 660, 3), 255, np.uint8)
    truth = sorted([list(range(0, 40)), list(range(40, 70))])
    assert sorted(sorted(b) for b in page_blocks(blank, level)) == truth
    assert abs(skew_slope(skewed) - slope) < 0.004
    assert sorted(sorted(b) for b in page_blocks(blank, skewed)) == truth
    # grouped as given, the skewed lines run into each other: not the paragraphs
    assert sorted(sorted(b) for b in group_blocks(skewed)) != truth


def test_grid_points_are_cell_centres_inside_the_page():
    pts = grid_points(4, (100, 200))
    assert pts.shape == (16, 2)
    assert sorted(set(pts[:, 0].tolist())) == [25.0, 75.0, 125.0, 175.0]
    assert sorted(set(pts[:, 1].tolist())) == [12.5, 37.5, 62.5, 87.5]
    with pytest.raises(ValueError, match="points_per_side=0"):
        grid_points(0, (10, 10))


# ---- mask quality and dedup --------------------------------------------------------------------

def test_stability_score_equals_brute_force_iou():
    logits = np.random.default_rng(0).standard_normal((5, 3, 17, 23)).astype(np.float32) * 3
    logits[0, 0] = -10                                          # empty at both thresholds
    got = stability_score(logits, threshold=0.5, offset=1.0)
    for idx in np.ndindex(5, 3):
        hi = set(zip(*np.nonzero(logits[idx] > 1.5)))
        lo = set(zip(*np.nonzero(logits[idx] > -0.5)))
        expected = len(hi & lo) / len(hi | lo) if hi | lo else 0.0
        assert got[idx].item() == pytest.approx(expected), idx


def test_nms_removes_a_duplicate_and_keeps_the_better_one():
    boxes = np.array([[10, 10, 50, 50], [11, 10, 50, 51], [60, 60, 90, 90]], dtype=np.float32)
    kept = nms(boxes, np.array([0.7, 0.9, 0.8]), 0.7)
    assert kept.tolist() == [1, 2]
    assert nms(np.zeros((0, 4)), np.zeros(0), 0.7).size == 0


@pytest.mark.parametrize("seed", range(4))
def test_nms_keeps_what_torchvision_keeps(seed):
    from torchvision.ops import nms as torchvision_nms
    rng = np.random.default_rng(seed)
    lo = rng.uniform(0, 200, (300, 2))
    boxes = np.concatenate([lo, lo + rng.uniform(5, 80, (300, 2))], 1).astype(np.float32)
    scores = rng.random(300).astype(np.float32)                 # distinct: the order is defined
    for threshold in (0.3, 0.7):
        expect = torchvision_nms(torch.from_numpy(boxes), torch.from_numpy(scores), threshold).numpy()
        np.testing.assert_array_equal(nms(boxes, scores, threshold), expect)


def test_mask_boxes_are_exclusive_pixel_boxes_as_torchvision_draws_them():
    from torchvision.ops import masks_to_boxes
    m = np.zeros((3, 20, 30), dtype=bool)
    m[0, 5:9, 3:12] = True
    m[1, 0:20, 29] = True
    m[2, 7, 0] = m[2, 19, 15] = True
    assert mask_boxes(m[:1]).tolist() == [[3.0, 5.0, 12.0, 9.0]]
    np.testing.assert_array_equal(mask_boxes(m), masks_to_boxes(torch.from_numpy(m)).numpy() + [0, 0, 1, 1])
    assert mask_boxes(np.zeros((0, 4, 4), bool)).shape == (0, 4)


def test_small_holes_fill_and_small_islands_go():
    m = np.zeros((40, 40), bool)
    m[5:30, 5:30] = True
    m[10:12, 10:12] = False                  # a 4-px hole
    m[35:37, 35:37] = True                   # a 4-px island
    m[15:25, 15:25] = False                  # a 100-px hole: stays
    out, changed = remove_small_regions(m, min_area=10)
    assert changed and out[10:12, 10:12].all() and not out[35:37, 35:37].any() and not out[15:25, 15:25].any()
    assert out.sum() == 25 * 25 - 100
    lone = np.zeros((10, 10), bool)
    lone[2:4, 2:4] = True                    # the only island is kept even when small
    out, changed = remove_small_regions(lone, 10)
    assert not changed and (out == lone).all()



def _remove_small_regions_whole_page(mask, min_area):
    """SAM's remove_small_regions over the whole page (the reference the box-cropped one must match)."""
    from scipy import ndimage
    structure = np.ones((3, 3), dtype=bool)
    out = mask.copy()
    holes, count = ndimage.label(~out, structure=structure)
    sizes = np.bincount(holes.ravel(), minlength=count + 1)
    small = np.nonzero(sizes < min_area)[0]
    out |= np.isin(holes, small[small > 0])
    islands, count = ndimage.label(out, structure=structure)
    if count > 1:
        sizes = np.bincount(islands.ravel(), minlength=count + 1)
        sizes[0] = 0
        out &= ~np.isin(islands, [k for k in range(1, count + 1) if sizes[k] < min_area and k != sizes.argmax()])
    return out


@pytest.mark.parametrize("seed", range(6))
def test_small_regions_cleaned_in_the_box_as_on_the_whole_page(seed):
    rng = np.random.default_rng(seed)
    m = np.zeros((60, 80), bool)
    for _ in range(4):                       # blobs with holes, bays and islands, some at the page edge
        y, x = rng.integers(0, 50), rng.integers(0, 70)
        m[y:y + rng.integers(3, 25), x:x + rng.integers(3, 25)] = True
    m &= rng.random(m.shape) > 0.08          # pepper: many 1-px holes
    out, changed = remove_small_regions(m, min_area=12)
    assert (out == _remove_small_regions_whole_page(m, 12)).all()
    assert changed == bool((out != m).any())


def test_a_bay_open_to_the_outside_is_not_a_hole():
    m = np.zeros((40, 40), bool)
    m[5:30, 5:30] = True
    m[5:7, 10:12] = False                    # a 4-px notch in the top edge: background, not a hole
    out, _changed = remove_small_regions(m, min_area=10)
    assert not out[5:7, 10:12].any()


def test_box_text_share_counts_the_text_inside_each_box():
    text = np.zeros((50, 100), bool)
    text[10:20, 10:60] = True
    boxes = np.array([[10, 10, 60, 20], [0, 0, 100, 50], [60, 20, 100, 50], [30, 15, 90, 25]], np.float32)
    np.testing.assert_allclose(box_text_share(boxes, text), [1.0, 500 / 5000, 0.0, 150 / 600])
    assert box_text_share(np.zeros((0, 4)), text).shape == (0,)


# ---- classes and outputs -----------------------------------------------------------------------

def _rect_mask(size, x0, y0, x1, y1):
    m = np.zeros(size, dtype=bool)
    m[y0:y1, x0:x1] = True
    return m


def _region(mask, category="region", score=0.9):
    ys, xs = np.nonzero(mask)
    box = np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], np.float32)
    return SegmentedRegion(mask=mask, box=box, score=score, stability=0.95, category=category)


def test_regions_take_the_class_of_the_answer_part_they_match():
    size = (100, 120)
    tables = _rect_mask(size, 5, 5, 45, 40) | _rect_mask(size, 60, 5, 110, 40)    # "segment all tables": both
    figure = _rect_mask(size, 5, 60, 60, 95)
    regions = np.stack([_rect_mask(size, 60, 5, 110, 40),    # the second table exactly
                        _rect_mask(size, 5, 60, 55, 95),     # most of the figure
                        _rect_mask(size, 70, 60, 110, 95)])  # nothing the model named
    got = assign_categories(regions, {"table": tables, "figure": figure}, min_iou=0.5)
    assert got[0] == ("table", pytest.approx(1.0))           # IoU with its own table, not with the union
    assert got[1][0] == "figure" and got[1][1] == pytest.approx(50 / 55)
    assert got[2] == ("region", 0.0)


def test_coverage_names_a_region_inside_an_answer_that_merges_touching_instances():
    size = (100, 120)
    paragraphs = _rect_mask(size, 5, 5, 110, 60)               # "all paragraphs": three touching ones, one blob
    code = _rect_mask(size, 5, 70, 110, 95)
    regions = np.stack([_rect_mask(size, 5, 5, 110, 20),      # one paragraph of the three
                        _rect_mask(size, 5, 70, 110, 95),     # the code block
                        _rect_mask(size, 5, 50, 110, 80)])    # across both, mostly neither
    by_iou = assign_categories(regions, {"paragraph": paragraphs, "code": code}, min_iou=0.5)
    assert by_iou[0][0] == "region"                            # IoU with the blob: 15 / 55
    by_coverage = assign_categories(regions, {"paragraph": paragraphs, "code": code}, min_iou=0.5,
                                    measure="coverage")
    assert by_coverage[0] == ("paragraph", pytest.approx(1.0))
    assert by_coverage[1] == ("code", pytest.approx(1.0))
    assert by_coverage[2] == ("region", pytest.approx(1 / 3))
    with pytest.raises(ValueError, match="measure"):
        assign_categories(regions, {}, measure="dice")


def test_mask_iou_matrix_equals_the_dense_computation():
    rng = np.random.default_rng(0)
    a = [rng.random((30, 40)) < p for p in (0.05, 0.3, 0.0)] + [_rect_mask((30, 40), 0, 0, 5, 5)]
    b = [rng.random((30, 40)) < 0.2, _rect_mask((30, 40), 30, 20, 40, 30), np.zeros((30, 40), bool)]
    dense = np.array([[(x & y).sum() / max((x | y).sum(), 1) for y in b] for x in a])
    np.testing.assert_allclose(mask_iou_matrix(a, b), dense, rtol=1e-6)


def test_coco_results_round_trip_and_drop_unknown_classes():
    size = (60, 80)
    a = _rect_mask(size, 10, 5, 30, 25)
    b = _rect_mask(size, 40, 30, 70, 50) | _rect_mask(size, 0, 55, 5, 60)
    regions = [_region(a, "list_item", 0.8), _region(b, "table", 0.6), _region(a, "region", 0.5)]
    results = to_coco_results(regions, image_id=7, category_ids={"List-item": 3, "TABLE": 1})
    assert [r["category_id"] for r in results] == [3, 1]                  # names match across spellings
    json.dumps(results)                                                    # str counts: JSON-safe
    for r, region in zip(results, regions):
        rle = dict(r["segmentation"], counts=r["segmentation"]["counts"].encode())
        np.testing.assert_array_equal(mask_util.decode(rle).astype(bool), region.mask)
        assert r["image_id"] == 7 and r["score"] == region.score and r["area"] == region.mask.sum()
    assert results[1]["bbox"] == [0.0, 30.0, 70.0, 30.0]                  # x, y, w, h of both parts


def test_overlay_tints_regions_and_leaves_the_rest():
    image = np.full((80, 100, 3), 255, np.uint8)
    region = _region(_rect_mask((80, 100), 40, 30, 90, 70), "table")
    out = draw_overlay(image, [region])
    assert out.shape == image.shape and out.dtype == np.uint8
    assert (out[50, 60] != 255).any()                                     # inside: tinted
    assert (out[5:25, 0:30] == 255).all() and (out[75:, :] == 255).all()  # away from it and its label


def test_overlay_legend_names_each_colour_and_answers_are_striped_in_the_question_colours():
    from dociq.data.schema import REGION_CLASSES
    from dociq.inference.overlay import MASK_COLOURS, category_colour, stripes

    classes = [*REGION_CLASSES, "region"]
    assert len({tuple(category_colour(c)) for c in classes}) == len(classes)   # a legend is never ambiguous
    image = np.full((80, 200, 3), 255, np.uint8)
    table = _region(_rect_mask((80, 200), 10, 10, 60, 60), "table")
    answer = _region(_rect_mask((80, 200), 120, 10, 190, 60), "answer")
    answer.question = "the total"
    questions = ["a question never answered", "the total"]
    out = draw_overlay(image, [table, answer], questions=questions, legend=True)
    assert out.shape == (80 + 3 * 16 + 8, 200, 3)                          # the page + one legend row per entry
    np.testing.assert_array_equal(out[:80], draw_overlay(image, [table, answer], questions=questions))
    assert list(out[80 + 4 + 8, 12]) == [int(c) for c in category_colour("table")]     # row 1: table, filled
    for k, colour in ((1, MASK_COLOURS[0]), (2, MASK_COLOURS[1])):                    # rows 2-3: Q1, Q2, striped
        swatch = out[80 + 4 + k * 16 + 3:80 + 4 + k * 16 + 14, 7:18].reshape(-1, 3)
        assert {tuple(int(c) for c in colour), (255, 255, 255)} <= {tuple(int(v) for v in px) for px in swatch}
    hatch = stripes((80, 200))
    assert hatch[35, 150] and not hatch[35, 156]
    assert np.allclose(out[35, 150], 0.6 * 255 + 0.4 * MASK_COLOURS[1], atol=1)   # Q2's colour on a stripe
    assert (out[35, 156] == 255).all()                                             # the page between stripes


# ---- the pipeline on a scripted predictor ------------------------------------------------------

class ScriptedPredictor:
    """Predictor stand-in: clicking inside one of `objects` returns that rectangle (candidate 0),
    the same rectangle one pixel wider (candidate 1, a duplicate) and a blurry half page that is
    unstable (candidate 2); a click elsewhere returns nothing. Class questions answer with the
    union of that class's rectangles."""

    def __init__(self, size, objects):
        self.size, self.objects = size, objects          # [(class, (x0, y0, x1, y1))]
        self.set_image_calls, self.point_batches, self.questions, self.box_prompts = 0, [], [], []

    def set_image(self, image, words=None, word_boxes=None, ocr=None):
        self.set_image_calls += 1
        self.page = SimpleNamespace(image=np.asarray(image), original_size=image.shape[:2], words=list(words or []),
                                    word_boxes=np.zeros((0, 4), np.float32) if word_boxes is None else word_boxes,
                                    word_confidences=None)

    def word_class_probabilities(self):                  # a model without the word-class head
        return None

    def predict_masks(self, question=None, points=None, boxes=None, multimask_output=False, return_logits=False):
        h, w = self.size
        if boxes is not None:                            # the object whose box it is, one mask each
            assert not multimask_output and return_logits
            self.box_prompts.extend(tuple(int(v) for v in b) for b in boxes)
            logits = np.full((len(boxes), h, w), -8.0, np.float32)
            for i, b in enumerate(boxes):
                for _name, (x0, y0, x1, y1) in self.objects:
                    if tuple(int(v) for v in b) == (x0, y0, x1, y1):
                        logits[i, y0:y1, x0:x1] = 8.0
            return logits, np.full(len(boxes), 0.9, np.float32), None
        if question is not None:
            self.questions.append(list(question))
            by_question = {q: name for name, q in LAYOUT_QUESTIONS.items()}
            masks = np.zeros((len(question), h, w), bool)
            for i, q in enumerate(question):
                for name, (x0, y0, x1, y1) in self.objects:
                    if name == by_question[q]:
                        masks[i, y0:y1, x0:x1] = True
            return masks, np.ones(len(question)), None
        assert multimask_output and return_logits
        points = np.asarray(points)
        self.point_batches.append(len(points))
        logits = np.full((len(points), 3, h, w), -8.0, np.float32)
        iou = np.full((len(points), 3), 0.2, np.float32)
        for i, (x, y) in enumerate(points[:, 0]):
            for _name, (x0, y0, x1, y1) in self.objects:
                if x0 <= x < x1 and y0 <= y < y1:
                    logits[i, 0, y0:y1, x0:x1] = 8.0
                    logits[i, 1, y0:y1, x0:x1 + 1] = 8.0
                    logits[i, 2] = np.linspace(-1.2, 1.2, w)[None]                # gentle ramp: unstable
                    iou[i] = [0.95, 0.9, 0.85]
        return logits, iou, None


def test_segment_embeds_once_filters_dedups_and_names_regions():
    size = (96, 128)
    objects = [("table", (8, 8, 60, 40)), ("figure", (70, 50, 120, 90)), ("table", (70, 8, 120, 40))]
    predictor = ScriptedPredictor(size, objects)
    segmenter = PageSegmenter(predictor, points_per_side=8, seeds=("grid",), points_per_batch=10,
                              pred_iou_thresh=0.5, stability_score_thresh=0.9, min_region_area=16)
    regions = segmenter.segment(np.full((*size, 3), 255, np.uint8))
    assert predictor.set_image_calls == 1
    assert predictor.point_batches == [10] * 6 + [4]                       # 64 grid clicks in batches
    assert len(predictor.questions) == 1 and len(predictor.questions[0]) == len(LAYOUT_QUESTIONS)
    assert len(regions) == 3                                               # one per object
    got = sorted((r.category, tuple(int(v) for v in r.box)) for r in regions)
    assert got == sorted((name, box) for name, box in objects)             # the exact candidate, not its twin
    for r in regions:
        assert r.mask.shape == size and r.score == pytest.approx(0.95) and r.stability == pytest.approx(1.0)
        assert r.category_score == pytest.approx(1.0) and r.seed == "grid"


def test_class_answer_parts_become_box_prompts():
    size = (96, 128)
    objects = [("table", (8, 8, 60, 40)), ("figure", (70, 50, 120, 90)), ("table", (70, 8, 120, 40))]
    predictor = ScriptedPredictor(size, objects)
    regions = PageSegmenter(predictor, seeds=("class_boxes",)).segment(np.zeros((*size, 3), np.uint8))
    assert sorted(predictor.box_prompts) == sorted(box for _name, box in objects)   # one box per answer part
    assert predictor.point_batches == [] and len(predictor.questions) == 1            # asked once, reused
    got = sorted((r.category, tuple(int(v) for v in r.box), r.seed) for r in regions)
    assert got == sorted((name, box, "class_boxes") for name, box in objects)
    assert all(r.score == pytest.approx(0.9) for r in regions)


def test_ocr_blocks_become_box_prompts_and_snap_draws_their_words_box():
    size = (96, 128)
    objects = [("paragraph", (8, 8, 120, 40)), ("paragraph", (8, 60, 120, 90))]
    predictor = ScriptedPredictor(size, objects)
    # two blocks of two lines each; the words leave a margin inside each object
    words = np.array(_text_line(10, 10, 118, height=8) + _text_line(10, 20, 118, height=8)
                     + _text_line(10, 62, 118, height=8) + _text_line(10, 72, 110, height=8), np.float32)
    blocks = [tuple(int(v) for v in b) for b in block_boxes(words)]
    assert len(blocks) == 2
    predictor.objects = [("paragraph", b) for b in blocks]     # the model answers each block box exactly
    segmenter = PageSegmenter(predictor, seeds=("ocr_blocks",), classify=False, snap=True, block_masks="model")
    regions = segmenter.segment(np.zeros((*size, 3), np.uint8), words=["w"] * len(words), word_boxes=words)
    assert sorted(predictor.box_prompts) == sorted(blocks) and predictor.point_batches == []
    assert sorted(tuple(int(v) for v in r.box) for r in regions) == sorted(blocks)
    assert all(r.seed == "ocr_blocks" for r in regions)


def test_word_blocks_are_their_words_box_named_and_ranked_by_the_word_classes():
    from dociq.data.schema import REGION_CLASSES

    class WordPredictor(ScriptedPredictor):
        def word_class_probabilities(self):       # the first block's words are code, the second's paragraph
            out = np.zeros((len(self.page.word_boxes), len(REGION_CLASSES)), np.float32)
            top = self.page.word_boxes[:, 1] < 40
            out[top, REGION_CLASSES.index("code")] = 0.9
            out[~top, REGION_CLASSES.index("paragraph")] = 0.6
            return out

    size = (96, 128)
    predictor = WordPredictor(size, [])
    words = np.array(_text_line(10, 10, 118, height=8) + _text_line(10, 20, 118, height=8)
                     + _text_line(10, 62, 118, height=8), np.float32)
    regions = PageSegmenter(predictor, seeds=("ocr_blocks",)).segment(
        np.zeros((*size, 3), np.uint8), words=["w"] * len(words), word_boxes=words)
    assert predictor.box_prompts == [] and predictor.point_batches == []      # no decoder call for a block
    got = sorted((tuple(int(v) for v in r.box), r.category, round(r.score, 2)) for r in regions)
    assert got == sorted([(tuple(int(v) for v in b), c, p) for b, c, p in
                          zip(block_boxes(words), ["code", "paragraph"], [0.9, 0.6])])
    for r in regions:                                                           # the mask is the box
        x0, y0, x1, y1 = (int(v) for v in r.box)
        assert r.mask.sum() == (x1 - x0) * (y1 - y0) and r.mask[y0:y1, x0:x1].all()
    with pytest.raises(ValueError, match="block_masks"):
        PageSegmenter(predictor, block_masks="decoder")


def test_multimask_best_keeps_one_candidate_per_click():
    size = (64, 64)
    # the 1-px-wider twin (candidate 1) would survive NMS at a threshold of 0.99; with "best" it never exists
    objects = [("table", (8, 8, 40, 40))]
    every = PageSegmenter(ScriptedPredictor(size, objects), points_per_side=4, seeds=("grid",),
                          box_nms_thresh=0.99, classify=False).segment(np.zeros((*size, 3), np.uint8))
    best = PageSegmenter(ScriptedPredictor(size, objects), points_per_side=4, seeds=("grid",), multimask="best",
                         box_nms_thresh=0.99, classify=False).segment(np.zeros((*size, 3), np.uint8))
    assert len(every) == 2 and len(best) == 1
    assert tuple(best[0].box.astype(int)) == (8, 8, 40, 40) and best[0].category == "region"


def test_islands_are_removed_before_the_final_boxes():
    class SpeckledPredictor(ScriptedPredictor):
        def predict_masks(self, **kw):
            logits, iou, low = super().predict_masks(**kw)
            if kw.get("points") is not None:
                logits[:, :, 60:62, 60:62] = 8.0             # a 4-px speck in the corner of every candidate
            return logits, iou, low

    size = (64, 64)
    regions = PageSegmenter(SpeckledPredictor(size, [("table", (8, 8, 40, 40))]), points_per_side=4,
                            seeds=("grid",), classify=False, min_region_area=16).segment(np.zeros((*size, 3), np.uint8))
    assert tuple(regions[0].box.astype(int)) == (8, 8, 40, 40) and not regions[0].mask[60:62, 60:62].any()
    kept = PageSegmenter(SpeckledPredictor(size, [("table", (8, 8, 40, 40))]), points_per_side=4, seeds=("grid",),
                         classify=False, min_region_area=16, remove_small_regions=False).segment(
        np.zeros((*size, 3), np.uint8))
    assert tuple(kept[0].box.astype(int)) == (8, 8, 62, 62)


def test_thresholds_filter_and_bad_settings_are_named():
    size = (64, 64)
    predictor = ScriptedPredictor(size, [("table", (8, 8, 40, 40))])
    assert PageSegmenter(predictor, points_per_side=4, pred_iou_thresh=0.96, seeds=("grid",)).segment(
        np.zeros((*size, 3), np.uint8)) == []
    with pytest.raises(ValueError, match="seeds=.*choose one or more"):
        PageSegmenter(predictor, seeds=("words",))
    with pytest.raises(ValueError, match="pred_iou_thresh=1.5"):
        PageSegmenter(predictor, pred_iou_thresh=1.5)
    with pytest.raises(ValueError, match="points_per_side"):
        PageSegmenter(predictor, points_per_side=0, seeds=("grid", "ocr_lines"))


# ---- the real model (the fine-tune fixture: untrained weights) --------------------------------

@pytest.fixture(scope="module")
def synthetic_page():
    from dociq.data.synthetic.generator import SyntheticDocuments

    return SyntheticDocuments(1, image_size=160, seed=5)[0]


def test_segment_with_the_fixture_model(finetune_checkpoint, synthetic_page):
    from dociq.inference.predictor import Predictor

    page = synthetic_page
    segmenter = PageSegmenter(Predictor.from_checkpoint(finetune_checkpoint[0]), points_per_side=4,
                              pred_iou_thresh=0.0, stability_score_thresh=0.0, min_region_area=1)
    regions = segmenter.segment(page.image, words=page.words, word_boxes=page.word_boxes)
    assert regions, "thresholds at 0 keep every non-empty candidate"
    assert {r.seed for r in regions} <= {"ocr_blocks", "class_boxes"}
    for r in regions:
        assert r.mask.shape == page.image.shape[:2] and r.mask.dtype == bool and r.mask.any()
        assert 0.0 <= r.score <= 1.0 and 0.0 <= r.stability <= 1.0
        assert r.category in set(LAYOUT_QUESTIONS) | {"region"}
    boxes = torch.tensor(np.stack([r.box for r in regions]))
    iou = box_iou(boxes, boxes).fill_diagonal_(0)
    assert iou.max() <= segmenter.box_nms_thresh


def _plot_predictions():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    try:
        import plot_predictions
    finally:
        sys.path.pop(0)
    return plot_predictions


def test_the_segment_page_figure_draws_labels_beside_regions(finetune_checkpoint, tmp_path):
    from dociq.inference.predictor import Predictor

    out = tmp_path / "segmented.png"
    counts = _plot_predictions().plot_segmented(Predictor.from_checkpoint(finetune_checkpoint[0]), 1, 3, None, out,
                                                ["ocr_blocks"], snap=True)
    assert len(counts) == 1 and out.stat().st_size > 0


def test_the_box_figure_prompts_each_region_with_its_tight_box(finetune_checkpoint, tmp_path):
    from dociq.inference.predictor import Predictor

    plot_predictions = _plot_predictions()
    predictor = Predictor.from_checkpoint(finetune_checkpoint[0])
    rows = plot_predictions.collect_boxes(predictor, 1, 2, 3, predictor.image_size)
    assert len(rows) == 2
    for row in rows:
        ys, xs = row["question"].mask.nonzero()
        assert row["box"] == [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]
        assert row["question"].kind == "box" and 0.0 <= row["iou"] <= 1.0
    plot_predictions.plot(rows, tmp_path / "boxes.png")
    assert (tmp_path / "boxes.png").stat().st_size > 0


def test_cli_writes_overlay_and_coco_results(finetune_checkpoint, synthetic_page, tmp_path, capsys):
    from PIL import Image

    page = synthetic_page
    Image.fromarray(page.image).save(tmp_path / "page.png")
    (tmp_path / "words.json").write_text(json.dumps(
        [{"text": t, "box": [float(v) for v in b]} for t, b in zip(page.words, page.word_boxes)]))
    args = [str(finetune_checkpoint[0]), str(tmp_path / "page.png"), "--words", str(tmp_path / "words.json"),
            "--out", str(tmp_path / "o.png"), "--coco-json", str(tmp_path / "r.json"), "--points-per-side", "2",
            "--pred-iou-thresh", "0", "--stability-score-thresh", "0", "--min-region-area", "1", "--no-classify"]
    assert main(args) == 0
    assert np.asarray(Image.open(tmp_path / "o.png")).shape == page.image.shape
    results = json.loads((tmp_path / "r.json").read_text())
    assert results and {r["category_id"] for r in results} == {len(LAYOUT_QUESTIONS) + 1}   # all "region"
    assert "regions; overlay written to" in capsys.readouterr().out
    assert main([str(finetune_checkpoint[0]), str(tmp_path / "nope.png")]) == 2
    assert "nope.png does not exist" in capsys.readouterr().err


def test_cli_segments_a_pdf_page_with_its_text_layer(finetune_checkpoint, text_pdf, tmp_path, capsys):
    lines = [(14, 40, 300, "Quarterly report"), (10, 40, 260, "Revenue grew in every region"),
             (10, 40, 240, "Costs fell slightly")]
    (tmp_path / "doc.pdf").write_bytes(text_pdf([lines], 300, 340))
    args = [str(finetune_checkpoint[0]), "--pdf", str(tmp_path / "doc.pdf"), "--page", "1", "--dpi", "48",
            "--seeds", "ocr_lines", "--pred-iou-thresh", "0", "--stability-score-thresh", "0",
            "--min-region-area", "1", "--out", str(tmp_path / "o.png")]
    assert main(args) == 0
    assert (tmp_path / "o.png").is_file() and "regions; overlay written" in capsys.readouterr().out
    assert main([*args[:3], "--page", "3"]) == 2                          # a page the PDF does not have
    assert "--page 3" in capsys.readouterr().err


def test_regions_take_the_mean_class_of_their_words_and_wordless_ones_the_answers():
    from dociq.inference.automatic import classes_from_words
    size = (100, 120)
    regions = [_rect_mask(size, 0, 0, 60, 40), _rect_mask(size, 60, 0, 120, 40), _rect_mask(size, 0, 60, 120, 100)]
    word_boxes = np.array([[5, 5, 25, 15], [30, 5, 50, 15], [70, 5, 90, 15], [95, 5, 115, 15]], np.float32)
    probs = np.array([[0.7, 0.3], [0.4, 0.6], [0.1, 0.9], [0.0, 0.0]], np.float32)   # word 3 was not read
    got = classes_from_words(regions, word_boxes, probs, ["paragraph", "code"])
    assert got[0] == ("paragraph", pytest.approx(0.55))        # the mean over its two words
    assert got[1] == ("code", pytest.approx(0.9))              # the unread word does not vote
    assert got[2] is None                                      # no words: not named by words

    class WordPredictor(ScriptedPredictor):
        def word_class_probabilities(self):
            from dociq.data.schema import REGION_CLASSES
            out = np.zeros((len(self.page.word_boxes), len(REGION_CLASSES)), np.float32)
            out[:, REGION_CLASSES.index("code")] = 1.0
            return out

    objects = [("table", (8, 8, 60, 40)), ("figure", (70, 50, 120, 90))]
    predictor = WordPredictor((96, 128), objects)
    words = np.array([[10, 10, 30, 20]], np.float32)             # one word, inside the table
    regions = PageSegmenter(predictor, seeds=("class_boxes",)).segment(
        np.zeros((96, 128, 3), np.uint8), words=["x"], word_boxes=words)
    assert sorted(r.category for r in regions) == ["code", "figure"]   # by its word; the figure by the answer
    by_answers = PageSegmenter(predictor, seeds=("class_boxes",), class_source="answers").segment(
        np.zeros((96, 128, 3), np.uint8), words=["x"], word_boxes=words)
    assert sorted(r.category for r in by_answers) == ["figure", "table"]
    with pytest.raises(ValueError, match="no word-class head"):
        PageSegmenter(ScriptedPredictor((96, 128), objects), seeds=("class_boxes",), class_source="words").segment(
            np.zeros((96, 128, 3), np.uint8), words=["x"], word_boxes=words)


def test_regions_are_named_by_the_unit_classifier_when_the_predictor_has_one():
    from dociq.data.schema import REGION_CLASSES
    from dociq.inference.automatic import classes_from_units

    class FirstWordNames:
        """Calls a unit "code" when its first word is "def", else "paragraph"; records the units."""
        def __init__(self):
            self.units = []

        def unit_probabilities(self, image, word_boxes, words, units, ocr=False):
            self.units.extend(units)
            out = np.zeros((len(units), len(REGION_CLASSES)))
            for i, unit in enumerate(units):
                out[i, REGION_CLASSES.index("code" if words[unit[0]] == "def" else "paragraph")] = 0.8
            return out

    size = (100, 120)
    regions = [_rect_mask(size, 0, 0, 60, 40), _rect_mask(size, 60, 0, 120, 40), _rect_mask(size, 0, 60, 120, 100)]
    word_boxes = np.array([[5, 5, 25, 15], [30, 5, 50, 15], [70, 5, 90, 15]], np.float32)
    classifier = FirstWordNames()
    got = classes_from_units(regions, np.zeros((*size, 3), np.uint8), word_boxes, ["def", "f", "Text"], classifier)
    assert got == [("code", pytest.approx(0.8)), ("paragraph", pytest.approx(0.8)), None]   # no words: None
    assert classifier.units == [[0, 1], [2]]                    # a region's words are one unit

    class UnitPredictor(ScriptedPredictor):
        unit_classifier = FirstWordNames()

    words = np.array(_text_line(10, 10, 118, height=8) + _text_line(10, 62, 118, height=8), np.float32)
    texts = ["def"] + ["w"] * (len(words) - 1)
    regions = PageSegmenter(UnitPredictor((96, 128), []), seeds=("ocr_blocks",)).segment(
        np.zeros((96, 128, 3), np.uint8), words=texts, word_boxes=words)
    assert sorted(r.category for r in regions) == ["code", "paragraph"]   # "auto": the unit classifier
    with pytest.raises(ValueError, match="no unit_classifier"):
        PageSegmenter(ScriptedPredictor((96, 128), []), seeds=("ocr_blocks",), class_source="units").segment(
            np.zeros((96, 128, 3), np.uint8), words=texts, word_boxes=words)
