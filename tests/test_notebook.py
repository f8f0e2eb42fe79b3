"""notebooks/inspect_masks.ipynb executes top to bottom: untrained tiny model (no checkpoint), and a
fine-tuned checkpoint given by a path relative to the repository (the kernel runs elsewhere)."""
import os

import nbformat
from nbclient import NotebookClient


def _execute(repo_root, monkeypatch, tmp_path) -> tuple[str, list]:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(repo_root), os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(repo_root / "notebooks" / "inspect_masks.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    # the page, the question masks, the box/click masks, the refinement, the automatic segmentation
    assert len(images) >= 5
    return text, images


def test_inspect_masks_notebook_runs(repo_root, monkeypatch, tmp_path):
    monkeypatch.delenv("DOCIQ_CHECKPOINT", raising=False)
    text, _ = _execute(repo_root, monkeypatch, tmp_path)
    assert "untrained tiny (128 px)" in text and "OCR words" in text
    assert "after one click" in text and "regions:" in text


def test_notebook_takes_a_checkpoint_relative_to_the_repository(repo_root, monkeypatch, tmp_path,
                                                                 finetune_checkpoint):
    path, _ = finetune_checkpoint
    relative = os.path.relpath(path, repo_root)
    assert not os.path.isabs(relative) and not (tmp_path / relative).exists()
    monkeypatch.setenv("DOCIQ_CHECKPOINT", relative)
    text, _ = _execute(repo_root, monkeypatch, tmp_path)
    assert f"checkpoint {path.resolve()}" in text
