"""Where corpus documents come from: Debian documentation packages, or any folder of files.

`fetch_debian_packages` downloads documentation packages with `apt-get download` and unpacks
them with `dpkg-deb -x`, one folder per package, resumably. `find_documents` lists the PDF,
HTML and Mallard files under a folder with dociq.io.walk (the walk every document command shares;
`list_documents` also returns what it left out; the first path component names a document's package),
skips HTML that is navigation rather than content, and picks a deterministic, seed-dependent
sample per package. `materialize` turns a listed document into a file the builder can read
(gunzipped, or Mallard converted to HTML).
"""
from __future__ import annotations

import gzip
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from dociq.corpus.mallard import mallard_to_html
from dociq.io.atomic import atomic_write_bytes
from dociq.io.walk import Skipped, walk_documents

# package -> the kind of documents it ships
DEBIAN_PACKAGES: dict[str, str] = {
    "texlive-latex-extra-doc": "pdf",
    "texlive-publishers-doc": "pdf",
    "texlive-pictures-doc": "pdf",
    "texlive-latex-recommended-doc": "pdf",
    "texlive-science-doc": "pdf",
    "texlive-humanities-doc": "pdf",
    "python3.11-doc": "html",
    "postgresql-doc-15": "html",
    "python-sklearn-doc": "html",
    "debian-handbook": "html",
    "gnome-user-docs": "mallard",  # Mallard .page XML, converted to HTML before printing
    # more genres for a wider training corpus (none of them is a held-out genre of corpus-unseen):
    # guides in English, French and German, games (chess, crosswords, sudoku), music scores,
    # MetaPost figures, LaTeX's own documented sources
    "texlive-lang-english": "pdf",
    "texlive-lang-french": "pdf",
    "texlive-lang-german": "pdf",
    "texlive-games": "pdf",
    "texlive-music": "pdf",
    "texlive-metapost-doc": "pdf",
    "texlive-latex-base-doc": "pdf",
}

# a few packages of every kind, for a quick recipe build
RECIPE_PACKAGES: tuple[str, ...] = (
    "texlive-latex-recommended-doc",
    "texlive-humanities-doc",
    "texlive-science-doc",
    "python3.11-doc",
    "postgresql-doc-15",
    "gnome-user-docs",
)

_FETCH_FIX = ("Fix: run on Debian/Ubuntu as root after `apt-get update`, or pass a folder of "
              "PDFs/HTML to `dociq corpus build`")
_DONE_MARKER = ".dociq-fetched"  # written last inside an unpacked package folder
_PARTIAL_PREFIX = ".partial-"
_SUBPROCESS_TIMEOUT_S = 3600

# HTML pages that are navigation, not content
_SKIPPED_HTML_NAME = re.compile(
    r"^(genindex.*|search|py-modindex.*|modindex.*|np-modindex.*|bookindex.*|ix\d+|"
    r"sg_execution_times)\.html?(\.gz)?$", re.IGNORECASE)
_SKIPPED_HTML_DIRS = {"_modules", "_sources", "_static", "_images", "_downloads"}
MIN_HTML_TEXT_BYTES = 1500
MIN_MALLARD_TEXT_BYTES = 600  # help topics are short; below this a page is a stub or a link list
_MAX_SNIFF_BYTES = 4 << 20


class SourceError(RuntimeError):
    """A source could not be fetched or read; the message says what failed and the fix."""


@dataclass(frozen=True)
class SourceDocument:
    path: Path
    kind: str  # "pdf" | "html" | "mallard"
    package: str
    doc_id: str  # package/relative/path, stable across machines


# -- fetching Debian packages ------------------------------------------------------------------

def fetch_debian_packages(names, dest_dir) -> dict[str, Path]:
    """Download and unpack Debian packages into `dest_dir/NAME/`; finished packages are skipped."""
    names = list(names)
    unknown = [n for n in names if n not in DEBIAN_PACKAGES]
    if unknown:
        raise ValueError(f"unknown Debian package(s) {unknown}; known: {sorted(DEBIAN_PACKAGES)}")
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    out = {}
    for name in names:
        folder = dest_dir / name
        if not (folder / _DONE_MARKER).is_file():
            _require_tools(name)
            _extract(_download(name, dest_dir / "debs"), folder)
        out[name] = folder
    return out


def _require_tools(package: str) -> None:
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise SourceError(f"cannot fetch Debian package {package!r}: `{tool}` is not on PATH. "
                              + _FETCH_FIX)


def _run(cmd: list[str], package: str, cwd: Path | None = None) -> None:
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=_SUBPROCESS_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise SourceError(f"`{' '.join(cmd)}` for {package!r} failed: {err}. {_FETCH_FIX}") from err
    if proc.returncode != 0:
        # apt-get as root warns that the download runs unsandboxed: harmless, not the error
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and "unsandboxed" not in ln]
        detail = " | ".join(lines[-3:]) or f"exit status {proc.returncode}"
        raise SourceError(f"`{' '.join(cmd)}` for {package!r} failed: {detail}. {_FETCH_FIX}")


def _download(name: str, debs_dir: Path) -> Path:
    """The package's .deb in `debs_dir`, downloaded unless already there."""
    debs_dir.mkdir(parents=True, exist_ok=True)
    cached = sorted(debs_dir.glob(f"{name}_*.deb"))
    if cached:
        return cached[-1]
    # download into a private folder so an interrupted download never looks like a .deb
    tmp = Path(tempfile.mkdtemp(prefix=_PARTIAL_PREFIX, dir=debs_dir))
    try:
        _run(["apt-get", "download", name], name, cwd=tmp)
        debs = sorted(tmp.glob(f"{name}_*.deb"))
        if not debs:
            raise SourceError(f"`apt-get download {name}` wrote no .deb file. {_FETCH_FIX}")
        final = debs_dir / debs[-1].name
        os.replace(debs[-1], final)
        return final
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _extract(deb: Path, folder: Path) -> None:
    """Unpack `deb` into `folder`: into a temp folder first, renamed into place when complete."""
    parent = folder.parent
    for stale in parent.glob(f"{_PARTIAL_PREFIX}{folder.name}-*"):  # left by a killed extraction
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{_PARTIAL_PREFIX}{folder.name}-", dir=parent))
    try:
        _run(["dpkg-deb", "-x", str(deb), str(tmp)], folder.name)
        (tmp / _DONE_MARKER).write_text(deb.name + "\n")
        if folder.exists():  # an unfinished folder of an older layout, or a user's leftovers
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# -- finding documents -------------------------------------------------------------------------

def _kind_of(name: str) -> str | None:
    low = name.lower()
    if low.endswith((".pdf", ".pdf.gz")):
        return "pdf"
    if low.endswith((".html", ".htm", ".html.gz", ".htm.gz")):
        return "html"
    if low.endswith(".page"):
        return "mallard"
    return None


def _is_navigation_html(rel_parts: tuple[str, ...]) -> bool:
    return bool(_SKIPPED_HTML_NAME.match(rel_parts[-1])) or any(p in _SKIPPED_HTML_DIRS for p in rel_parts[:-1])


def _read_head(path: Path, limit: int = _MAX_SNIFF_BYTES) -> bytes:
    if path.name.lower().endswith(".gz"):
        with gzip.open(path, "rb") as fh:
            return fh.read(limit)
    with open(path, "rb") as fh:
        return fh.read(limit)


_INVISIBLE = re.compile(rb"<(script|style|head|info)\b.*?</\1\s*>|<!--.*?-->", re.DOTALL | re.IGNORECASE)
_TAG = re.compile(rb"<[^>]*>")
_SPACE = re.compile(rb"\s+")


def visible_text_bytes(markup: bytes) -> int:
    """Bytes of text a reader would see: scripts, styles, <head> and Mallard <info> dropped."""
    text = _TAG.sub(b" ", _INVISIBLE.sub(b" ", markup))
    return len(_SPACE.sub(b" ", text).strip())


def _has_enough_text(doc: SourceDocument) -> bool:
    if doc.kind == "pdf":
        return True
    try:
        head = _read_head(doc.path)
    except (OSError, EOFError, zlib.error):
        return True  # keep it: materialize reports the broken file as a bad document
    floor = MIN_MALLARD_TEXT_BYTES if doc.kind == "mallard" else MIN_HTML_TEXT_BYTES
    return visible_text_bytes(head) >= floor


def _document(path: Path, parts: tuple[str, ...]) -> SourceDocument:
    package = parts[0] if len(parts) > 1 else "local"
    rel = "/".join(parts[1:]) if len(parts) > 1 else parts[0]
    return SourceDocument(path=path, kind=_kind_of(parts[-1]), package=package, doc_id=f"{package}/{rel}")


# a locale folder (de, pt_BR, zh-CN, sr@latin) under a documentation root
_LOCALE = re.compile(r"^[a-z]{2}([_-][A-Za-z]{2,4})?(@[a-z]+)?$")
_DOC_ROOTS = {"help", "html"}
_ENGLISH = {"C", "en", "en-US", "en_US", "en-GB", "en_GB"}


def _is_translation(parts: tuple[str, ...]) -> bool:
    """A page under a non-English locale folder of a help/html tree (gnome-user-docs ships 42
    languages, the Debian handbook 26): translations repeat the English pages' layout, and the
    installed fonts cannot draw most of their scripts."""
    for parent, name in zip(parts, parts[1:-1]):
        if parent in _DOC_ROOTS and name not in _ENGLISH and _LOCALE.match(name):
            return True
    return False


def _shuffle_key(seed: int, doc_id: str) -> str:
    return hashlib.sha1(f"{seed}:{doc_id}".encode()).hexdigest()


def find_documents(src_dir, max_docs_per_package: int | None = None, seed: int = 0) -> list[SourceDocument]:
    """Every PDF / HTML / Mallard document under `src_dir`, at most `max_docs_per_package` per
    package chosen by a (seed, doc_id) hash; sorted by (package, doc_id)."""
    return list_documents(src_dir, max_docs_per_package, seed)[0]


def list_documents(src_dir, max_docs_per_package: int | None = None,
                   seed: int = 0) -> tuple[list[SourceDocument], list[Skipped]]:
    """`find_documents`, and the files and folders the walk left out (dociq.io.walk: unreadable,
    not UTF-8, unknown kind, links); navigation HTML, translations and the cap are not in it."""
    walked = walk_documents(src_dir, _kind_of)
    by_package: dict[str, list[SourceDocument]] = {}
    for found in walked.files:
        doc = _document(found.path, found.parts)
        if doc.kind == "html" and _is_navigation_html(found.parts):
            continue
        if _is_translation(found.parts):
            continue
        by_package.setdefault(doc.package, []).append(doc)
    chosen = []
    for docs in by_package.values():
        docs.sort(key=lambda d: _shuffle_key(seed, d.doc_id))
        # text is checked in shuffled order and only until the cap is reached: reading every
        # page of a 13k-page package to keep 50 would dominate a small build
        kept = 0
        for doc in docs:
            if max_docs_per_package is not None and kept >= max_docs_per_package:
                break
            if _has_enough_text(doc):
                chosen.append(doc)
                kept += 1
    return sorted(chosen, key=lambda d: (d.package, d.doc_id)), walked.skipped


# -- materializing -----------------------------------------------------------------------------

def _work_name(doc: SourceDocument, suffix: str) -> str:
    stem = Path(doc.doc_id).name
    stem = stem[:-3] if stem.lower().endswith(".gz") else stem
    stem = Path(stem).stem
    return f"{hashlib.sha1(doc.doc_id.encode()).hexdigest()[:10]}-{stem}{suffix}"


def _atomic_write(out: Path, data: bytes) -> Path:
    atomic_write_bytes(out, data)
    return out


def _with_base_href(html: bytes, folder: Path) -> bytes:
    """HTML moved out of its folder still finds its images and stylesheets."""
    base = f'<base href="{folder.resolve().as_uri()}/">'.encode()
    match = re.search(rb"<head\b[^>]*>", html, re.IGNORECASE)
    if match:
        return html[:match.end()] + base + html[match.end():]
    return base + html


def _gunzip(doc: SourceDocument, work_dir: Path) -> Path:
    try:
        with gzip.open(doc.path, "rb") as fh:
            data = fh.read()
    except (OSError, EOFError, zlib.error) as err:
        raise SourceError(f"{doc.path}: not a readable gzip file ({err}). Fix: fetch the package "
                          "again, or delete the file") from err
    suffix = ".pdf" if doc.kind == "pdf" else ".html"
    if doc.kind == "html":
        data = _with_base_href(data, doc.path.parent)
    return _atomic_write(work_dir / _work_name(doc, suffix), data)


def materialize(doc: SourceDocument, work_dir) -> Path:
    """A readable file for `doc`: gunzipped or converted into `work_dir`, else its own path."""
    if not doc.path.is_file():
        raise SourceError(f"{doc.path}: no such file (document {doc.doc_id}). Fix: list the "
                          "documents again with find_documents")
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    if doc.path.name.lower().endswith(".gz"):
        return _gunzip(doc, work_dir)
    if doc.kind == "mallard":
        return mallard_to_html(doc.path, work_dir / _work_name(doc, ".html"))
    return doc.path
