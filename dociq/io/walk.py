"""The folder walk of every command that reads a folder of documents (`dociq segment`, `dociq corpus
build`): the files of the kinds asked for, and every file or folder left out with the reason.

    found = walk_documents("docs/", kind_of)          # kind_of(name) -> "pdf", "image", ... or None
    for doc in found.files: ...                       # WalkedFile(path, parts, kind), sorted
    for line in skip_report(found.skipped): print(line, file=sys.stderr)

One bad entry never stops the walk: an unreadable subfolder, an unreadable file, a file name that
is not valid UTF-8 (it would crash every later `str.encode`: doc ids, JSON, log lines), a broken or
looping link, a FIFO or a file of an unknown kind is recorded in `skipped` and the walk goes on.
Hidden folders are left out (they hold partial extractions); linked folders are not followed; a
link to a file is kept when it points inside the root and its target is not listed under another
name. Only the root itself is an error when it is missing or cannot be read.
"""
from __future__ import annotations

import os
import stat
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

# the reasons a walk leaves an entry out (the keys of `WalkResult.counts`)
UNKNOWN_KIND = "not a document type this command reads"
NOT_UTF8 = "name is not valid UTF-8 (rename it, e.g. `convmv -f latin1 -t utf-8 --notest`)"
UNREADABLE = "cannot be read"
HIDDEN = "hidden folder"
LINKED_FOLDER = "link to a folder (not followed)"
BROKEN_LINK = "broken or looping link"
OUTSIDE_LINK = "link to a file outside the folder"
DUPLICATE_LINK = "link to a file listed under another name"
NOT_A_FILE = "not a regular file"


class FolderError(ValueError):
    """The folder to walk is not a folder or cannot be listed (a user's input: one line, exit 2)."""


@dataclass(frozen=True)
class WalkedFile:
    path: Path
    parts: tuple[str, ...]   # the path relative to the root, one part per folder
    kind: str


@dataclass(frozen=True)
class Skipped:
    path: str                # printable: bytes that are not UTF-8 appear as \xNN
    reason: str


@dataclass
class WalkResult:
    files: list[WalkedFile] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    @property
    def counts(self) -> Counter:
        return Counter(s.reason for s in self.skipped)


def printable(path: str | os.PathLike) -> str:
    """A path as text that can always be printed or encoded: undecodable bytes as \\xNN."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _is_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")          # os.walk decodes bad bytes to lone surrogates
    except UnicodeEncodeError:
        return False
    return True


def _check_root(root: Path) -> None:
    if not root.exists():
        raise FileNotFoundError(f"{printable(root)}: no such folder")
    if not root.is_dir():
        raise FolderError(f"{printable(root)}: not a folder. Fix: give the folder that holds the documents")
    try:
        with os.scandir(root):
            pass
    except OSError as err:
        raise FolderError(f"{printable(root)}: the folder cannot be read ({err.strerror}). Fix: check "
                          "its permissions (ls -ld), or run as a user who may read it") from err


def walk_documents(root: str | os.PathLike, kind_of: Callable[[str], str | None]) -> WalkResult:
    """Every file under `root` whose name `kind_of` gives a kind, in sorted order, and what was
    left out (module doc). Raises FileNotFoundError or FolderError only for `root` itself."""
    root = Path(root)
    _check_root(root)
    result = WalkResult()
    regular, linked = [], []

    def unreadable(err: OSError) -> None:
        result.skipped.append(Skipped(printable(err.filename or "?"), f"{UNREADABLE} ({err.strerror})"))

    for dirpath, dirnames, filenames in os.walk(root, onerror=unreadable):
        here = Path(dirpath)
        kept = []
        for d in sorted(dirnames):
            reason = (NOT_UTF8 if not _is_utf8(d) else HIDDEN if d.startswith(".")
                      else LINKED_FOLDER if (here / d).is_symlink() else None)
            if reason:
                result.skipped.append(Skipped(printable(here / d), reason))
            else:
                kept.append(d)
        dirnames[:] = kept
        for name in sorted(filenames):
            path = here / name
            reason = _file_problem(path, name, kind_of)
            if reason:
                result.skipped.append(Skipped(printable(path), reason))
                continue
            entry = WalkedFile(path, path.relative_to(root).parts, kind_of(name))
            (linked if path.is_symlink() else regular).append(entry)
    result.files = regular + _linked_files(root, regular, linked, result.skipped)
    result.files.sort(key=lambda f: f.parts)
    return result


def _file_problem(path: Path, name: str, kind_of: Callable[[str], str | None]) -> str | None:
    """Why the file is left out, or None to keep it."""
    if not _is_utf8(name):
        return NOT_UTF8
    if kind_of(name) is None:
        return UNKNOWN_KIND
    try:
        mode = os.stat(path).st_mode              # follows links: a broken one raises
    except OSError:
        return BROKEN_LINK if path.is_symlink() else UNREADABLE
    if not stat.S_ISREG(mode):
        return NOT_A_FILE
    if not os.access(path, os.R_OK):
        return f"{UNREADABLE} (permission denied)"
    return None


def _linked_files(root: Path, regular: list[WalkedFile], linked: list[WalkedFile],
                  skipped: list[Skipped]) -> list[WalkedFile]:
    """Links to a file inside `root` that no regular file (or earlier link) already lists."""
    top = root.resolve()
    seen = {f.path.resolve() for f in regular}
    kept = []
    for f in linked:
        try:
            target = f.path.resolve(strict=True)
        except (OSError, RuntimeError):
            skipped.append(Skipped(printable(f.path), BROKEN_LINK))
            continue
        if not target.is_relative_to(top):
            skipped.append(Skipped(printable(f.path), OUTSIDE_LINK))
        elif target in seen:
            skipped.append(Skipped(printable(f.path), DUPLICATE_LINK))
        else:
            seen.add(target)
            kept.append(f)
    return kept


def skip_report(skipped: Iterable[Skipped], max_named: int = 20) -> list[str]:
    """Lines naming the skipped entries, at most `max_named` per reason, then a count of the rest."""
    by_reason: dict[str, list[str]] = {}
    for s in skipped:
        by_reason.setdefault(s.reason, []).append(s.path)
    lines = []
    for reason, paths in by_reason.items():
        lines += [f"skipped {p}: {reason}" for p in paths[:max_named]]
        if len(paths) > max_named:
            lines.append(f"skipped {len(paths) - max_named} more: {reason}")
    return lines
