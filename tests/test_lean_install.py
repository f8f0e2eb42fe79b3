"""What `pip install dociq` without extras must do: predict, evaluate and export a checkpoint.

The extras' packages are installed in the test environment, so each command runs in a subprocess
where they look absent: every import finder finds no module and no distribution of theirs (which
is also what lets timm skip wandb). pyproject.toml's lists are checked in
tests/test_install_extras.py; this checks that the code needs nothing more.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# top-level modules of the extras (train, corpus, engine, ocr, export, onnx, segment)
EXTRAS_MODULES = ("lightning", "lightning_fabric", "pytorch_lightning", "hydra", "omegaconf", "optuna", "wandb",
                  "tensorboard", "galore_torch", "matplotlib", "litdata", "pdfplumber", "playwright", "fastapi",
                  "uvicorn", "multipart", "pytesseract", "onnx", "onnxscript", "onnxruntime", "docling_core")
# their distributions, hidden from importlib.metadata too (torchmetrics asks it whether matplotlib is there)
EXTRAS_DISTRIBUTIONS = ("lightning", "pytorch-lightning", "hydra-core", "omegaconf", "optuna", "hydra-optuna-sweeper",
                        "wandb", "tensorboard", "galore-torch", "matplotlib", "litdata", "pdfplumber", "playwright",
                        "fastapi", "uvicorn", "python-multipart", "pytesseract", "onnx", "onnxscript", "onnxruntime",
                        "docling-core")
BLOCKER = textwrap.dedent(f"""
    import sys
    BLOCKED = set({EXTRAS_MODULES!r})
    HIDDEN = set({EXTRAS_DISTRIBUTIONS!r})
    class NotInstalled:
        # every finder answers "no such module" for the extras' packages and hides their
        # distributions: `import x` raises ModuleNotFoundError, importlib.util.find_spec (dynamo's
        # probe) gives None and importlib.metadata (torchmetrics' probe) finds no such package
        def __init__(self, finder):
            self.finder = finder
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                return None
            return self.finder.find_spec(name, path, target)
        def find_distributions(self, *args, **kwargs):
            found = getattr(self.finder, "find_distributions", lambda *a, **k: [])(*args, **kwargs)
            return [d for d in found if (d.metadata["Name"] or "").lower().replace("_", "-") not in HIDDEN]
        def __getattr__(self, attr):
            return getattr(self.finder, attr)
    sys.meta_path[:] = [NotInstalled(f) for f in sys.meta_path]
    from dociq.cli import main
    code = main(sys.argv[1:])
    loaded = sorted(m for m in BLOCKED if sys.modules.get(m) is not None)
    assert not loaded, f"extras' modules were imported: {{loaded}}"
    sys.exit(code)
""")


def lean(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "DOCIQ_DEBUG": "1"}
    return subprocess.run([sys.executable, "-c", BLOCKER, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def page_pdf(tmp_path_factory, text_pdf):
    path = tmp_path_factory.mktemp("pdf") / "page.pdf"
    path.write_bytes(text_pdf([[(18, 72, 720, "Annual report"), (11, 72, 680, "The total is 42 euros.")]], 612, 792))
    return path


def test_predict_eval_and_export_need_no_extra(finetune_checkpoint, page_pdf, tmp_path):
    ckpt, _task = finetune_checkpoint
    out = lean("predict", str(ckpt), "--pdf", str(page_pdf), "--page", "1", "--question", "the title",
               "--out", str(tmp_path / "overlay.png"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "overlay.png").stat().st_size > 0 and "the title" in out.stdout

    out = lean("eval", str(ckpt), "--pages", "2", "--max-questions", "2", "--json", str(tmp_path / "eval.json"),
               cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert '"question"' in (tmp_path / "eval.json").read_text()

    out = lean("export", str(ckpt), str(tmp_path / "exported"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "exported" / "model.safetensors").is_file()
