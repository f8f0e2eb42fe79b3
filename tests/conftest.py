"""Test-wide settings: nothing may reach a hub, loggers stay offline, torch stays on few threads."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402
from pdf_bytes import pdf_from_objects  # noqa: E402

# One thread: the models under test are tiny, and small ops on two busy cores wait on each other.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _process_left_as_found():
    """Each test leaves the process as it found it. An in-process Lightning run with a DDP strategy
    sets OMP_NUM_THREADS, MASTER_PORT, LOCAL_RANK and torch's threads and keeps its process group;
    a later two-process run that inherits OMP_NUM_THREADS=2 gives each rank two threads on two
    cores, and runs several times slower."""
    env, threads = dict(os.environ), torch.get_num_threads()
    yield
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    os.environ.clear()
    os.environ.update(env)
    torch.set_num_threads(threads)


@pytest.fixture
def repo_root():
    from pathlib import Path

    return Path(__file__).resolve().parent.parent


# A small variant of model=tiny for fine-tuning tests: 128-px pages, one text/fusion layer, the word
# grounding of questions alone (no clicked words, text blocks or box words), no click maps, word
# classes or relative token height. The overrides, completed from configs/model/tiny.yaml where a
# model is built.
SMALL_SEGMENTATION_MODEL = {"size": "tiny", "image_size": 128, "fusion": {"depth": 1},
                            "text_encoder": {"num_hidden_layers": 1, "relative_height": False},
                            "grounding": {"click_words": False, "text_blocks": False, "box_words": False},
                            "click_maps": False, "word_classes": False}


@pytest.fixture(scope="module")
def finetune_checkpoint(tmp_path_factory):
    """(path, task): an untrained stage=finetune checkpoint as Lightning writes it (state_dict +
    the task's hyper-parameters), and the task it came from."""
    from dociq.models.sizes import complete_model_config
    from dociq.training.tasks.finetune import FinetuneTask

    torch.manual_seed(0)
    task = FinetuneTask(model=complete_model_config(SMALL_SEGMENTATION_MODEL))
    path = tmp_path_factory.mktemp("ckpt") / "finetune.ckpt"
    torch.save({"state_dict": task.state_dict(), "hyper_parameters": dict(task.hparams)}, path)
    return path, task


def write_text_pdf(pages, width: int, height: int) -> bytes:
    """A born-digital PDF: one content stream per page of Helvetica text (standard-14, not embedded);
    `pages` holds, per page, (font size, x, baseline y, text) lines in PDF points."""
    n = len(pages)
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b" ".join(b"%d 0 R" % (4 + 2 * i) for i in range(n)), n),
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    for i, lines in enumerate(pages):
        content = "".join(f"BT /F1 {s} Tf {x} {y} Td ({t}) Tj ET\n" for s, x, y, t in lines).encode()
        objs.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 {width} {height}] "
                    f"/Resources << /Font << /F1 3 0 R >> >> /Contents {5 + 2 * i} 0 R >>".encode())
        objs.append(b"<< /Length %d >>\nstream\n" % len(content) + content + b"endstream")
    return pdf_from_objects(objs)


@pytest.fixture(scope="session")
def text_pdf():
    """`text_pdf(pages, width, height) -> bytes`: a PDF with a real text layer, written here."""
    return write_text_pdf
