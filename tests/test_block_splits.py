"""scripts/block_splits.py: why a target's lines fall into different text blocks."""
from collections import Counter

import numpy as np

from dociq.data.schema import Page, Question
from script_module import load_script


def _page(second_gap: float, confidences: bool = False) -> Page:
    """A paragraph of three 10-px lines, the third `second_gap` px below the second; one reading
    question whose target is the whole paragraph."""
    boxes = []
    for y in (30, 43, 53 + second_gap):
        boxes += [[20, y, 90, y + 10], [95, y, 160, y + 10]]
    boxes = np.array(boxes, np.float32)
    target = np.zeros((120, 200), bool)
    target[30:int(boxes[:, 3].max()), 20:160] = True
    return Page(image=np.full((120, 200, 3), 255, np.uint8), words=["word"] * len(boxes), word_boxes=boxes,
                questions=[Question("which paragraph mentions word?", "reading", target)], meta={"page_id": "p#0"},
                word_confidences=np.full(len(boxes), 90.0, np.float32) if confidences else None)


def test_a_paragraph_kept_whole_has_no_reasons_and_one_too_far_apart_names_the_gap():
    script = load_script("block_splits")
    (whole,) = script.split_reasons(_page(3.0))
    assert whole["kind"] == "reading" and whole["blocks"] == 1 and +whole["reasons"] == Counter()
    (apart,) = script.split_reasons(_page(12.0))          # 12 px between 10-px lines: a paragraph's break
    assert apart["blocks"] == 2 and +apart["reasons"] == Counter({"near": 1})
    assert script.split_reasons(_page(12.0, confidences=True))[0]["blocks"] == 2


def test_the_table_counts_split_targets_and_reasons_per_view_and_kind():
    rows = {"scanned": [{"kind": "reading", "blocks": 2, "reasons": Counter({"near": 2, "height": 1})},
                        {"kind": "reading", "blocks": 1, "reasons": Counter()}]}
    lines = load_script("block_splits").table(rows).splitlines()
    assert lines[0] == "| pages | questions | split | height | near |"
    assert lines[2] == "| scanned | reading (2) | 1 (50 %) | 1 | 2 |"


def test_a_labelled_regions_lines_are_asked_about_as_a_questions_target_is():
    from dociq.data.schema import Region

    script = load_script("block_splits")
    page = _page(12.0)
    page.regions = [Region("code", np.array([20, 30, 160, 75]), page.questions[0].mask, word_ids=list(range(6)))]
    (record,) = script.split_reasons(page, region_class="code")
    assert record["kind"] == "code" and record["blocks"] == 2 and +record["reasons"] == Counter({"near": 1})
    assert script.split_reasons(page, region_class="list_item") == []


def test_a_row_parted_at_a_wide_gap_is_named_as_such():
    script = load_script("block_splits")
    boxes = np.array([[20, 30, 60, 40], [65, 30, 100, 40],        # one row, parted by a 40-px gap
                      [140, 30, 180, 40], [20, 43, 100, 53], [105, 43, 180, 53]], np.float32)
    target = np.zeros((80, 200), bool)
    target[30:53, 20:180] = True
    page = Page(image=np.full((80, 200, 3), 255, np.uint8), words=["word"] * 5, word_boxes=boxes,
                questions=[Question("which paragraph mentions word?", "reading", target)], meta={"page_id": "p#0"})
    (record,) = script.split_reasons(page)
    assert record["blocks"] == 2 and record["reasons"]["one row parted"] == 1 and record["reasons"]["below"] == 0
