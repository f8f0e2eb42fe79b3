"""read_checkpoint: every way a checkpoint file can be unreadable gives one CheckpointError that
names the file, what is wrong and the fix (and the config option it came from); a save onto a full
disk says so and keeps the previous file."""
import argparse
import re

import numpy as np
import pytest
import torch

from dociq.io.checkpoint import CheckpointError, read_checkpoint


@pytest.fixture
def good(tmp_path):
    path = tmp_path / "good.ckpt"
    torch.save({"state_dict": {"model.w": torch.randn(64, 64), "model.b": torch.zeros(64)},
                "global_step": 3}, path)
    return path


def _missing(tmp_path, good):
    return tmp_path / "nope" / "last.ckpt"


def _directory(tmp_path, good):
    return good.parent            # holds good.ckpt: the message lists it


def _empty(tmp_path, good):
    path = tmp_path / "empty.ckpt"
    path.write_bytes(b"")
    return path


def _truncated(tmp_path, good):
    data = good.read_bytes()
    path = tmp_path / "half.ckpt"
    path.write_bytes(data[: len(data) // 2])
    return path


def _garbage(tmp_path, good):
    path = tmp_path / "random.ckpt"
    path.write_bytes(np.random.default_rng(3).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    return path


def _text(tmp_path, good):
    path = tmp_path / "config.ckpt"
    path.write_text("model:\n  size: tiny\n  image_size: 128\n")
    return path


def _pickled_object(tmp_path, good):
    path = tmp_path / "args.ckpt"                       # e.g. an old checkpoint saving its argparse args
    torch.save({"state_dict": {"w": torch.zeros(2)}, "args": argparse.Namespace(lr=0.1)}, path)
    return path


def _legacy_truncated(tmp_path, good):
    full = tmp_path / "legacy.pt"
    torch.save({"w": torch.randn(64, 64)}, full, _use_new_zipfile_serialization=False)
    path = tmp_path / "legacy_half.pt"
    path.write_bytes(full.read_bytes()[: full.stat().st_size // 2])
    return path


def _plain_pickle(tmp_path, good):
    import pickle

    path = tmp_path / "weights.pkl"
    path.write_bytes(pickle.dumps({"w": [1.0, 2.0]}))
    return path


def _other_zip(tmp_path, good):
    import zipfile

    path = tmp_path / "pages.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("page.txt", "not weights")
    return path


# (file maker, what the message says is wrong)
CASES = {
    "missing": (_missing, "does not exist"),
    "directory": (_directory, "is a directory"),
    "empty": (_empty, "is empty (0 bytes)"),
    "truncated": (_truncated, "truncated"),
    "garbage": (_garbage, "not a PyTorch checkpoint"),
    "text": (_text, "text file"),
    "disallowed global": (_pickled_object, "argparse.Namespace"),
    "legacy truncated": (_legacy_truncated, "truncated or corrupt"),
    "plain pickle": (_plain_pickle, "plain Python pickle"),
    "other zip": (_other_zip, "zip archive torch cannot read"),
}


@pytest.mark.parametrize("case", CASES)
def test_each_failure_names_the_path_the_problem_and_the_fix(case, tmp_path, good):
    make, problem = CASES[case]
    path = make(tmp_path, good)
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(path)
    message = str(info.value)
    assert str(path) in message and problem in message and "Fix:" in message
    assert "\n" not in message                                   # one line for a CLI
    assert info.value.path == str(path)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("case", CASES)
def test_the_config_option_is_named(case, tmp_path, good):
    make, _ = CASES[case]
    with pytest.raises(CheckpointError, match=re.escape("init.from")):
        read_checkpoint(make(tmp_path, good), option="init.from")


def test_missing_file_is_also_a_file_not_found_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_checkpoint(tmp_path / "missing.ckpt")


def test_directory_lists_the_checkpoints_inside(tmp_path, good):
    with pytest.raises(CheckpointError, match="good.ckpt"):
        read_checkpoint(tmp_path)


def test_disallowed_global_is_refused_for_safety_without_suggesting_unsafe_loading(tmp_path, good):
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(_pickled_object(tmp_path, good))
    message = str(info.value)
    assert "safety" in message and "weights_only=False" not in message and "safe_globals" not in message


def test_a_checkpoint_that_is_not_a_dict(tmp_path):
    path = tmp_path / "tensor.pt"
    torch.save(torch.zeros(3), path)
    with pytest.raises(CheckpointError, match="holds a Tensor, not a dict"):
        read_checkpoint(path)


def test_a_good_checkpoint_reads_as_saved(good):
    ckpt = read_checkpoint(good, option="init.from")
    assert ckpt["global_step"] == 3 and ckpt["state_dict"]["model.w"].shape == (64, 64)


def test_the_error_pickles(tmp_path):
    import pickle

    err = CheckpointError(tmp_path / "x.ckpt", "is empty (0 bytes)", "save it again", option="init.from")
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == str(err) and again.option == "init.from"


# ---- every loader of the code base goes through read_checkpoint ------------------------------

def _loaders():
    from dociq.training.heldout import load_task
    from dociq.io.checkpoint import load_state_dict_like
    from dociq.models.image_encoder import load_image_encoder_from_checkpoint
    from dociq.models.text_encoder import _read_hf_state_dict, load_text_encoder_from_checkpoint
    from dociq.inference.predictor import Predictor
    from dociq.training.tasks.ijepa import IJEPATask
    from dociq.training.tasks.pretrain import state_under
    from dociq.training.tasks.finetune import _read_state

    def hf_directory(path):
        (path.parent / "pytorch_model.bin").write_bytes(path.read_bytes())
        return _read_hf_state_dict(path.parent)

    return {
        "predict": (Predictor.from_checkpoint, None),
        "evaluate": (load_task, None),
        "sam weights": (lambda p: load_state_dict_like(p, "load_sam_decoder_state_dict"), None),
        "image encoder": (load_image_encoder_from_checkpoint, None),
        "text encoder": (load_text_encoder_from_checkpoint, None),
        "hf text encoder": (hf_directory, None),
        "pretrain init.from": (lambda p: state_under(str(p), "model."), "init.from"),
        "segment init.from": (lambda p: _read_state(str(p)), "init.from"),
        "ijepa init.from": (lambda p: IJEPATask._load_predictor(None, str(p)), "init.from"),
    }


@pytest.mark.parametrize("loader", list(_loaders()))
@pytest.mark.parametrize("case", ["truncated", "text"])
def test_every_loader_raises_the_checkpoint_error(loader, case, tmp_path, good):
    load, option = _loaders()[loader]
    path = CASES[case][0](tmp_path, good)
    named = path.parent / "pytorch_model.bin" if loader == "hf text encoder" else path
    with pytest.raises(CheckpointError) as info:
        load(path)
    assert str(named) in str(info.value)
    if option:
        assert option in str(info.value)


def _fill_disk_during_save(monkeypatch, free_after: int, error: BaseException):
    """torch.save writes part of the archive and then fails as it does on a full disk."""
    import shutil
    from collections import namedtuple

    import dociq.io.checkpoint as checkpoint

    def failing_save(obj, f):
        f.write(b"PK\x03\x04" + b"\0" * 4096)
        raise error

    monkeypatch.setattr(checkpoint.torch, "save", failing_save)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9 - free_after, free_after))
    return checkpoint.atomic_torch_save


@pytest.mark.parametrize("error", [RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 4100 "
                                                "vs 4000"), OSError(28, "No space left on device")])
def test_a_save_onto_a_full_disk_says_so_and_keeps_the_previous_file(monkeypatch, tmp_path, error):
    path = tmp_path / "last.ckpt"
    path.write_bytes(b"previous")
    save = _fill_disk_during_save(monkeypatch, free_after=5000, error=error)
    with pytest.raises(OSError, match=r"last\.ckpt: the disk is full \(0 MiB free.*paths\.output_dir") as info:
        save({"w": torch.zeros(2)}, path)
    assert info.value.errno == 28
    assert path.read_bytes() == b"previous"
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # no partial temporary file left


def test_a_save_failing_with_room_to_spare_keeps_its_own_error(monkeypatch, tmp_path):
    save = _fill_disk_during_save(monkeypatch, free_after=10**9, error=RuntimeError("some other failure"))
    with pytest.raises(RuntimeError, match="some other failure"):
        save({"w": torch.zeros(2)}, tmp_path / "last.ckpt")
