"""scripts/class_answer_rules.py: the decoder's, the head's and mixed answers to class questions,
scored per class from a saved collection (no model)."""
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def _pack(mask):
    return mask.shape, np.packbits(mask)


def _box(x0, y0, x1, y1, shape=(40, 60)):
    out = np.zeros(shape, bool)
    out[y0:y1, x0:x1] = True
    return out


def test_the_rules_table_scores_each_answer_against_its_target(tmp_path):
    boxes = np.array([[5, 5, 25, 10], [30, 30, 40, 36]], float)     # a line of text, a page number
    rows = [
        # "the page number": the decoder missed it, the head's likeliest unit is it
        dict(label="page_number", one=True, text="the page number", package="p",
             target=_pack(_box(30, 30, 40, 36)), decoder=_pack(np.zeros((40, 60), bool)), boxes=boxes,
             head=np.array([0.1, 0.9]), prob=np.zeros(2), cover=np.zeros(2)),
        # "all code listings": the listing is its frame; the decoder painted the frame, the head one line
        dict(label="code", one=False, text="all code listings", package="p",
             target=_pack(_box(0, 0, 30, 20)), decoder=_pack(_box(0, 0, 30, 20)), boxes=boxes,
             head=np.array([0.8, 0.1]), prob=np.array([0.9, 0.0]), cover=np.array([1.0, 0.0])),
    ]
    saved = tmp_path / "rows.pkl"
    saved.write_bytes(pickle.dumps(rows))
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "class_answer_rules.py"), "--load", str(saved)],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert [c.strip() for c in lines[0].strip("|").split("|")] == ["rule", "all (2)", "code (1)", "page_number (1)"]
    table = {cells[0]: [float(v) for v in cells[1:]]
             for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines[2:])}
    line_in_frame = 100 * 100 / 600                                  # one 20 x 5 line of a 30 x 20 frame
    assert table["decoder"] == [50.0, 100.0, 0.0]
    assert table["head, every class"] == [round((line_in_frame + 100) / 2, 1), round(line_in_frame, 1), 100.0]
    assert table["head, code listings from the decoder"] == [100.0, 100.0, 100.0]
