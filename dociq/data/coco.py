"""COCO instance JSON as DocLayNet and PubLayNet ship it, read as `Page`s; and the writer for it.

Regions are the annotations (label = category name; polygons and RLE, compressed or not, decoded
with pycocotools). Pages get one "category" question per category present ("segment every
table" -> union mask); box/point prompts are sampled later by the collator from question masks.

dociq's extra fields, read when present and written by `write_coco`:
  image entry  "words":     [{"text", "bbox": [x, y, w, h]}]          ground-truth OCR
               "questions": [{"text", "kind", "region_ids" | "annotation_ids",
                              "segmentation": RLE}]                    region_ids index the page's
                                                                       annotations in file order
               "links":     [[key_region, value_region], ...]          region indices
               "page_id", "meta", "pdf_page" (page of a multi-page PDF file_name / pdf_dir PDF)
  annotation   "text", "word_ids"                                      word_ids index "words"

Bad pages raise `BadSampleError` naming the file and the fix, or with on_bad_sample="skip" the
page reads as `None`, is logged once and listed in `dataset.bad_samples`.
"""
from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
from pycocotools import mask as mask_util
from torch.utils.data import Dataset

from dociq.data.errors import (
    BOX_OVERSHOOT_TOLERANCE, BadSample, BadSampleError, BadSamplePolicy, check_box_in_page,
    check_boxes_in_page,
)
from dociq.data.image_io import atomic_write_text, load_page_image, save_page_image
from dociq.data.ocr import OcrWords, PdfTextLayer, make_ocr
from dociq.data.schema import QUESTION_KINDS, Page, Question, Region


_SKIP_HINT = "or pass on_bad_sample='skip' to drop the page"
# image-entry fields read as data; every other scalar field is copied into Page.meta
_ENTRY_FIELDS = {"id", "file_name", "width", "height", "words", "questions", "links", "meta", "page_id",
                 "pdf_page"}


# ---------------------------------------------------------------------------------------------
# masks and boxes


def encode_mask(mask: np.ndarray) -> dict:
    """bool [H, W] -> compressed COCO RLE with a str `counts` (JSON-safe)."""
    rle = mask_util.encode(np.asfortranarray(mask.astype(np.uint8)))
    return {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")}


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
        if [int(v) for v in segm["size"]] != [h, w]:
            raise BadSampleError(
                path, f"{where} has an RLE of size {list(segm['size'])} but the page is {h}x{w} (HxW)",
                f"encode the mask at the image's size, {_SKIP_HINT}")
        if isinstance(segm["counts"], list):  # uncompressed RLE
            rle = mask_util.frPyObjects(segm, h, w)
        else:
            counts = segm["counts"]
            rle = {"size": [h, w], "counts": counts.encode("ascii") if isinstance(counts, str) else counts}
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


def mask_to_box(mask: np.ndarray) -> np.ndarray:
    ys, xs = np.nonzero(mask)
    if len(ys) == 0:
        return np.zeros(4, np.float32)
    return np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], np.float32)


def words_in_regions(word_boxes: np.ndarray, masks: Sequence[np.ndarray]) -> list[list[int]]:
    """For each region mask, the indices of the words whose box centre lies in it."""
    if len(word_boxes) == 0:
        return [[] for _ in masks]
    cx = ((word_boxes[:, 0] + word_boxes[:, 2]) / 2).astype(int)
    cy = ((word_boxes[:, 1] + word_boxes[:, 3]) / 2).astype(int)
    out = []
    for m in masks:
        h, w = m.shape
        inside = m[cy.clip(0, h - 1), cx.clip(0, w - 1)]
        out.append(np.nonzero(inside)[0].tolist())
    return out


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


class CocoDocuments(Dataset):
    """Pages of a COCO-format document data set (DocLayNet, PubLayNet, `write_coco` output).

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

        self.images: list[dict] = data["images"]
        self.categories = self._read_categories(data.get("categories", []))
        self._anns: dict[Any, list[dict]] = defaultdict(list)
        image_ids = {img.get("id") for img in self.images}
        for ann in data.get("annotations", []):
            if ann.get("image_id") not in image_ids:
                # Not a page we could skip: report it against the file, once, at start-up.
                err = BadSampleError(
                    self.annotation_file,
                    f"annotation id {ann.get('id')} refers to image id {ann.get('image_id')!r}, "
                    "which is not in 'images'",
                    f"remove the annotation or add its image entry, {_SKIP_HINT}")
                if self.policy.mode == "raise":
                    raise err
                self.policy.record(None, err)
                continue
            self._anns[ann["image_id"]].append(ann)

    def _read_categories(self, cats: Iterable[dict]) -> dict[Any, str]:
        out = {}
        for c in cats:
            if "id" not in c or "name" not in c:
                raise BadSampleError(self.annotation_file, f"category entry {c!r} lacks 'id' or 'name'",
                                     "give every category an id and a name")
            out[c["id"]] = str(c["name"])
        return out

    # -- Dataset ------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> Page | None:
        return self.policy.run(index, lambda: self.load_page(index))

    @property
    def bad_samples(self) -> list[BadSample]:
        """Pages skipped so far in this process (each DataLoader worker keeps its own list)."""
        return self.policy.bad_samples

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
        if "file_name" not in entry:
            raise BadSampleError(self.annotation_file, f"image entry {index} (id {entry.get('id')}) "
                                 "has no 'file_name'", f"add the file name, {_SKIP_HINT}")
        return self.image_dir / entry["file_name"]

    def load_page(self, index: int) -> Page:
        """The page at `index`; raises BadSampleError whatever `on_bad_sample` says."""
        entry = self.images[index]
        path = self.image_path(index)
        image = self._load_image(entry, path)
        size = image.shape[:2]
        where = f"image {entry['file_name']!r} (id {entry.get('id')})"
        if "width" in entry and "height" in entry and (int(entry["height"]), int(entry["width"])) != size:
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

        regions, ann_index = self._regions(entry, path, size, word_boxes, words, where)
        questions = self._questions(entry, regions, ann_index, size, where)
        links = self._links(entry, len(regions), where)
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

    def _load_image(self, entry: dict, path: Path) -> np.ndarray:
        if path.suffix.lower() != ".pdf":
            return load_page_image(path)
        annotated_size = (int(entry["height"]), int(entry["width"])) if "width" in entry and "height" in entry else None
        backend = self.ocr if isinstance(self.ocr, PdfTextLayer) else PdfTextLayer()
        return backend.render(path, int(entry.get("pdf_page", 0)), size=annotated_size)

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
            try:
                text, (x, y, bw, bh) = str(w["text"]), (float(v) for v in w["bbox"])
            except (KeyError, TypeError, ValueError) as err:
                raise BadSampleError(self.annotation_file,
                                     f"word {j} of {entry['file_name']!r} is malformed: {w!r}",
                                     f"write words as {{'text': str, 'bbox': [x, y, w, h]}}, {_SKIP_HINT}") from err
            words.append(text)
            boxes.append((x, y, x + bw, y + bh))
        boxes = check_boxes_in_page(boxes, size, self.annotation_file,
                                    lambda j: f"word {j} {words[j]!r} of {entry['file_name']!r}", self.box_tolerance)
        return words, boxes

    def _regions(self, entry, path, size, word_boxes, words, where):
        anns = self._anns.get(entry.get("id"), [])
        regions, masks_for_words, ann_index = [], [], {}
        for ann in anns:
            what = f"annotation id {ann.get('id')} of {where}"
            cat = ann.get("category_id")
            if cat not in self.categories:
                raise BadSampleError(
                    self.annotation_file,
                    f"{what} has category id {cat!r}, which is not in 'categories' "
                    f"(known ids: {sorted(self.categories, key=str)})",
                    f"add the category or fix the annotation, {_SKIP_HINT}")
            mask = decode_segmentation(ann.get("segmentation"), size, what, self.annotation_file,
                                       self.box_tolerance)
            if "bbox" in ann:
                x, y, bw, bh = [float(v) for v in ann["bbox"]]
                box = check_box_in_page([x, y, x + bw, y + bh], size, self.annotation_file, what,
                                        self.box_tolerance)
            elif mask is not None:
                box = mask_to_box(mask)
            else:
                raise BadSampleError(self.annotation_file, f"{what} has neither 'bbox' nor 'segmentation'",
                                     f"give it a bbox [x, y, w, h], {_SKIP_HINT}")
            if mask is None:
                mask = box_mask(box, size)
            word_ids = ann.get("word_ids")
            if word_ids is not None and any(not 0 <= int(j) < len(words) for j in word_ids):
                raise BadSampleError(self.annotation_file, f"{what} has word_ids {word_ids} but the page "
                                     f"has {len(words)} words", f"fix word_ids, {_SKIP_HINT}")
            ann_index[ann.get("id")] = len(regions)
            regions.append(Region(label=self.categories[cat], box=box, mask=mask,
                                  text=str(ann.get("text", "")),
                                  word_ids=[int(j) for j in word_ids] if word_ids is not None else []))
            masks_for_words.append(None if word_ids is not None else mask)
        # Regions without stored word_ids (real data, OCR words) get the words whose centre they hold.
        todo = [i for i, m in enumerate(masks_for_words) if m is not None]
        for i, ids in zip(todo, words_in_regions(word_boxes, [masks_for_words[i] for i in todo])):
            regions[i].word_ids = ids
            if not regions[i].text:
                regions[i].text = " ".join(words[j] for j in ids)
        return regions, ann_index

    def _questions(self, entry, regions, ann_index, size, where) -> list[Question]:
        stored = entry.get("questions") or []
        out = []
        for k, q in enumerate(stored):
            what = f"question {k} of {where}"
            if not isinstance(q, dict) or not str(q.get("text", "")).strip():
                raise BadSampleError(self.annotation_file, f"{what} has no text",
                                     f"give every question a 'text', {_SKIP_HINT}")
            kind = q.get("kind", "category")
            if kind not in QUESTION_KINDS:
                raise BadSampleError(self.annotation_file, f"{what} has kind {kind!r}, not one of "
                                     f"{QUESTION_KINDS}", f"fix the kind, {_SKIP_HINT}")
            if "annotation_ids" in q:
                missing = [a for a in q["annotation_ids"] if a not in ann_index]
                if missing:
                    raise BadSampleError(self.annotation_file, f"{what} refers to annotation ids {missing} "
                                         "that this image does not have", f"fix annotation_ids, {_SKIP_HINT}")
                region_ids = [ann_index[a] for a in q["annotation_ids"]]
            else:
                region_ids = [int(i) for i in q.get("region_ids", [])]
                if any(not 0 <= i < len(regions) for i in region_ids):
                    raise BadSampleError(self.annotation_file, f"{what} has region_ids {region_ids} but "
                                         f"the page has {len(regions)} regions", f"fix region_ids, {_SKIP_HINT}")
            mask = decode_segmentation(q.get("segmentation"), size, what, self.annotation_file)
            if mask is None:
                mask = np.zeros(size, dtype=bool)
                for i in region_ids:
                    mask |= regions[i].mask
            out.append(Question(str(q["text"]), kind, mask, region_ids))
        # "auto": pages whose entry has no "questions" key (DocLayNet, PubLayNet) get category
        # questions; an explicit list, even an empty one, is taken as the page's questions.
        if self.category_questions is True or (self.category_questions == "auto" and "questions" not in entry):
            out.extend(category_questions(regions, size))
        return out

    def _links(self, entry, n_regions, where) -> list[tuple[int, int]]:
        links = []
        for link in entry.get("links") or []:
            a, b = (int(v) for v in link)
            if not (0 <= a < n_regions and 0 <= b < n_regions):
                raise BadSampleError(self.annotation_file, f"link {list(link)} of {where} points outside "
                                     f"its {n_regions} regions", f"fix 'links', {_SKIP_HINT}")
            links.append((a, b))
        return links


# ---------------------------------------------------------------------------------------------
# writing


def _json_safe(meta: dict) -> dict:
    out = {}
    for k, v in meta.items():
        try:
            json.dumps(v)
        except (TypeError, ValueError):
            continue
        out[str(k)] = v
    return out


def write_coco(pages: Iterable[Page], out_dir: str | Path) -> Path:
    """Write pages as `out_dir/annotations.json` + `out_dir/images/<image id>.png`.

    Words, questions (with RLE target masks), links, region text/word_ids and JSON-safe meta go
    into dociq's extra fields, so `CocoDocuments` reads back the same pages. Every file is
    written atomically; annotations.json last, so it never lists an image that is not there.
    """
    out_dir = Path(out_dir)
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    categories: dict[str, int] = {}
    images, annotations = [], []
    for index, page in enumerate(pages):
        image_id = index + 1
        h, w = page.size
        if page.image.dtype != np.uint8 or page.image.ndim != 3 or page.image.shape[2] != 3:
            raise ValueError(f"page {index} ({page.meta.get('page_id')}): image must be uint8 [H, W, 3], "
                             f"got {page.image.dtype} {page.image.shape}")
        file_name = f"{image_id}.png"
        save_page_image(page.image, out_dir / "images" / file_name)
        first_ann = len(annotations) + 1
        for r_index, region in enumerate(page.regions):
            if region.mask.shape != (h, w):
                raise ValueError(f"page {index} region {r_index}: mask {region.mask.shape} != page {(h, w)}")
            cat = categories.setdefault(region.label, len(categories) + 1)
            x0, y0, x1, y1 = (float(v) for v in region.box)
            annotations.append({
                "id": first_ann + r_index, "image_id": image_id, "category_id": cat,
                "bbox": [x0, y0, x1 - x0, y1 - y0], "area": float(region.mask.sum()), "iscrowd": 0,
                "segmentation": encode_mask(region.mask),
                "text": region.text, "word_ids": [int(j) for j in region.word_ids],
            })
        images.append({
            "id": image_id, "file_name": file_name, "width": w, "height": h,
            "page_id": str(page.meta.get("page_id", image_id)),
            "words": [{"text": t, "bbox": [float(b[0]), float(b[1]), float(b[2] - b[0]), float(b[3] - b[1])]}
                      for t, b in zip(page.words, np.asarray(page.word_boxes, np.float64))],
            "questions": [{"text": q.text, "kind": q.kind, "region_ids": [int(i) for i in q.region_ids],
                           "segmentation": encode_mask(q.mask)} for q in page.questions],
            "links": [[int(a), int(b)] for a, b in page.links],
            "meta": _json_safe(page.meta),
        })
    data = {
        "info": {"description": "written by dociq.data.coco.write_coco"},
        "images": images, "annotations": annotations,
        "categories": [{"id": i, "name": name, "supercategory": "document"} for name, i in categories.items()],
    }
    path = out_dir / "annotations.json"
    atomic_write_text(path, json.dumps(data))
    return path
