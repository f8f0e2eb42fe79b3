"""scripts/snap_fidelity.py: exact answers snapped as the Predictor snaps masks, scored against themselves."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_snap_fidelity_prints_a_score_per_kind_and_mode_with_words_exact_on_cells():
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "snap_fidelity.py"), "--pages", "6"],
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr
    header, _, words, blocks = out.stdout.strip().splitlines()
    kinds = [c.split(" (n=")[0].strip() for c in header.strip("|").split("|")[1:]]
    assert set(kinds) <= {"cell", "layout", "link", "reading"} and "reading" in kinds
    scores = {mode: [float(v) for v in row.strip("|").split("|")[1:]] for mode, row in (("words", words), ("blocks", blocks))}
    assert all(0 < v <= 100 for row in scores.values() for v in row)
    if "cell" in kinds:                       # a cell's words' box is its target: snapping keeps it
        assert scores["words"][kinds.index("cell")] > 95
