"""scripts/snap_ceiling.py: a perfect mask snapped to a page's text blocks, level and skewed."""
import numpy as np
import pytest

from dociq.data.schema import Page, Question
from dociq.models.word_snap import fill_unit
from script_module import load_script


def _script():
    return load_script("snap_ceiling")


def _page(degrees: float) -> Page:
    """Two paragraphs of four and three 600-px lines, turned `degrees`; a reading question whose
    target is the first paragraph drawn along its lines, as a scan's target is."""
    slope = np.tan(np.radians(degrees))
    boxes = []
    for y in (30, 43, 56, 69, 102, 115, 128):
        for x0 in np.linspace(20, 560, 10):
            shift = slope * (x0 + 30)
            boxes.append([x0 + 1, y + shift, x0 + 59, y + 10 + shift])
    boxes = np.array(boxes, np.float32)
    target = np.zeros((200, 660), bool)
    fill_unit(target, boxes[:40].astype(np.float64), slope)
    return Page(image=np.full((200, 660, 3), 255, np.uint8), words=["word"] * len(boxes), word_boxes=boxes,
                questions=[Question("which paragraph mentions word?", "reading", target)], meta={"page_id": "p#0"})


@pytest.mark.parametrize("degrees", [0.0, 2.0])
def test_a_paragraphs_perfect_mask_snaps_to_the_paragraph_level_or_skewed(degrees):
    (record,) = _script().page_ceilings(_page(degrees))
    assert record["kind"] == "reading"
    assert record["best unit"] > 0.95 and record["units inside"] > 0.95 and record["snapped target"] > 0.95


def test_the_table_gives_each_view_and_kind_its_means():
    rows = {"clean": [{"kind": "reading", "snapped target": 1.0, "units inside": 0.5, "best unit": 0.5},
                      {"kind": "reading", "snapped target": 0.5, "units inside": 0.5, "best unit": 0.25}]}
    lines = _script().table(rows).splitlines()
    assert lines[2] == "| clean | reading (2) | 75.0 | 50.0 | 37.5 |"


def test_a_scans_rotation_is_read_from_its_degradations():
    script = _script()
    page = _page(0.0)
    assert script.rotation(page) == 0.0
    page.meta["degradations"] = ["rotate(-1.37)", "blur(0.50)"]
    assert script.rotation(page) == pytest.approx(1.37)
    assert [script.rotation_group(d) for d in (0.0, 0.4, 1.37)] == ["level", "under 1°", "1° or more"]
