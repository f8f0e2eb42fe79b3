"""notebooks/inspect_masks.ipynb executes top to bottom (untrained tiny model, no checkpoint)."""
import os

import nbformat
from nbclient import NotebookClient


def test_inspect_masks_notebook_runs(repo_root, monkeypatch, tmp_path):
    monkeypatch.delenv("DOCIQ_CHECKPOINT", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(repo_root), os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(repo_root / "notebooks" / "inspect_masks.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "untrained tiny (128 px)" in text and "OCR words" in text
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 3    # the page, the question masks, the box/click masks
