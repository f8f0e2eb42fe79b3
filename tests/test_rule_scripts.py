"""scripts/figure_answers.py and scripts/click_choice_rules.py: their tables, scored from saved
collections (no model, no corpus)."""
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SHAPE = (100, 80)


def _pack(mask):
    return mask.shape, np.packbits(mask)


def _box(x0, y0, x1, y1):
    out = np.zeros(SHAPE, bool)
    out[y0:y1, x0:x1] = True
    return out


def _table(script: str, rows: list, tmp_path) -> dict[str, list[str]]:
    saved = tmp_path / "rows.pkl"
    saved.write_bytes(pickle.dumps(rows))
    out = subprocess.run([sys.executable, str(REPO / "scripts" / script), "--load", str(saved)],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.strip().splitlines() if line.startswith("| ")]
    return {cells[0]: cells[1:] for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines)}


def test_figure_rules_score_the_pages_pictures_against_the_target(tmp_path):
    drawings = np.array([[10, 10, 50, 40],      # a plot: 1,200 px, no words inside
                         [10, 60, 70, 80],      # a frame around a line of text (text share 0.35)
                         [60, 5, 62, 7]])       # a speck: under 0.5 % of the page
    rows = [dict(package="p", page_id="a#p0", text="all figures", one=False, target=_pack(_box(10, 10, 50, 40)),
                 drawings=drawings, text_share=np.array([0.0, 0.35, 0.0])),
            dict(package="q", page_id="b#p0", text="segment the figure", one=True, target=_pack(_box(10, 60, 70, 80)),
                 drawings=drawings, text_share=np.array([0.0, 0.35, 0.0]))]
    table = _table("figure_answers.py", rows, tmp_path)
    default = next(v for k, v in table.items() if k.endswith("(no model)"))
    assert default == ["50.0", "100.0", "0.0"]           # all, p, q: the framed text is no figure
    assert table["text < 0.05, at least 0.5% of the page"] == ["50.0", "100.0", "0.0"]
    assert float(table["text < 0.4, at least 0.2% of the page"][0]) < 50   # now the frame joins the plot


def test_with_the_decoders_masks_its_choice_of_a_single_figure_is_scored_too(tmp_path):
    drawings = np.array([[10, 10, 50, 40], [10, 60, 40, 90]])           # two plots, the first larger
    blobs = _box(20, 70, 25, 75)                                        # the decoder paints a blob of the second
    rows = [dict(package="p", page_id="a#p0", text="segment the figure", one=True, target=_pack(_box(10, 60, 40, 90)),
                 drawings=drawings, text_share=np.zeros(2), decoder=_pack(blobs))]
    table = _table("figure_answers.py", rows, tmp_path)
    assert table["the decoder's mask (snapped)"][0] == f"{100 * 25 / 900:.1f}"
    assert next(v for k, v in table.items() if k.endswith("the decoder's mask choosing one"))[0] == "100.0"
    assert next(v for k, v in table.items() if k.endswith("(the Predictor's)"))[0] == "0.0"   # the largest
    assert next(v for k, v in table.items() if k.endswith("(no model)"))[0] == "0.0"


def test_click_rules_pick_one_candidate_each(tmp_path):
    line, block, column = _box(5, 5, 40, 12), _box(5, 5, 40, 30), _box(5, 5, 40, 90)
    rows = [dict(package="p", size="small", label="paragraph", target=_pack(block), chosen=_pack(column),
                 candidates=[_pack(line), _pack(block), _pack(column)], scores=np.array([0.2, 0.9, 0.5])),
            dict(package="p", size="medium", label="list_item", target=_pack(line), chosen=_pack(line),    # one empty
                 candidates=[_pack(np.zeros(SHAPE, bool)), _pack(line), _pack(column)], scores=np.array([0.3, 0.4, 0.8]))]
    table = _table("click_choice_rules.py", rows, tmp_path)
    assert table["rule"][:3] == ["all (2)", "small (1)", "medium (1)"]
    column_on_block = 100 * block.sum() / column.sum()
    assert table["the Predictor's answer"][:3] == [f"{(column_on_block + 100) / 2:.1f}", f"{column_on_block:.1f}", "100.0"]
    assert table["highest predicted IoU"][:3] == [f"{(100 + 100 * line.sum() / column.sum()) / 2:.1f}", "100.0",
                                                  f"{100 * line.sum() / column.sum():.1f}"]
    assert table["the smallest not empty (the innermost)"][1:3] == [f"{100 * line.sum() / block.sum():.1f}", "100.0"]
    assert table["the best (oracle)"][:3] == ["100.0", "100.0", "100.0"]


def test_a_rule_script_without_a_checkpoint_or_a_collection_says_what_to_give():
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "click_choice_rules.py")],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 2
    assert "give a checkpoint, or --load a saved collection" in out.stderr
