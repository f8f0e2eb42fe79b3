"""Test-wide settings: nothing may reach a hub, loggers stay offline, torch stays on few threads."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

# One thread: the models under test are tiny, and small ops on two busy cores wait on each other.
torch.set_num_threads(1)


@pytest.fixture
def repo_root():
    from pathlib import Path

    return Path(__file__).resolve().parent.parent


# A small variant of model=tiny (128-px pages, one text/fusion layer) for fine-tuning tests.
SMALL_SEGMENTATION_MODEL = {"size": "tiny", "image_size": 128, "mask_unit_px": 32, "image_encoder": {},
                            "text_encoder": {"num_hidden_layers": 1}, "fusion": {"depth": 1},
                            "prompt_encoder": {}, "mask_decoder": {}}


@pytest.fixture(scope="module")
def finetune_checkpoint(tmp_path_factory):
    """(path, task): an untrained stage=finetune checkpoint as Lightning writes it (state_dict +
    the task's hyper-parameters), and the task it came from."""
    from dociq.tasks.segment import SegmentTask

    torch.manual_seed(0)
    task = SegmentTask(model=SMALL_SEGMENTATION_MODEL)
    path = tmp_path_factory.mktemp("ckpt") / "finetune.ckpt"
    torch.save({"state_dict": task.state_dict(), "hyper_parameters": dict(task.hparams)}, path)
    return path, task
