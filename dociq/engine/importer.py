"""Bring pages into an engine store: folders of page images and PDFs (or a .zip of them), COCO
and FUNSD sets, and mark a held-out split for retrain evaluation.

- `import_folder`: PNG/JPEG/TIFF/BMP/WebP pages (words by tesseract with ocr="auto"/"tesseract",
  none with ocr="none"), PDFs (every page, rendered at `dpi`, words from the text layer;
  tesseract for pages without one when ocr="auto", for every page when ocr="tesseract"), zip
  archives of those (read in memory, never extracted).
- `import_coco` / `import_funsd`: their regions become accepted annotations (category = label,
  mask = the region); questions that target exactly one region become that annotation's
  question; other non-category questions are kept as uncategorised annotations with their
  target mask. Category questions are not stored: the export derives them again.
- `split_heldout`: move a fixed fraction of pages to split "heldout".

A page whose pixels are already in the store is not added twice (re-running an import is safe).
A bad file (unreadable, too large, a name that escapes the folder) is skipped with a warning that
names it; the result lists the skipped files with the reason (`ImportResult.skipped`).
"""
from __future__ import annotations

import io
import logging
import random
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterable

import numpy as np

from dociq.data.errors import DEFAULT_MAX_PAGE_PIXELS, BadSampleError, check_page_pixels
from dociq.data.image_io import load_page_image, to_rgb_array
from dociq.data.ocr import TesseractOCR
from dociq.data.pdf import POINTS_PER_INCH, load_page, open_pdf, render_page, text_layer_words
from dociq.engine.store import EngineStore, image_sha256
from dociq.io.track import track

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".webp")
# auto: PDF text layer, tesseract where there is none; none: text layer only, never tesseract;
# tesseract: tesseract on every page (for PDFs whose text layer is wrong).
OCR_MODES = ("auto", "tesseract", "none")
MAX_ZIP_MEMBER_BYTES = 512 * 1024 * 1024


@dataclass
class Skipped:
    name: str
    reason: str


class ImportResult(list):
    """The ids of the pages added (a list of str), plus `.skipped` (bad files, with the reason)
    and `.existing` (ids of pages that were already in the store)."""

    def __init__(self, ids: Iterable[str] = ()):
        super().__init__(ids)
        self.skipped: list[Skipped] = []
        self.existing: list[str] = []

    def skip(self, name: str | Path, reason: str) -> None:
        log.warning("skipped %s: %s", name, reason)
        self.skipped.append(Skipped(str(name), reason))

    def __repr__(self) -> str:
        return f"ImportResult(added={list(self)!r}, existing={self.existing!r}, skipped={self.skipped!r})"


class PathTraversalError(ValueError):
    """A file name inside an archive or annotation file that points outside its folder."""


def safe_relative(name: str, what: str) -> PurePosixPath:
    """`name` as a relative path that stays inside its folder, or PathTraversalError."""
    unified = str(name).replace("\\", "/")
    path = PurePosixPath(unified)
    if not unified or path.is_absolute() or unified.startswith("/") or (len(unified) > 1 and unified[1] == ":"):
        raise PathTraversalError(f"{what} {name!r} is an absolute path: refused (it could point anywhere "
                                 "on this machine). Fix: use a path relative to the folder")
    if ".." in path.parts:
        raise PathTraversalError(f"{what} {name!r} contains '..': refused (it could escape the folder). "
                                 "Fix: use a path inside the folder")
    return path


# ---------------------------------------------------------------------------------------------
# folders, PDFs, zips


class _Words:
    """Word source for pages without a text layer: tesseract, started once, or none."""

    def __init__(self, ocr: str):
        if ocr not in OCR_MODES:
            raise ValueError(f"ocr={ocr!r} is not one of {OCR_MODES}")
        self.mode = ocr
        self._tesseract = None
        self._tesseract_error: str | None = None

    def for_image(self, image: np.ndarray) -> tuple[list[str], np.ndarray]:
        if self.mode == "none":
            return [], np.zeros((0, 4), np.float32)
        if self._tesseract is None and self._tesseract_error is None:
            try:
                self._tesseract = TesseractOCR()
            except (RuntimeError, ImportError) as err:
                if self.mode == "tesseract":
                    raise
                self._tesseract_error = str(err)
                log.warning("ocr='auto': pages without a text layer get no words (%s)", err)
        if self._tesseract is None:
            return [], np.zeros((0, 4), np.float32)
        found = self._tesseract.recognise(image)
        return list(found.words), found.boxes


def import_folder(store: EngineStore, folder: str | Path, ocr: str = "auto", dpi: int = 150,
                  max_page_pixels: int | None = DEFAULT_MAX_PAGE_PIXELS, split: str = "train") -> ImportResult:
    """Add every page image, PDF page and zip member page under `folder` (recursively, sorted;
    `folder` may also be one such file). Returns the new page ids (an `ImportResult`)."""
    folder = Path(folder)
    words = _Words(ocr)
    result = ImportResult()
    if not folder.exists():
        raise FileNotFoundError(f"{folder} does not exist. Fix: pass a folder of page images/PDFs, "
                                "or a single PNG/JPEG/PDF/zip file")
    if folder.is_file():
        files, root = [folder], folder.parent
    else:
        root = folder.resolve()
        files = sorted(p for p in folder.rglob("*") if p.is_file() and not _hidden(p.relative_to(folder)))
    for path in track(files, desc="importing files"):
        rel = path.name if folder.is_file() else path.relative_to(folder).as_posix()
        if not folder.is_file() and not _inside(path, root):
            result.skip(rel, "a link that points outside the folder: refused (path traversal)")
            continue
        suffix = path.suffix.lower()
        try:
            if suffix in IMAGE_SUFFIXES:
                image = load_page_image(path, max_page_pixels)
                _add(store, result, image, *words.for_image(image), source=str(path), split=split)
            elif suffix == ".pdf":
                _import_pdf(store, result, path, str(path), words, ocr, dpi, max_page_pixels, split)
            elif suffix == ".zip":
                _import_zip(store, result, path, words, ocr, dpi, max_page_pixels, split)
            else:
                result.skip(rel, f"not a page image ({', '.join(IMAGE_SUFFIXES)}), PDF or zip")
        except (BadSampleError, OSError, ValueError) as err:
            result.skip(rel, str(err))
    return result


def _hidden(rel: Path) -> bool:
    return any(part.startswith(".") or part == "__MACOSX" for part in rel.parts)


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root)
        return True
    except ValueError:
        return False


def _add(store: EngineStore, result: ImportResult, image: np.ndarray, words: list[str], boxes: np.ndarray,
         source: str, split: str) -> str | None:
    existing = store.page_by_hash(image_sha256(image))
    if existing is not None:
        result.existing.append(existing)
        return None
    page_id = store.add_page(image, words, boxes, source=source, split=split)
    result.append(page_id)
    return page_id


def _import_pdf(store, result, pdf: Path | bytes, source: str, words: _Words, ocr: str, dpi: int,
                max_page_pixels, split: str) -> None:
    """Every page of a PDF (a file, or a zip member's bytes); a page that fails is skipped, the
    others are added. Words come from the page already open, mapped onto its render."""
    doc = open_pdf(pdf, source)
    try:
        for index in range(len(doc)):
            page_source = f"{source}#page={index + 1}"
            try:
                page = load_page(doc, index, source)
                try:
                    image = render_page(page, dpi / POINTS_PER_INCH, max_page_pixels=max_page_pixels, name=source,
                                        what=f"PDF page {index + 1}")
                    page_words, boxes = [], np.zeros((0, 4), np.float32)
                    if ocr in ("auto", "none"):
                        page_words, boxes = text_layer_words(page, image.shape[:2], name=source,
                                                             what=f"PDF page {index + 1}")
                finally:
                    page.close()
                if ocr == "tesseract" or (ocr == "auto" and not page_words):
                    page_words, boxes = words.for_image(image)
                _add(store, result, image, page_words, boxes, source=page_source, split=split)
            except (BadSampleError, ValueError) as err:
                result.skip(page_source, str(err))
    finally:
        doc.close()


def _import_zip(store, result, path: Path, words: _Words, ocr: str, dpi: int, max_page_pixels,
                split: str) -> None:
    """Members are read into memory, never written to disk; unsafe names are refused."""
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile as err:
        raise BadSampleError(path, f"not a readable zip ({err})", "re-create the archive") from err
    with archive:
        for info in sorted(archive.infolist(), key=lambda i: i.filename):
            if info.is_dir():
                continue
            name = f"{path}!{info.filename}"
            try:
                rel = safe_relative(info.filename, "zip member")
            except PathTraversalError as err:
                result.skip(name, str(err))
                continue
            if _hidden(Path(*rel.parts)):
                continue
            suffix = rel.suffix.lower()
            if info.file_size > MAX_ZIP_MEMBER_BYTES:  # read into memory: refuse zip bombs up front
                result.skip(name, f"{info.file_size} bytes uncompressed, over the {MAX_ZIP_MEMBER_BYTES}-byte "
                            "limit for a zip member. Fix: import the file unzipped")
                continue
            try:
                if suffix in IMAGE_SUFFIXES:
                    image = _image_from_bytes(archive.read(info), name, max_page_pixels)
                    _add(store, result, image, *words.for_image(image), source=name, split=split)
                elif suffix == ".pdf":
                    _import_pdf(store, result, archive.read(info), name, words, ocr, dpi, max_page_pixels, split)
                else:
                    result.skip(name, f"not a page image ({', '.join(IMAGE_SUFFIXES)}) or PDF")
            except (BadSampleError, OSError, ValueError, zipfile.BadZipFile) as err:
                result.skip(name, str(err))


def _image_from_bytes(data: bytes, name: str, max_page_pixels) -> np.ndarray:
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            check_page_pixels(name, img.width, img.height, max_page_pixels, "image")
            img.load()
            return to_rgb_array(ImageOps.exif_transpose(img), name)
    except BadSampleError:
        raise
    except (UnidentifiedImageError, OSError, SyntaxError, EOFError, Image.DecompressionBombError) as err:
        raise BadSampleError(name, f"not a readable image ({err})", "replace it with a PNG/JPEG page") from err


# ---------------------------------------------------------------------------------------------
# annotated sets


def add_annotated_page(store: EngineStore, page, source: str, split: str, author: str) -> tuple[str | None, int]:
    """Add a `dociq.data.schema.Page` with its regions/questions as accepted annotations.
    Returns (page id or None when its pixels are already stored, number of annotations)."""
    if store.page_by_hash(image_sha256(page.image)) is not None:
        return None, 0
    page_id = store.add_page(page.image, page.words, page.word_boxes, source=source, split=split)
    own_question: dict[int, Any] = {}
    extra = []
    for q in page.questions:
        if q.kind == "category":
            continue  # derived again from the categories on export
        if len(q.region_ids) == 1 and q.region_ids[0] not in own_question:
            own_question[q.region_ids[0]] = q
        else:
            extra.append(q)
    n = 0
    for i, region in enumerate(page.regions):
        q = own_question.get(i)
        store.save_annotation(page_id, region.mask, "" if q is None else q.text, category=region.label,
                              kind="layout" if q is None else q.kind, author=author)
        n += 1
    for q in extra:
        if q.mask.any():
            store.save_annotation(page_id, q.mask, q.text, category=None, kind=q.kind, author=author)
            n += 1
    return page_id, n


def _import_pages(store: EngineStore, count: int, load: Callable[[int], Any], name: Callable[[int], str],
                  split: str, author: str) -> ImportResult:
    result = ImportResult()
    for i in range(count):
        try:
            page = load(i)
        except (BadSampleError, PathTraversalError, OSError) as err:
            result.skip(name(i), str(err))
            continue
        page_id, _ = add_annotated_page(store, page, source=str(page.meta.get("source", name(i))),
                                        split=split, author=author)
        if page_id is None:
            result.existing.append(store.page_by_hash(image_sha256(page.image)))
        else:
            result.append(page_id)
    return result


def import_coco(store: EngineStore, annotation_file: str | Path, image_dir: str | Path | None = None,
                split: str = "train", ocr: str = "groundtruth", **coco_options) -> ImportResult:
    """Pages of a COCO JSON (DocLayNet, PubLayNet, a dociq export) with their regions as accepted
    annotations. file_names that are absolute or contain '..' are refused (skipped, listed)."""
    # deferred: the data sets import torch; a folder import does not need it
    from dociq.data.datasets.coco import CocoDocuments

    coco_options.setdefault("require_words", False)
    dataset = CocoDocuments(annotation_file, image_dir=image_dir, ocr=ocr, category_questions=False,
                            **coco_options)
    root = dataset.image_dir.resolve()

    def load(i):
        file_name = dataset.images[i].get("file_name")
        if isinstance(file_name, str):
            safe_relative(file_name, f"COCO file_name of image id {dataset.images[i].get('id')}")
            if not _inside(dataset.image_dir / file_name, root):
                raise PathTraversalError(f"COCO file_name {file_name!r} leads outside {root} (a link): refused")
        return dataset.load_page(i)

    def name(i):
        return f"{dataset.annotation_file}: image {dataset.images[i].get('file_name')!r}"

    return _import_pages(store, len(dataset), load, name, split, author=f"import:coco:{Path(annotation_file).name}")


def import_funsd(store: EngineStore, root: str | Path, split: str = "training_data", store_split: str | None = None,
                 ocr: str = "groundtruth") -> ImportResult:
    """Pages of a FUNSD folder (`root/<split>/annotations|images`): entities become accepted
    annotations (category = question/answer/header/other), link questions are kept. Pages go to
    store split `store_split` (default: 'train' for training_data, 'heldout' for testing_data)."""
    # deferred: the data sets import torch; a folder import does not need it
    from dociq.data.datasets.funsd import FunsdDocuments

    dataset = FunsdDocuments(root, split=split, ocr=ocr, require_words=False)
    if store_split is None:
        store_split = "heldout" if split == "testing_data" else "train"
    return _import_pages(store, len(dataset), dataset.load_page, lambda i: str(dataset.files[i]),
                         store_split, author="import:funsd")


def split_heldout(store: EngineStore, fraction: float = 0.2, seed: int = 0) -> list[str]:
    """Make round(fraction * pages) pages (at least one when fraction > 0 and there are 2+ pages)
    the 'heldout' split, for retrain evaluation. Pages already held out stay held out, so the
    held-out set only grows as the store grows; the new ones are drawn from 'train' with `seed`.
    Returns the ids of all held-out pages."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"fraction={fraction}: need 0 <= fraction < 1 (the share of pages held out)")
    pages = store.pages()
    heldout = [p.id for p in pages if p.split == "heldout"]
    want = int(round(fraction * len(pages)))
    if fraction > 0 and len(pages) >= 2:
        want = max(want, 1)
    if len(heldout) < want:
        candidates = [p.id for p in pages if p.split == "train"]
        chosen = random.Random(seed).sample(candidates, min(want - len(heldout), len(candidates)))
        store.set_split(sorted(chosen), "heldout")
        heldout = sorted(heldout + chosen)
    return heldout


__all__ = ["import_folder", "import_coco", "import_funsd", "split_heldout", "add_annotated_page",
           "ImportResult", "Skipped", "PathTraversalError", "safe_relative", "IMAGE_SUFFIXES", "OCR_MODES"]
