"""The shared folder walk (dociq.io.walk): files of the asked kinds, and every entry left out named
with its reason; one bad entry never stops it; only the root itself is an error."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from dociq.io import walk
from dociq.io.walk import FolderError, skip_report, walk_documents


def kind_of(name: str) -> str | None:
    return "pdf" if name.lower().endswith(".pdf") else None


def _touch(path: Path | bytes) -> None:
    with open(path, "wb") as f:
        f.write(b"%PDF-1.4\n")


@pytest.fixture
def tree(tmp_path) -> Path:
    root = tmp_path / "docs"
    for folder in ("a/b", ".partial-1", "locked"):
        (root / folder).mkdir(parents=True)
    _touch(root / "top.pdf")
    _touch(root / "a" / "b" / "deep.PDF")
    _touch(root / ".partial-1" / "half.pdf")
    _touch(root / "locked" / "secret.pdf")
    (root / "a" / "notes.txt").write_text("x")
    _touch(os.path.join(os.fsencode(root), b"caf\xe9.pdf"))           # a Latin-1 name
    os.mkdir(os.path.join(os.fsencode(root), b"r\xe9sum\xe9s"))       # a Latin-1 folder name
    _touch(os.path.join(os.fsencode(root), b"r\xe9sum\xe9s", b"inside.pdf"))
    (root / "link.pdf").symlink_to(root / "top.pdf")                  # the same file under another name
    (root / "dangling.pdf").symlink_to(root / "gone.pdf")
    (root / "outside.pdf").symlink_to(tmp_path / "elsewhere.pdf")
    _touch(tmp_path / "elsewhere.pdf")
    (root / "a" / "linked").symlink_to(root / "a" / "b", target_is_directory=True)
    os.mkfifo(root / "pipe.pdf")
    return root


def test_walk_names_every_skip_and_keeps_the_documents(tree, monkeypatch):
    real_scandir = os.scandir

    def scandir(path="."):             # root may read anything: make "locked" unreadable by hand
        if Path(os.fsdecode(path)).name == "locked":
            raise PermissionError(13, "Permission denied", os.fsdecode(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    found = walk_documents(tree, kind_of)
    assert [f.parts for f in found.files] == [("a", "b", "deep.PDF"), ("top.pdf",)]
    assert all(f.kind == "pdf" for f in found.files)
    reasons = {Path(s.path).name: s.reason for s in found.skipped}
    assert reasons["caf\\xe9.pdf"] == walk.NOT_UTF8
    assert reasons["r\\xe9sum\\xe9s"] == walk.NOT_UTF8
    assert reasons["notes.txt"] == walk.UNKNOWN_KIND
    assert reasons[".partial-1"] == walk.HIDDEN
    assert reasons["locked"].startswith(walk.UNREADABLE)
    assert reasons["link.pdf"] == walk.DUPLICATE_LINK
    assert reasons["dangling.pdf"] == walk.BROKEN_LINK
    assert reasons["outside.pdf"] == walk.OUTSIDE_LINK
    assert reasons["linked"] == walk.LINKED_FOLDER
    assert reasons["pipe.pdf"] == walk.NOT_A_FILE
    assert found.counts[walk.NOT_UTF8] == 2
    report = "\n".join(skip_report(found.skipped))
    report.encode("utf-8")                              # printable: no lone surrogates left
    assert "caf\\xe9.pdf: name is not valid UTF-8" in report


def test_an_unreadable_file_is_skipped_not_fatal(tmp_path, monkeypatch):
    _touch(tmp_path / "a.pdf")
    _touch(tmp_path / "b.pdf")
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: Path(p).name != "a.pdf" and real_access(p, mode))
    found = walk_documents(tmp_path, kind_of)
    assert [f.parts for f in found.files] == [("b.pdf",)]
    assert [(Path(s.path).name, s.reason) for s in found.skipped] == [("a.pdf", "cannot be read (permission denied)")]


def test_the_root_missing_or_unreadable_says_so(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="no such folder"):
        walk_documents(tmp_path / "nope", kind_of)
    _touch(tmp_path / "file.pdf")
    with pytest.raises(FolderError, match="not a folder"):
        walk_documents(tmp_path / "file.pdf", kind_of)
    real_scandir = os.scandir
    monkeypatch.setattr(os, "scandir", lambda p=".": (_ for _ in ()).throw(PermissionError(13, "Permission denied"))
                        if Path(os.fsdecode(p)) == tmp_path else real_scandir(p))
    with pytest.raises(FolderError, match=r"the folder cannot be read \(Permission denied\)"):
        walk_documents(tmp_path, kind_of)


def test_skip_report_names_the_first_ones_and_counts_the_rest():
    skipped = [walk.Skipped(f"f{i}.txt", walk.UNKNOWN_KIND) for i in range(25)] + [walk.Skipped("x.pdf", "odd")]
    lines = skip_report(skipped, max_named=20)
    assert len(lines) == 22 and lines[20] == f"skipped 5 more: {walk.UNKNOWN_KIND}" and lines[21] == "skipped x.pdf: odd"
