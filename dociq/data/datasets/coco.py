"""COCO instance JSON as DocLayNet and PubLayNet ship it, read as `Page`s; and the writer for it.

Regions are the annotations (label = category name; polygons and RLE, compressed or not, decoded
with pycocotools). Pages get one "category" question per category present ("segment every
table" -> union mask); box/point prompts are sampled later by the collator from question masks.

dociq's extra fields, read when present and written by `write_coco_records` (the one writer,
behind `write_coco` and the engine's export):
  image entry  "words":     [{"text", "bbox": [x, y, w, h]}]          ground-truth OCR
               "questions": [{"text", "kind", "annotation_ids" | "region_ids",
                              "segmentation": RLE}]                    annotation_ids: ids of the
                                                                       page's annotations (written);
                                                                       region_ids: their indices in
                                                                       file order (read, as older
                                                                       write_coco files have it)
               "links":     [[key_region, value_region], ...]          region indices
               "page_id", "meta", "pdf_page" (page of a multi-page PDF file_name / pdf_dir PDF)
  annotation   "text", "word_ids"                                      word_ids index "words"

Bad pages raise `BadSampleError` naming the file and the fix, or with on_bad_sample="skip" the
page reads as `None`, is logged once and listed in `dataset.bad_samples`. A broken index (duplicate
image or category ids, 'images'/'annotations'/'categories' that are not lists of objects) raises
when the data set is built, whatever on_bad_sample says: no page of such a file can be trusted.
A region of zero area (empty box or mask) is dropped from its page, with the questions and links
that need it, warned about once and listed in `dataset.dropped_regions`; the page stays.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
from pycocotools import mask as mask_util

from dociq.data.datasets.guarded import GuardedDocuments
from dociq.data.errors import (
    BOX_OVERSHOOT_TOLERANCE, DEFAULT_MAX_PAGE_PIXELS, BadSample, BadSampleError, BadSamplePolicy,
    check_box_in_page, check_boxes_in_page,
)
from dociq.data.image_io import load_page_image, save_page_image
from dociq.data.masks import mask_box
from dociq.io.atomic import atomic_write_text
from dociq.data.ocr import OcrWords, PdfTextLayer, make_ocr
from dociq.data.schema import QUESTION_KINDS, Page, Question, Region
from dociq.data.text_blocks import words_in_masks
from dociq.io.rle import encode_rle, rle_string_counts


_SKIP_HINT = "or pass on_bad_sample='skip' to drop the page"
# image-entry fields read as data; every other scalar field is copied into Page.meta
_ENTRY_FIELDS = {"id", "file_name", "width", "height", "words", "questions", "links", "meta", "page_id",
                 "pdf_page"}


# ---------------------------------------------------------------------------------------------
# JSON field checks: hostile or hand-edited files carry any JSON type in any field


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_int(v) -> bool:
    return _is_number(v) and float(v).is_integer()


def _is_id(v) -> bool:
    """COCO ids are numbers or strings; lists/objects cannot index anything."""
    return isinstance(v, (int, float, str)) and not isinstance(v, bool)


def _int_list(value, path, what: str, field: str, fix: str) -> list[int]:
    if not isinstance(value, list) or not all(_is_int(v) for v in value):
        raise BadSampleError(path, f"{what} has {field} {value!r:.80}: need a list of integers", fix)
    return [int(v) for v in value]


def _xywh_box(value, path, what: str, field: str = "bbox") -> list[float]:
    """COCO [x, y, width, height] -> [x0, y0, x1, y1]; anything but 4 numbers is a bad page."""
    if not isinstance(value, (list, tuple)) or len(value) != 4 or not all(_is_number(v) for v in value):
        raise BadSampleError(path, f"{what} has {field} {value!r:.80}: need 4 numbers [x, y, width, height]",
                             f"fix the {field}, {_SKIP_HINT}")
    x, y, bw, bh = (float(v) for v in value)
    return [x, y, x + bw, y + bh]


# ---------------------------------------------------------------------------------------------
# masks and boxes


def decode_segmentation(segm: Any, size: tuple[int, int], where: str, path: Path,
                        tolerance: float = BOX_OVERSHOOT_TOLERANCE) -> np.ndarray | None:
    """Polygons / uncompressed RLE / compressed RLE -> bool [H, W]; None when there is no shape.

    `where` names the annotation in errors; polygons further outside the page than the overshoot
    tolerance are errors, small overshoots are clipped by rasterisation."""
    h, w = size
    if segm is None or (isinstance(segm, list) and len(segm) == 0):
        return None
    if isinstance(segm, list):  # polygons [[x0, y0, x1, y1, ...], ...]
        try:
            polys = [np.asarray(p, dtype=np.float64).reshape(-1) for p in segm]
        except (TypeError, ValueError) as err:
            raise BadSampleError(path, f"{where} has a malformed polygon segmentation ({err})",
                                 f"write polygons as [[x0, y0, x1, y1, ...]], {_SKIP_HINT}") from err
        polys = [p for p in polys if len(p) >= 6 and len(p) % 2 == 0]  # <3 points has no area
        if not polys:
            return None
        xy = np.concatenate(polys).reshape(-1, 2)
        check_box_in_page([xy[:, 0].min(), xy[:, 1].min(), xy[:, 0].max(), xy[:, 1].max()],
                          size, path, f"{where} (polygon extent)", tolerance)
        rles = mask_util.frPyObjects([p.tolist() for p in polys], h, w)
        rle = mask_util.merge(rles)
    elif isinstance(segm, dict) and "counts" in segm and "size" in segm:
        rle_size, counts = segm["size"], segm["counts"]
        if not isinstance(rle_size, list) or len(rle_size) != 2 or not all(_is_int(v) for v in rle_size):
            raise BadSampleError(path, f"{where} has an RLE with size {rle_size!r:.80}, not [height, width]",
                                 f"re-encode the mask, {_SKIP_HINT}")
        if [int(v) for v in rle_size] != [h, w]:
            raise BadSampleError(
                path, f"{where} has an RLE of size {list(rle_size)} but the page is {h}x{w} (HxW)",
                f"encode the mask at the image's size, {_SKIP_HINT}")
        try:
            if isinstance(counts, list):  # uncompressed RLE
                runs = counts if all(_is_int(c) for c in counts) else None
            elif isinstance(counts, (str, bytes)):
                counts = counts.encode("ascii") if isinstance(counts, str) else counts
                runs = rle_string_counts(counts)
            else:
                runs = None
        except (UnicodeEncodeError, ValueError):
            runs = None
        if runs is None or any(r < 0 for r in runs) or sum(runs) != h * w:
            raise BadSampleError(
                path, f"{where} has an RLE whose counts are not run lengths covering its {h}x{w} mask",
                f"re-encode the mask (pycocotools.mask.encode), {_SKIP_HINT}")
        if isinstance(counts, list):
            rle = mask_util.frPyObjects({"size": [h, w], "counts": [int(r) for r in runs]}, h, w)
        else:
            rle = {"size": [h, w], "counts": counts}
    else:
        raise BadSampleError(path, f"{where} has a segmentation that is neither polygons nor RLE",
                             f"use COCO polygons or RLE, {_SKIP_HINT}")
    try:
        return mask_util.decode(rle).astype(bool)
    except Exception as err:  # pycocotools raises plain Exceptions for broken counts
        raise BadSampleError(path, f"{where} has an undecodable RLE ({err})",
                             f"re-encode the mask, {_SKIP_HINT}") from err


def box_mask(box: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """bool [H, W] True inside the pixel box x0,y0,x1,y1 (pixels whose centre lies inside)."""
    h, w = size
    x0, y0, x1, y1 = np.rint(np.asarray(box, dtype=np.float64)).astype(int)
    m = np.zeros((h, w), dtype=bool)
    m[max(y0, 0):min(y1, h), max(x0, 0):min(x1, w)] = True
    return m


def category_question_text(name: str) -> str:
    """'Page-header' -> 'segment every page header'."""
    return "segment every " + re.sub(r"[\s_\-]+", " ", name).strip().lower()


def category_questions(regions: Sequence[Region], size: tuple[int, int]) -> list[Question]:
    """One 'category' question per label present, its target the union of that label's masks."""
    by_label: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(regions):
        by_label[r.label].append(i)
    out = []
    for label, ids in by_label.items():
        mask = np.zeros(size, dtype=bool)
        for i in ids:
            mask |= regions[i].mask
        out.append(Question(category_question_text(label), "category", mask, list(ids)))
    return out


# ---------------------------------------------------------------------------------------------
# reading


def read_annotation_json(path: Path) -> dict:
    """The whole annotation file; always raises (a data set without its index cannot be skipped)."""
    if not path.is_file():
        raise BadSampleError(path, "annotation file not found",
                             "pass annotation_file=<path to the COCO JSON, e.g. DIR/annotations.json>")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise BadSampleError(path, f"annotation file is not valid JSON ({err})",
                             "re-export or re-download it (a crash during writing truncates JSON)") from err
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise BadSampleError(path, "annotation file has no 'images' list",
                             "use COCO instance format: {'images': [...], 'annotations': [...], "
                             "'categories': [...]}")
    return data


class CocoDocuments(GuardedDocuments):
    """Pages of a COCO-format document data set (DocLayNet, PubLayNet, `write_coco_records` output).

    annotation_file:   the COCO JSON.
    image_dir:         where `file_name`s live; default `images/` beside the JSON if it exists,
                       else the JSON's folder. A `file_name` ending in .pdf is rendered with
                       pypdfium2 at the annotated width/height.
    ocr:               "groundtruth" (the "words" field), "tesseract", "pdf" (text layer of
                       `pdf_dir/<image stem>.pdf`, or of the page itself when it is a PDF), or a
                       backend object (see `dociq.data.ocr`).
    on_bad_sample:     "raise" or "skip" (then `__getitem__` returns None for that page).
    category_questions: "auto" (only for pages without a "questions" field), True, or False.
    require_words:     a page without words is a bad sample (the text encoder needs them).
    max_page_pixels:   a page image (decoded, or a PDF rendered at its annotated size) with more
                       pixels is a bad sample, found from the file header / PDF page size before
                       anything is allocated; None: no cap (Pillow's decompression-bomb limit
                       still applies to images). Default `DEFAULT_MAX_PAGE_PIXELS` (50 MP).

    Zero-area regions (a box or mask that covers no pixel) are dropped, not the page: the region,
    the links to it and the stored questions whose every region was dropped (unless they carry
    their own target mask) go; `region_ids` of the rest are renumbered. Each dropped region is
    warned about once and listed in `dataset.dropped_regions`, in "raise" and "skip" mode alike.
    """

    def __init__(
        self,
        annotation_file: str | Path,
        image_dir: str | Path | None = None,
        ocr: str | Any = "groundtruth",
        on_bad_sample: str = "raise",
        pdf_dir: str | Path | None = None,
        ocr_cache_dir: str | Path | None = None,
        ocr_options: dict | None = None,
        category_questions: bool | str = "auto",
        require_words: bool = True,
        box_tolerance: float = BOX_OVERSHOOT_TOLERANCE,
        max_page_pixels: int | None = DEFAULT_MAX_PAGE_PIXELS,
    ) -> None:
        self.annotation_file = Path(annotation_file)
        data = read_annotation_json(self.annotation_file)
        if image_dir is None:
            beside = self.annotation_file.parent / "images"
            image_dir = beside if beside.is_dir() else self.annotation_file.parent
        self.image_dir = Path(image_dir)
        self.pdf_dir = Path(pdf_dir) if pdf_dir is not None else self.image_dir
        self.policy = BadSamplePolicy(on_bad_sample)
        self.ocr_name = ocr if isinstance(ocr, str) else getattr(ocr, "name", type(ocr).__name__)
        self.ocr = make_ocr(ocr, cache_dir=ocr_cache_dir, **(ocr_options or {}))
        if category_questions not in ("auto", True, False):
            raise ValueError(f"category_questions={category_questions!r}: use 'auto', True or False")
        self.category_questions = category_questions
        self.require_words = require_words
        self.box_tolerance = box_tolerance
        self.max_page_pixels = max_page_pixels

        self.images: list[dict] = self._read_images(data["images"])
        self.categories = self._read_categories(data.get("categories") or [])
        self._anns: dict[Any, list[dict]] = defaultdict(list)
        annotations = data.get("annotations") or []
        if not isinstance(annotations, list):
            raise BadSampleError(self.annotation_file, f"'annotations' is a {type(annotations).__name__}, "
                                 "not a list", "use COCO instance format: {'annotations': [{...}, ...]}")
        image_ids = {img["id"] for img in self.images if img.get("id") is not None}
        first_use: dict[Any, Any] = {}  # annotation id -> image id of its first annotation
        duplicates: dict[Any, list] = defaultdict(list)  # repeated annotation id -> all its image ids
        for k, ann in enumerate(annotations):
            image_id = ann.get("image_id") if isinstance(ann, dict) else None
            if not _is_id(image_id) or image_id not in image_ids:
                # Not a page we could skip: report it against the file, once, at start-up.
                reason = (f"annotation {k} is not an object but {ann!r:.80}" if not isinstance(ann, dict) else
                          f"annotation id {ann.get('id')} refers to image id {image_id!r}, which is not in 'images'")
                err = BadSampleError(self.annotation_file, reason,
                                     f"remove the annotation or add its image entry, {_SKIP_HINT}")
                if self.policy.mode == "raise":
                    raise err
                self.policy.record(None, err)
                continue
            self._anns[image_id].append(ann)
            aid = ann.get("id")
            if not _is_id(aid):
                continue  # a missing id only matters to questions that refer to it: checked per page
            if aid not in first_use:
                first_use[aid] = image_id
                continue
            if aid not in duplicates:
                duplicates[aid].append(first_use[aid])
            duplicates[aid].append(image_id)
        # A duplicate annotation id makes `annotation_ids` ambiguous on the pages that use it, and
        # every annotation names its page, so it is those pages that are bad (skippable, counted),
        # not the whole file: one bad merge should not cost the rest of the data set.
        self._duplicate_ann_ids = dict(duplicates)

    def _read_images(self, images: list) -> list[dict]:
        """The image entries; a non-object entry or a repeated image id breaks the index: raise."""
        by_id: dict[Any, dict] = {}
        for k, entry in enumerate(images):
            if not isinstance(entry, dict):
                raise BadSampleError(self.annotation_file, f"image entry {k} is not an object but {entry!r:.80}",
                                     "write every entry of 'images' as {'id', 'file_name', 'width', 'height'}")
            image_id = entry.get("id")
            if image_id is None:
                continue  # no annotation can refer to it; the page reads without regions
            if not _is_id(image_id):
                raise BadSampleError(self.annotation_file, f"image entry {k} has id {image_id!r}, which is "
                                     "not a number or a string", "give every image a unique numeric id")
            if image_id in by_id:
                raise BadSampleError(
                    self.annotation_file,
                    f"image id {image_id!r} is used by two image entries ({by_id[image_id].get('file_name')!r} "
                    f"and {entry.get('file_name')!r}), so their annotations would merge into one page",
                    "give every image a unique id and point each annotation's image_id at its own image")
            by_id[image_id] = entry
        return images

    def _read_categories(self, cats: list) -> dict[Any, str]:
        """Category id -> name; a malformed entry or a repeated id breaks the index: raise."""
        if not isinstance(cats, list):
            raise BadSampleError(self.annotation_file, f"'categories' is a {type(cats).__name__}, not a list",
                                 "use COCO instance format: {'categories': [{'id': 1, 'name': ...}, ...]}")
        out = {}
        for c in cats:
            if not isinstance(c, dict) or "id" not in c or "name" not in c:
                raise BadSampleError(self.annotation_file, f"category entry {c!r:.80} lacks 'id' or 'name'",
                                     "give every category an id and a name")
            if not _is_id(c["id"]):
                raise BadSampleError(self.annotation_file, f"category entry {c!r:.80} has an id that is not "
                                     "a number or a string", "give every category a unique numeric id")
            if c["id"] in out:
                raise BadSampleError(
                    self.annotation_file,
                    f"category id {c['id']!r} is used twice ({out[c['id']]!r} and {str(c['name'])!r}), so "
                    "one class would silently take the other's name", "give every category a unique id")
            out[c["id"]] = str(c["name"])
        return out

    # -- Dataset ------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.images)

    def validate(self) -> list[BadSample]:
        """Load every page once and return the bad ones, without raising (a pre-flight check)."""
        bad = []
        for i in range(len(self)):
            try:
                self.load_page(i)
            except BadSampleError as err:
                bad.append(BadSample(i, err.path, err.reason))
        return bad

    # -- one page -----------------------------------------------------------------------------
    def image_path(self, index: int) -> Path:
        entry = self.images[index]
        name = entry.get("file_name")
        if not isinstance(name, str) or not name:
            has = "has no 'file_name'" if "file_name" not in entry else f"has file_name {name!r}, not a file name"
            raise BadSampleError(self.annotation_file, f"image entry {index} (id {entry.get('id')}) {has}",
                                 f"add the file name, {_SKIP_HINT}")
        return self.image_dir / name

    def _check_entry(self, entry: dict, where: str) -> tuple[int, int] | None:
        """Validate the image entry's own fields (cheap, before any file is read); the annotated
        (H, W) or None."""
        for field, kind in (("words", list), ("questions", list), ("links", list), ("meta", dict)):
            if entry.get(field) is not None and not isinstance(entry[field], kind):
                raise BadSampleError(self.annotation_file, f"'{field}' of {where} is a "
                                     f"{type(entry[field]).__name__}, not a{'n object' if kind is dict else ' list'}",
                                     f"fix '{field}', {_SKIP_HINT}")
        page = entry.get("pdf_page", 0)
        if not _is_int(page) or page < 0:
            raise BadSampleError(self.annotation_file, f"{where} has pdf_page {page!r}, not a page index",
                                 f"give the 0-based page of the PDF, {_SKIP_HINT}")
        if "width" not in entry or "height" not in entry:
            return None
        for field in ("width", "height"):
            if not _is_int(entry[field]) or entry[field] <= 0:
                raise BadSampleError(self.annotation_file, f"{where} has {field} {entry[field]!r}, not a "
                                     "positive number of pixels", f"fix {field}, {_SKIP_HINT}")
        return int(entry["height"]), int(entry["width"])

    def load_page(self, index: int) -> Page:
        """The page at `index`; raises BadSampleError whatever `on_bad_sample` says."""
        entry = self.images[index]
        path = self.image_path(index)
        where = f"image {entry['file_name']!r} (id {entry.get('id')})"
        annotated_size = self._check_entry(entry, where)
        image = self._load_image(entry, path, annotated_size)
        size = image.shape[:2]
        if annotated_size is not None and annotated_size != size:
            raise BadSampleError(
                path, f"image is {size[1]}x{size[0]} (WxH) but {self.annotation_file.name} says "
                f"{entry['width']}x{entry['height']}",
                f"fix width/height in the annotation or use the image it was made for, {_SKIP_HINT}")

        if self.ocr is None:
            words, word_boxes = self._groundtruth_words(entry, path, size)
        else:
            ocr_words = self._ocr_words(entry, path, image)
            words, word_boxes = list(ocr_words.words), ocr_words.boxes
        if self.require_words and not words:
            raise BadSampleError(path, *self._no_words_message(path))

        regions, ann_order, file_to_region = self._regions(index, entry, size, word_boxes, words, where)
        questions = self._questions(entry, regions, ann_order, file_to_region, size, where)
        links = self._links(entry, file_to_region, where)
        # provenance the image entry carries (DocLayNet: doc_category, collection, page_no, ...)
        meta = {k: v for k, v in entry.items()
                if k not in _ENTRY_FIELDS and isinstance(v, (str, int, float, bool))}
        meta.update(entry.get("meta") or {})
        meta.update(page_id=str(entry.get("page_id", Path(entry["file_name"]).stem)), source=str(path),
                    image_id=entry.get("id"), dataset="coco", annotation_file=str(self.annotation_file))
        return Page(image=image, words=words, word_boxes=word_boxes, regions=regions,
                    questions=questions, links=links, meta=meta)

    def _no_words_message(self, path: Path) -> tuple[str, str]:
        if self.ocr is None:
            return ("page has no words: ocr='groundtruth' but the annotation has no 'words' for it",
                    "use ocr='tesseract' or ocr='pdf' (DocLayNet/PubLayNet ship no words), add words, "
                    f"pass require_words=False, {_SKIP_HINT}")
        return (f"OCR backend {self.ocr_name!r} found no words on the page",
                "check the page is not blank / the PDF has a text layer (else use ocr='tesseract'), "
                f"pass require_words=False, {_SKIP_HINT}")

    def _load_image(self, entry: dict, path: Path, annotated_size: tuple[int, int] | None) -> np.ndarray:
        if path.suffix.lower() != ".pdf":
            return load_page_image(path, self.max_page_pixels)
        dpi = self.ocr.dpi if isinstance(self.ocr, PdfTextLayer) else PdfTextLayer().dpi
        renderer = PdfTextLayer(dpi=dpi, max_page_pixels=self.max_page_pixels)
        return renderer.render(path, int(entry.get("pdf_page", 0)), size=annotated_size)

    def _ocr_words(self, entry: dict, path: Path, image: np.ndarray) -> OcrWords:
        is_pdf = path.suffix.lower() == ".pdf"
        page_index = int(entry.get("pdf_page", 0))
        if isinstance(self.ocr, PdfTextLayer):
            pdf = path if is_pdf else self.pdf_dir / (Path(entry["file_name"]).stem + ".pdf")
            if not pdf.is_file():
                raise BadSampleError(pdf, "ocr='pdf' needs the page's PDF, which was not found",
                                     f"pass pdf_dir=<folder of <image stem>.pdf files>, use "
                                     f"ocr='tesseract', {_SKIP_HINT}")
            return self.ocr.words(pdf, page_index, size=image.shape[:2])
        words = self.ocr.recognise(image)
        return words if words.size == image.shape[:2] else words.scaled_to(image.shape[:2])

    def _groundtruth_words(self, entry: dict, path: Path, size) -> tuple[list[str], np.ndarray]:
        words, boxes = [], []
        for j, w in enumerate(entry.get("words") or []):
            if not isinstance(w, dict) or "text" not in w or "bbox" not in w:
                raise BadSampleError(self.annotation_file,
                                     f"word {j} of {entry['file_name']!r} is malformed: {w!r:.80}",
                                     f"write words as {{'text': str, 'bbox': [x, y, w, h]}}, {_SKIP_HINT}")
            text = str(w["text"])
            boxes.append(_xywh_box(w["bbox"], self.annotation_file, f"word {j} {text!r} of {entry['file_name']!r}"))
            words.append(text)
        boxes = check_boxes_in_page(boxes, size, self.annotation_file,
                                    lambda j: f"word {j} {words[j]!r} of {entry['file_name']!r}", self.box_tolerance)
        return words, boxes

    def _regions(self, index, entry, size, word_boxes, words, where):
        """Regions in file order without the zero-area ones; also annotation id -> position in the
        file and, per position, the region index (None: dropped)."""
        anns = self._anns.get(entry.get("id"), [])
        regions, masks_for_words, ann_order, file_to_region = [], [], {}, []
        for pos, ann in enumerate(anns):
            aid = ann.get("id")
            what = f"annotation id {aid} of {where}"
            if aid is not None and not _is_id(aid):
                raise BadSampleError(self.annotation_file, f"{what} has an id that is not a number or a string",
                                     f"give every annotation a unique numeric id, {_SKIP_HINT}")
            if aid in self._duplicate_ann_ids:
                used_by = sorted(self._duplicate_ann_ids[aid], key=str)
                raise BadSampleError(
                    self.annotation_file,
                    f"{what} is not unique: {len(used_by)} annotations use it (on image ids {used_by}), so "
                    "questions' annotation_ids could resolve to the wrong region",
                    "give every annotation a unique id, or pass on_bad_sample='skip' to drop the pages involved")
            cat = ann.get("category_id")
            if not _is_id(cat) or cat not in self.categories:
                raise BadSampleError(
                    self.annotation_file,
                    f"{what} has category id {cat!r}, which is not in 'categories' "
                    f"(known ids: {sorted(self.categories, key=str)})",
                    f"add the category or fix the annotation, {_SKIP_HINT}")
            mask = decode_segmentation(ann.get("segmentation"), size, what, self.annotation_file,
                                       self.box_tolerance)
            if "bbox" in ann:
                box = check_box_in_page(_xywh_box(ann["bbox"], self.annotation_file, what), size,
                                        self.annotation_file, what, self.box_tolerance)
            elif mask is not None:
                box = mask_box(mask)
                if box is None:          # an empty segmentation without a bbox: a zero box
                    box = np.zeros(4, np.float32)
            else:
                raise BadSampleError(self.annotation_file, f"{what} has neither 'bbox' nor 'segmentation'",
                                     f"give it a bbox [x, y, w, h], {_SKIP_HINT}")
            if mask is None:
                mask = box_mask(box, size)
            word_ids = ann.get("word_ids")
            if word_ids is not None:
                word_ids = _int_list(word_ids, self.annotation_file, what, "word_ids", f"fix word_ids, {_SKIP_HINT}")
                if any(not 0 <= j < len(words) for j in word_ids):
                    raise BadSampleError(self.annotation_file, f"{what} has word_ids {word_ids} but the page "
                                         f"has {len(words)} words", f"fix word_ids, {_SKIP_HINT}")
            if aid is not None:
                ann_order[aid] = pos
            if box[2] <= box[0] or box[3] <= box[1] or not mask.any():
                self.policy.record_dropped(index, self.annotation_file, what,
                                           f"zero area: its box {np.round(box, 2).tolist()} or mask covers no "
                                           "pixel, so it cannot be a target; the region, its links and the "
                                           "questions left without a target are dropped")
                file_to_region.append(None)
                continue
            file_to_region.append(len(regions))
            regions.append(Region(label=self.categories[cat], box=box, mask=mask,
                                  text=str(ann.get("text", "")), word_ids=word_ids if word_ids is not None else []))
            masks_for_words.append(None if word_ids is not None else mask)
        # Regions without stored word_ids (real data, OCR words) get the words whose centre they hold.
        todo = [i for i, m in enumerate(masks_for_words) if m is not None]
        for i, ids in zip(todo, words_in_masks(word_boxes, [masks_for_words[i] for i in todo])):
            regions[i].word_ids = ids
            if not regions[i].text:
                regions[i].text = " ".join(words[j] for j in ids)
        return regions, ann_order, file_to_region

    def _questions(self, entry, regions, ann_order, file_to_region, size, where) -> list[Question]:
        out = []
        for k, q in enumerate(entry.get("questions") or []):
            what = f"question {k} of {where}"
            if not isinstance(q, dict) or not str(q.get("text", "")).strip():
                raise BadSampleError(self.annotation_file, f"{what} has no text",
                                     f"give every question a 'text', {_SKIP_HINT}")
            kind = q.get("kind", "category")
            if not isinstance(kind, str) or kind not in QUESTION_KINDS:
                raise BadSampleError(self.annotation_file, f"{what} has kind {kind!r}, not one of "
                                     f"{QUESTION_KINDS}", f"fix the kind, {_SKIP_HINT}")
            if "annotation_ids" in q:
                ids = q["annotation_ids"]
                if not isinstance(ids, list) or not all(_is_id(a) for a in ids):
                    raise BadSampleError(self.annotation_file, f"{what} has annotation_ids {ids!r:.80}: need a "
                                         "list of annotation ids", f"fix annotation_ids, {_SKIP_HINT}")
                missing = [a for a in ids if a not in ann_order]
                if missing:
                    raise BadSampleError(self.annotation_file, f"{what} refers to annotation ids {missing} "
                                         "that this image does not have", f"fix annotation_ids, {_SKIP_HINT}")
                targets = [ann_order[a] for a in ids]
            else:
                targets = _int_list(q.get("region_ids", []), self.annotation_file, what, "region_ids",
                                    f"fix region_ids, {_SKIP_HINT}")
                if any(not 0 <= i < len(file_to_region) for i in targets):
                    raise BadSampleError(self.annotation_file, f"{what} has region_ids {targets} but "
                                         f"the page has {len(file_to_region)} regions", f"fix region_ids, {_SKIP_HINT}")
            region_ids = [file_to_region[i] for i in targets if file_to_region[i] is not None]
            mask = decode_segmentation(q.get("segmentation"), size, what, self.annotation_file)
            if mask is None:
                if targets and not region_ids:
                    continue  # every region it asks for had zero area (dropped, warned): no target left
                mask = np.zeros(size, dtype=bool)
                for i in region_ids:
                    mask |= regions[i].mask
            out.append(Question(str(q["text"]), kind, mask, region_ids))
        # "auto": pages whose entry has no "questions" key (DocLayNet, PubLayNet) get category
        # questions; an explicit list, even an empty one, is taken as the page's questions.
        if self.category_questions is True or (self.category_questions == "auto" and "questions" not in entry):
            out.extend(category_questions(regions, size))
        return out

    def _links(self, entry, file_to_region, where) -> list[tuple[int, int]]:
        links, n = [], len(file_to_region)
        for link in entry.get("links") or []:
            if not isinstance(link, (list, tuple)) or len(link) != 2 or not all(_is_int(v) for v in link):
                raise BadSampleError(self.annotation_file, f"link {link!r:.80} of {where} is not a pair of "
                                     "region indices",
                                     f"write links as [[key_region, value_region], ...], {_SKIP_HINT}")
            a, b = int(link[0]), int(link[1])
            if not (0 <= a < n and 0 <= b < n):
                raise BadSampleError(self.annotation_file, f"link {list(link)} of {where} points outside "
                                     f"its {n} regions", f"fix 'links', {_SKIP_HINT}")
            if file_to_region[a] is not None and file_to_region[b] is not None:  # else an end was dropped
                links.append((file_to_region[a], file_to_region[b]))
        return links


# ---------------------------------------------------------------------------------------------
# writing: one writer of dociq's COCO variant. It takes plain per-page records (`CocoPage`);
# `write_coco` builds them from `Page`s, the engine's export (`dociq.engine.coco_export`) from its
# annotation store.


@dataclass
class CocoRegion:
    """One COCO annotation of a `CocoPage`.

    label:        its category name (categories get ids 1.. in the order first written).
    segmentation: compressed RLE {"size": [H, W], "counts": str} at the page's size.
    bbox, area:   COCO [x, y, width, height] and pixel count.
    id:           annotation id, unique in the file; None: the number of annotations written
                  before it + 1 (the ids `write_coco` gives).
    text, word_ids: None leaves the field out (the reader then gives the region the words whose
                  centre it holds, and their text).
    """
    label: str
    segmentation: dict
    bbox: Sequence[float]
    area: float
    id: int | None = None
    text: str | None = None
    word_ids: Sequence[int] | None = None


@dataclass
class CocoQuestion:
    """A question of a `CocoPage`: `region_ids` index the page's `regions` (written as the
    annotations' ids, `annotation_ids`); `segmentation` (compressed RLE) is its target, None: the
    union of its regions (the reader's default)."""
    text: str
    kind: str
    region_ids: Sequence[int] = ()
    segmentation: dict | None = None


@dataclass
class CocoPage:
    """One image entry with its annotations, as `write_coco_records` writes it.

    image:     uint8 [H, W, 3] (saved as PNG) or the path of an image file (hard-linked into the
               image folder when the file system allows, else copied: it must not change in place).
    file_name: the image's name in the image folder; None: "<image id>.png".
    page_id:   None: the image id. word_boxes: [K, 4] x0, y0, x1, y1 (written as COCO x, y, w, h).
    links:     [key_region, value_region] index pairs into `regions`. meta: JSON-safe items kept.
    """
    image: np.ndarray | Path
    width: int
    height: int
    words: Sequence[str] = ()
    word_boxes: Any = ()
    regions: list[CocoRegion] = field(default_factory=list)
    questions: list[CocoQuestion] = field(default_factory=list)
    links: Sequence[tuple[int, int]] = ()
    page_id: str | None = None
    file_name: str | None = None
    meta: dict = field(default_factory=dict)


def _json_safe(meta: dict) -> dict:
    out = {}
    for k, v in meta.items():
        try:
            json.dumps(v)
        except (TypeError, ValueError):
            continue
        out[str(k)] = v
    return out


def _place_file(src: Path, dst: Path) -> None:
    """Hard-link `src` to `dst` (no copy of an unchanging page), else copy it; replace atomically."""
    tmp = dst.with_name(f".{dst.name}.tmp{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def _write_image(record: CocoPage, dst: Path, where: str) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(record.image, (str, Path)):
        _place_file(Path(record.image), dst)
        return
    image = record.image
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"{where}: image must be uint8 [H, W, 3], got {image.dtype} {image.shape}")
    if image.shape[:2] != (record.height, record.width):
        raise ValueError(f"{where}: image is {image.shape[:2]} (HxW) but the record says "
                         f"{(record.height, record.width)}")
    save_page_image(image, dst)


def write_coco_records(pages: Iterable[CocoPage], json_path: str | Path, image_dir: str | Path | None = None,
                       info: dict | None = None) -> Path:
    """Write page records as COCO instance JSON at `json_path`, images into `image_dir` (default
    `images/` beside the JSON, where `CocoDocuments` looks). Returns `json_path`.

    dociq's extra fields (see the module doc) carry words, questions, links, region text/word_ids
    and meta; a question's targets are written as `annotation_ids` (the annotations' ids, which
    survive tools that reorder or filter annotations). Every file is written atomically, the JSON
    last, so it never lists an image that is not there and a crash leaves the previous one."""
    json_path = Path(json_path)
    image_dir = json_path.parent / "images" if image_dir is None else Path(image_dir)
    image_dir.mkdir(parents=True, exist_ok=True)
    categories: dict[str, int] = {}
    images, annotations, used_ids = [], [], set()
    for index, record in enumerate(pages):
        image_id = index + 1
        page_id = str(image_id if record.page_id is None else record.page_id)
        where = f"page {index} ({page_id})"
        h, w = int(record.height), int(record.width)
        file_name = record.file_name or f"{image_id}.png"
        _write_image(record, image_dir / file_name, where)
        ann_ids = []
        for r_index, region in enumerate(record.regions):
            if [int(v) for v in region.segmentation["size"]] != [h, w]:
                raise ValueError(f"{where} region {r_index}: mask {tuple(region.segmentation['size'])} "
                                 f"!= page {(h, w)}")
            ann_id = len(annotations) + 1 if region.id is None else region.id
            if ann_id in used_ids:
                raise ValueError(f"{where} region {r_index}: annotation id {ann_id} is already used: "
                                 "annotation ids must be unique in the file")
            used_ids.add(ann_id)
            ann_ids.append(ann_id)
            ann = {"id": ann_id, "image_id": image_id,
                   "category_id": categories.setdefault(region.label, len(categories) + 1),
                   "bbox": [float(v) for v in region.bbox], "area": float(region.area), "iscrowd": 0,
                   "segmentation": dict(region.segmentation)}
            if region.text is not None:
                ann["text"] = str(region.text)
            if region.word_ids is not None:
                ann["word_ids"] = [int(j) for j in region.word_ids]
            annotations.append(ann)
        questions = []
        for k, q in enumerate(record.questions):
            if any(not 0 <= int(i) < len(ann_ids) for i in q.region_ids):
                raise ValueError(f"{where} question {k} ({q.text!r}): region_ids {list(q.region_ids)} but the "
                                 f"page has {len(ann_ids)} regions")
            entry = {"text": q.text, "kind": q.kind, "annotation_ids": [ann_ids[int(i)] for i in q.region_ids]}
            if q.segmentation is not None:
                entry["segmentation"] = dict(q.segmentation)
            questions.append(entry)
        images.append({
            "id": image_id, "file_name": file_name, "width": w, "height": h, "page_id": page_id,
            "words": [{"text": t, "bbox": [float(b[0]), float(b[1]), float(b[2] - b[0]), float(b[3] - b[1])]}
                      for t, b in zip(record.words, np.asarray(record.word_boxes, np.float64))],
            "questions": questions,
            "links": [[int(a), int(b)] for a, b in record.links],
            "meta": _json_safe(record.meta),
        })
    data = {
        "info": dict(info or {}),
        "images": images, "annotations": annotations,
        "categories": [{"id": i, "name": name, "supercategory": "document"} for name, i in categories.items()],
    }
    atomic_write_text(json_path, json.dumps(data))
    return json_path


def page_record(page: Page) -> CocoPage:
    """A `Page` as a `CocoPage`: masks as RLE, boxes as COCO boxes, every question with its mask
    (a target need not be the union of its regions), so `CocoDocuments` reads back the same page."""
    h, w = page.size
    regions = []
    for r_index, region in enumerate(page.regions):
        if region.mask.shape != (h, w):
            raise ValueError(f"page {page.meta.get('page_id')} region {r_index}: mask {region.mask.shape} "
                             f"!= page {(h, w)}")
        x0, y0, x1, y1 = (float(v) for v in region.box)
        regions.append(CocoRegion(label=region.label, segmentation=encode_rle(region.mask),
                                  bbox=[x0, y0, x1 - x0, y1 - y0], area=float(region.mask.sum()),
                                  text=region.text, word_ids=[int(j) for j in region.word_ids]))
    questions = [CocoQuestion(q.text, q.kind, [int(i) for i in q.region_ids], encode_rle(q.mask))
                 for q in page.questions]
    page_id = page.meta.get("page_id")
    return CocoPage(image=page.image, width=w, height=h, words=list(page.words), word_boxes=page.word_boxes,
                    regions=regions, questions=questions, links=list(page.links),
                    page_id=None if page_id is None else str(page_id), meta=page.meta)


def write_coco(pages: Iterable[Page], out_dir: str | Path) -> Path:
    """Write pages as `out_dir/annotations.json` + `out_dir/images/<image id>.png`
    (`write_coco_records` of each `page_record`), so `CocoDocuments` reads back the same pages.
    Every file is written atomically; annotations.json last."""
    out_dir = Path(out_dir)
    return write_coco_records((page_record(p) for p in pages), out_dir / "annotations.json", out_dir / "images",
                              info={"description": "written by dociq.data.datasets.coco.write_coco"})
