"""Files written atomically: a temp file in the target's folder, fsynced, then `os.replace`d over
it, so a reader (or a crash) never sees half a file. The one implementation every writer uses;
`atomic_folder` does the same for a folder of files (a model folder).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _read_umask() -> int:
    mask = os.umask(0o022)       # the only way to read it is to set it: once, at import
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def file_mode() -> int:
    """The mode a new file gets under this process's umask (mkstemp's 0600 would hide results from
    other users)."""
    return 0o666 & ~_UMASK


@contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """`with atomic_file(p) as tmp: write(tmp)`: a temp file in `p`'s folder that replaces `p` (fsynced,
    os.replace) when the block ends without an error, and is removed when it raises: a writer that
    only takes a file name (a library's save) writes atomically too."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def atomic_folder(path: str | Path) -> Iterator[Path]:
    """`with atomic_folder(p) as tmp: fill(tmp)`: a temp folder next to `p` that becomes `p` when the
    block ends without an error, and is removed when it raises. A `p` already there (the caller
    chose to replace it) is removed just before the rename, so `p` is never half-written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        tmp.chmod(0o777 & ~_UMASK)            # mkdtemp makes 0700; the folder gets the usual mode
        yield tmp
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write via a temp file in the same directory + os.replace: readers never see half a file."""
    with atomic_file(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))
