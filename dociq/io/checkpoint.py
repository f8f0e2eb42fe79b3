"""Checkpoint files: written so they are never half-written, read with one clear error.

Writing: save to a temporary file, fsync, then rename. A crash or SIGKILL during a save leaves the
previous checkpoint intact, because `os.replace` is atomic on POSIX file systems and the temporary
file sits in the same directory.

Reading: `read_checkpoint` is the one `torch.load` of the code base (weights only, on the CPU); a
file it cannot read raises `CheckpointError` naming the file, what is wrong with it and the fix.
Nothing here imports Lightning: training's `AtomicCheckpointIO` (dociq/training/checkpoint_io.py)
plugs `atomic_torch_save` into the Trainer.

Extracting: `model_state_dict` (the `model.*` part of a Lightning state dict, prefix removed),
`strip_prefix` (the sub-module under the first prefix that occurs) and `load_state_dict_like` (a
state dict given directly or as a path) are the one place a state dict is cut out of a checkpoint.
"""
from __future__ import annotations

import errno
import os
import pickle
import re
import shutil
import tempfile
import warnings
import zipfile
from pathlib import Path
from typing import Any, Mapping

import torch

from dociq.io.atomic import file_mode


def atomic_torch_save(obj: Any, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, file_mode())  # mkstemp makes 0600; a checkpoint gets the usual mode
        os.replace(tmp, path)
    except BaseException as err:
        written = Path(tmp).stat().st_size if Path(tmp).exists() else 0
        Path(tmp).unlink(missing_ok=True)
        full = _disk_full_error(path, written, err)
        if full is not None:
            raise full from err
        raise


def _disk_full_error(path: Path, written: int, err: BaseException) -> OSError | None:
    """An OSError(ENOSPC) naming the checkpoint and the free space when the save failed for lack of
    room, else None. torch's zip writer reports a full disk as "unexpected pos ..." rather than ENOSPC,
    so a RuntimeError counts as one when the disk, with the partial file removed, has less room than
    twice what was written."""
    free = shutil.disk_usage(path.parent).free
    if isinstance(err, OSError):
        full = err.errno in (errno.ENOSPC, errno.EDQUOT)
    else:
        full = isinstance(err, RuntimeError) and free < 2 * written
    if not full:
        return None
    return OSError(errno.ENOSPC, f"checkpoint {path}: the disk is full ({free / 2**20:.0f} MiB free after "
                   f"removing the {written / 2**20:.0f} MiB partial file); the previous checkpoint is kept. "
                   "Fix: free space on that disk, or set paths.output_dir to a larger one", str(path))


# ---- reading ---------------------------------------------------------------------------------

class CheckpointError(ValueError):
    """A checkpoint file that cannot be used. `str(err)` reads
    "checkpoint <path> [(<option>)]: <reason>. Fix: <fix>"."""

    def __init__(self, path: str | Path, reason: str, fix: str, option: str | None = None):
        self.path = str(path)
        self.reason = reason
        self.fix = fix
        self.option = option
        where = f" (given as {option})" if option else ""
        super().__init__(f"checkpoint {self.path}{where}: {reason}. Fix: {fix}")

    def __reduce__(self):  # picklable across processes (DDP, DataLoader workers)
        return (type(self), (self.path, self.reason, self.fix, self.option))


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """A checkpoint path that does not exist (also a FileNotFoundError, as callers expect)."""

    def __str__(self) -> str:  # OSError's own __str__ would print only the reason
        return ValueError.__str__(self)


_ZIP_MAGIC = b"PK\x03\x04"          # torch.save's default format is a zip archive
_PICKLE_PROTOCOL = 0x80               # pickles (protocol >= 2) start with the PROTO opcode
_LEGACY_MAGIC = b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19"   # torch's pre-zip format: a pickled magic number
_UNSAFE_GLOBAL = re.compile(r"Unsupported global: GLOBAL (\S+)")
_CHECKPOINT_SUFFIXES = (".ckpt", ".pt", ".pth", ".bin")


def read_checkpoint(path: str | os.PathLike, *, option: str | None = None) -> dict:
    """`torch.load(path, map_location="cpu", weights_only=True)`, a dict, or a `CheckpointError`.

    `option` is the config option that gave the path (e.g. "init.from"); the error names it."""
    path = Path(path)
    fail = _failure(path, option)
    if not path.exists():
        raise CheckpointNotFoundError(path, "does not exist", _set(option, "the path of an existing checkpoint "
                                      "file (e.g. <run>/checkpoints/last.ckpt)"), option)
    if path.is_dir():
        inside = sorted(p.name for p in path.iterdir() if p.suffix in _CHECKPOINT_SUFFIXES)[:5]
        holds = f" (it holds {', '.join(inside)})" if inside else ""
        raise fail(f"is a directory, not a checkpoint file{holds}", _set(option, "a checkpoint file inside it, "
                   "e.g. <run>/checkpoints/last.ckpt"))
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError as err:
        raise fail(f"cannot be opened ({err.strerror or err})", "check the file's permissions") from err
    if size == 0:
        raise fail("is empty (0 bytes): its save or copy was interrupted",
                   "delete it and use an earlier checkpoint, or copy the file again from its source")
    try:
        with warnings.catch_warnings():  # torch warns about a plain pickle's protocol before failing on it
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises RuntimeError, OSError, EOFError, UnicodeDecodeError, ...
        raise _explain(path, head, size, err, option) from err
    if not isinstance(ckpt, dict):
        raise fail(f"holds a {type(ckpt).__name__}, not a dict (a state dict or a Lightning checkpoint)",
                   "save a dict, e.g. torch.save(model.state_dict(), path)")
    return ckpt


def read_finetune_checkpoint(path: str | os.PathLike) -> dict:
    """A `stage=finetune` Lightning checkpoint (state_dict + hyper_parameters.model), read as
    `read_checkpoint` does; a missing file or another kind of checkpoint is a `CheckpointError`."""
    path = Path(path)
    if not path.exists():
        raise CheckpointNotFoundError(path, "does not exist", "pass a .ckpt written by `python train.py "
                                      "stage=finetune` (<run>/checkpoints/last.ckpt)")
    ckpt = read_checkpoint(path)
    hparams = ckpt.get("hyper_parameters")
    if not hparams or "model" not in hparams or "state_dict" not in ckpt:
        raise CheckpointError(path, "is not a stage=finetune Lightning checkpoint (no hyper_parameters.model "
                              "or state_dict)", "give the checkpoint of a `python train.py stage=finetune` run")
    return ckpt


def _set(option: str | None, what: str) -> str:
    return f"set {option} to {what}" if option else f"give {what}"


def _failure(path: Path, option: str | None):
    return lambda reason, fix: CheckpointError(path, reason, fix, option)


def _explain(path: Path, head: bytes, size: int, err: Exception, option: str | None) -> CheckpointError:
    """Why torch.load failed, judged from the file's format rather than torch's message."""
    fail = _failure(path, option)
    recopy = "copy the file again from its source, or use an earlier checkpoint"
    unsafe = _UNSAFE_GLOBAL.search(str(err)) if isinstance(err, pickle.UnpicklingError) else None
    if head.startswith(_ZIP_MAGIC):
        if not zipfile.is_zipfile(path):  # no end-of-archive record: the tail of the file is missing
            return fail(f"is truncated ({size} bytes, the zip archive has no end record): its save or copy "
                        "was interrupted", recopy)
        if unsafe is None:
            return fail(f"is a zip archive torch cannot read as a checkpoint{_detail(err)}",
                        "give a file written by torch.save or Lightning (.ckpt/.pt/.pth); if it is one, "
                        "copy it again from its source")
    if unsafe is not None and (head.startswith(_ZIP_MAGIC) or head[:1] == bytes([_PICKLE_PROTOCOL])):
        return fail(f"holds a pickled Python object ({unsafe.group(1)}) that dociq refuses to load for safety: "
                    "unpickling objects can run arbitrary code, so only tensors, numbers, strings and "
                    "containers are read", "re-save it holding only those, e.g. "
                    "torch.save({'state_dict': model.state_dict()}, path)")
    if head.startswith(_LEGACY_MAGIC):
        return fail(f"is a legacy (pre-zip) torch file that is truncated or corrupt{_detail(err)}", recopy)
    if head[:1] == bytes([_PICKLE_PROTOCOL]):
        return fail("is a plain Python pickle, not a file written by torch.save",
                    "save the weights with torch.save, e.g. torch.save(model.state_dict(), path)")
    if _is_text(head):
        lines = head.decode("utf-8", errors="replace").splitlines()
        start = next((line.strip() for line in lines if line.strip()), "")[:40]
        return fail(f"is a text file, not a PyTorch checkpoint (it starts with {start!r})",
                    "give the .ckpt/.pt file written by torch.save or Lightning, not a config, log or list")
    return fail(f"is not a PyTorch checkpoint (unknown format; it starts with bytes {head[:8].hex(' ')})",
                "give a file written by torch.save or Lightning (.ckpt/.pt/.pth)")


def _is_text(head: bytes) -> bool:
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as err:  # a multi-byte character cut at the end of `head` is still text
        if err.start < len(head) - 3:
            return False
        text = head[:err.start].decode("utf-8")
    return all(c.isprintable() or c in "\t\r\n" for c in text)


def _detail(err: Exception) -> str:
    """torch's own reason, when it says more than its generic weights_only advice."""
    text = str(err)
    if "Weights only load failed" in text:
        text = text.split("WeightsUnpickler error:", 1)[1] if "WeightsUnpickler error:" in text else ""
    text = " ".join(text.split())[:120]
    return f" ({type(err).__name__}: {text})" if text else ""


# ---- extracting a state dict -----------------------------------------------------------------

def model_state_dict(state: Mapping[str, Any], prefix: str = "model.", *, tensors_only: bool = False) -> dict:
    """The entries of `state` under `prefix`, with the prefix removed (e.g. a task's `model.*`
    tensors as the model's own state dict); `tensors_only` drops entries that are not tensors."""
    return {k[len(prefix):]: v for k, v in state.items()
            if k.startswith(prefix) and (not tensors_only or torch.is_tensor(v))}


def strip_prefix(state: dict, prefixes: tuple[str, ...]) -> dict:
    """Keep only the keys under the first prefix that occurs (a sub-module of a full checkpoint), unprefixed."""
    for prefix in prefixes:
        if any(k.startswith(prefix) for k in state):
            return model_state_dict(state, prefix)
    return state


def load_state_dict_like(state_dict_or_path: Mapping[str, torch.Tensor] | str | os.PathLike, what: str) -> dict:
    """A state dict given directly or as a checkpoint path (`read_checkpoint`), unwrapping {"model": ...}."""
    if isinstance(state_dict_or_path, (str, os.PathLike)):
        path = os.fspath(state_dict_or_path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{what}: checkpoint {path!r} does not exist; pass the path of a local .pth file")
        state = read_checkpoint(path)
    else:
        state = state_dict_or_path
    if isinstance(state, Mapping) and isinstance(state.get("model"), Mapping):  # SAM 2 checkpoints
        state = state["model"]
    if not isinstance(state, Mapping):
        raise TypeError(f"{what}: expected a state dict (name -> tensor), got {type(state).__name__}")
    return dict(state)
