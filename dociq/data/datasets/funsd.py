"""FUNSD forms read as `Page`s.

FUNSD's layout: `<root>/<split>/annotations/<name>.json` and `<root>/<split>/images/<name>.png`,
each JSON `{"form": [{"id", "text", "box": [x0, y0, x1, y1], "label": question|answer|header|
other, "words": [{"text", "box"}], "linking": [[from_id, to_id], ...]}]}`.

Regions are the entities (label = FUNSD label, mask = entity box), words are the entities' words
in file order, links come from `linking` (deduplicated: FUNSD lists each link on both ends), and
every question entity with linked answers asks "what is the answer to '<question text>'?"
(kind "link") with the union of its answers' masks as target.

A malformed entity (a label outside question/answer/header/other, a box that is not 4 numbers,
words or links of the wrong type) makes its page a `BadSampleError`. An entity whose box has zero
area is dropped with its links (so a question left without answers asks nothing), warned about
once and listed in `dataset.dropped_regions`; its words stay on the page.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from dociq.data.datasets.coco import box_mask
from dociq.data.text_blocks import words_in_masks
from dociq.data.datasets.guarded import GuardedDocuments
from dociq.data.errors import (
    BOX_OVERSHOOT_TOLERANCE, DEFAULT_MAX_PAGE_PIXELS, BadSampleError, BadSamplePolicy, check_box_in_page,
)
from dociq.data.image_io import load_page_image
from dociq.data.ocr import PdfTextLayer, make_ocr
from dociq.data.schema import Page, Question, Region

FUNSD_SPLITS = ("training_data", "testing_data")
FUNSD_LABELS = ("question", "answer", "header", "other")
_SKIP_HINT = "or pass on_bad_sample='skip' to drop the page"


def link_question_text(question: str) -> str:
    return f"what is the answer to '{question.strip()}'?"


class FunsdDocuments(GuardedDocuments):
    """Pages of a FUNSD-format folder.

    root:          the folder holding `training_data/` and `testing_data/`.
    split:         "training_data" or "testing_data".
    ocr:           "groundtruth" (FUNSD's words), "tesseract", or an OCR backend object.
    on_bad_sample: "raise" or "skip" (then `__getitem__` returns None for that page).
    max_page_pixels: a scan with more pixels is a bad sample, found from its header before
                   decoding; None: no cap beyond Pillow's decompression-bomb limit.
    """

    def __init__(
        self,
        root: str | Path,
        split: str = "training_data",
        ocr: str | Any = "groundtruth",
        on_bad_sample: str = "raise",
        ocr_cache_dir: str | Path | None = None,
        ocr_options: dict | None = None,
        require_words: bool = True,
        box_tolerance: float = BOX_OVERSHOOT_TOLERANCE,
        image_suffixes: tuple[str, ...] = (".png", ".jpg", ".jpeg", ".tif", ".tiff"),
        max_page_pixels: int | None = DEFAULT_MAX_PAGE_PIXELS,
    ) -> None:
        if split not in FUNSD_SPLITS:
            raise ValueError(f"split={split!r} is not one of {FUNSD_SPLITS}. Fix: pick one of those")
        self.root = Path(root)
        self.split_dir = self.root / split
        self.annotation_dir = self.split_dir / "annotations"
        self.image_dir = self.split_dir / "images"
        self.files = sorted(self.annotation_dir.glob("*.json"))
        if not self.files:
            raise BadSampleError(
                self.annotation_dir, "no FUNSD annotation files (*.json) found",
                "pass root=<the FUNSD 'dataset' folder holding training_data/ and testing_data/, "
                "each with annotations/ and images/>")
        self.policy = BadSamplePolicy(on_bad_sample)
        self.ocr = make_ocr(ocr, cache_dir=ocr_cache_dir, **(ocr_options or {}))
        if isinstance(self.ocr, PdfTextLayer):
            raise ValueError("FUNSD ships scanned images, not PDFs: use ocr='groundtruth' or 'tesseract'")
        self.ocr_name = ocr if isinstance(ocr, str) else getattr(ocr, "name", type(ocr).__name__)
        self.require_words = require_words
        self.box_tolerance = box_tolerance
        self.image_suffixes = image_suffixes
        self.max_page_pixels = max_page_pixels

    def __len__(self) -> int:
        return len(self.files)

    def image_path(self, index: int) -> Path:
        stem = self.files[index].stem
        for suffix in self.image_suffixes:
            if (self.image_dir / f"{stem}{suffix}").is_file():
                return self.image_dir / f"{stem}{suffix}"
        return self.image_dir / f"{stem}.png"  # load_page_image reports it missing

    def load_page(self, index: int) -> Page:
        ann_path = self.files[index]
        form = self._read_form(ann_path)
        image_path = self.image_path(index)
        image = load_page_image(image_path, self.max_page_pixels)
        size = image.shape[:2]

        gt_words, gt_boxes, regions, id_to_region = [], [], [], {}
        for k, entity in enumerate(form):
            eid, label, text, box, words = self._entity_fields(k, entity, ann_path)
            if eid in id_to_region:
                raise BadSampleError(ann_path, f"entity id {eid} appears twice", f"make ids unique, {_SKIP_HINT}")
            what = f"entity id {eid}"
            box = check_box_in_page(box, size, ann_path, f"{what} ({label} {text!r})", self.box_tolerance)
            word_ids = []
            for j, w in enumerate(words):
                if not isinstance(w, dict) or "box" not in w:
                    raise BadSampleError(ann_path, f"word {j} of {what} is malformed: {w!r:.80}",
                                         f"write words as {{'text': str, 'box': [x0, y0, x1, y1]}}, {_SKIP_HINT}")
                wtext = str(w.get("text", "")).strip()
                if not wtext:
                    continue  # FUNSD has a few empty word entries; they carry no text to read
                gt_boxes.append(check_box_in_page(
                    w["box"], size, ann_path, f"word {j} {wtext!r} of {what}", self.box_tolerance))
                word_ids.append(len(gt_words))
                gt_words.append(wtext)
            mask = box_mask(box, size)
            if box[2] <= box[0] or box[3] <= box[1] or not mask.any():
                self.policy.record_dropped(index, ann_path, what,
                                           f"zero area: its box {np.round(box, 2).tolist()} covers no pixel, so it "
                                           "cannot be a target; the entity and its links are dropped")
                id_to_region[eid] = None
                continue
            id_to_region[eid] = len(regions)
            regions.append(Region(label=label, box=box, mask=mask, text=text.strip(), word_ids=word_ids))

        if self.ocr is None:
            words, word_boxes = gt_words, np.array(gt_boxes, np.float32).reshape(-1, 4)
        else:
            found = self.ocr.recognise(image)
            found = found if found.size == size else found.scaled_to(size)
            words, word_boxes = list(found.words), found.boxes
            for region, ids in zip(regions, words_in_masks(word_boxes, [r.mask for r in regions])):
                region.word_ids = ids
        if self.require_words and not words:
            source = "its annotation has no words" if self.ocr is None else f"OCR {self.ocr_name!r} found none"
            raise BadSampleError(image_path, f"page has no words ({source})",
                                 f"check the annotation/page, pass require_words=False, {_SKIP_HINT}")

        links = self._links(form, id_to_region, ann_path)
        questions = self._questions(regions, links, size)
        meta = {"page_id": ann_path.stem, "source": str(image_path), "annotation_file": str(ann_path),
                "dataset": "funsd", "split": self.split_dir.name}
        return Page(image=image, words=words, word_boxes=word_boxes, regions=regions,
                    questions=questions, links=links, meta=meta)

    @staticmethod
    def _entity_fields(k: int, entity, path: Path) -> tuple[Any, str, str, Any, list]:
        """(id, label, text, box, words) of form entry `k`; malformed fields are a bad page."""
        if not isinstance(entity, dict) or not all(key in entity for key in ("id", "label", "box")):
            raise BadSampleError(path, f"entity {k} is malformed: {entity!r:.80} (needs id, label, box)",
                                 f"fix the entity, {_SKIP_HINT}")
        eid, label = entity["id"], entity["label"]
        if not isinstance(eid, (int, str)) or isinstance(eid, bool):
            raise BadSampleError(path, f"entity {k} has id {eid!r}, not a number or a string",
                                 f"give every entity a unique numeric id, {_SKIP_HINT}")
        if label not in FUNSD_LABELS:
            raise BadSampleError(path, f"entity id {eid} has label {label!r}, not one of the FUNSD labels "
                                 f"{', '.join(FUNSD_LABELS)}", f"fix the label, {_SKIP_HINT}")
        words = entity.get("words") or []
        if not isinstance(words, list):
            raise BadSampleError(path, f"entity id {eid} has words {words!r:.80}, not a list",
                                 f"write words as [{{'text': str, 'box': [x0, y0, x1, y1]}}, ...], {_SKIP_HINT}")
        return eid, label, str(entity.get("text", "")), entity["box"], words

    @staticmethod
    def _read_form(path: Path) -> list[dict]:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError) as err:
            raise BadSampleError(path, f"not a readable FUNSD JSON ({err})",
                                 f"re-download the annotation, {_SKIP_HINT}") from err
        if not isinstance(data, dict) or not isinstance(data.get("form"), list):
            raise BadSampleError(path, "has no 'form' list", f"use FUNSD's format {{'form': [...]}}, {_SKIP_HINT}")
        return data["form"]

    @staticmethod
    def _links(form: list[dict], id_to_region: dict, path: Path) -> list[tuple[int, int]]:
        """Region index pairs; links to an entity dropped for zero area are dropped with it."""
        links, seen = [], set()
        for entity in form:
            linking = entity.get("linking") or []
            if not isinstance(linking, list):
                raise BadSampleError(path, f"entity id {entity['id']} has linking {linking!r:.80}, not a list",
                                     f"write links as [[from_id, to_id], ...], {_SKIP_HINT}")
            for pair in linking:
                if not isinstance(pair, list) or len(pair) != 2 or \
                        not all(isinstance(end, (int, str)) and not isinstance(end, bool) for end in pair):
                    raise BadSampleError(path, f"entity id {entity['id']} has a malformed link {pair!r:.80}",
                                         f"write links as [from_id, to_id], {_SKIP_HINT}")
                for end in pair:
                    if end not in id_to_region:
                        raise BadSampleError(path, f"entity id {entity['id']} links to entity id {end}, "
                                             "which does not exist", f"fix 'linking', {_SKIP_HINT}")
                link = (id_to_region[pair[0]], id_to_region[pair[1]])
                if None not in link and link not in seen:
                    seen.add(link)
                    links.append(link)
        return links

    @staticmethod
    def _questions(regions: list[Region], links: list[tuple[int, int]], size) -> list[Question]:
        answers: dict[int, list[int]] = {}
        for a, b in links:
            kinds = (regions[a].label, regions[b].label)
            if kinds == ("question", "answer"):
                answers.setdefault(a, []).append(b)
            elif kinds == ("answer", "question"):  # a few files list the link the other way round
                answers.setdefault(b, []).append(a)
        out = []
        for q in sorted(answers):
            if not regions[q].text:
                continue
            ids = sorted(set(answers[q]))
            mask = np.zeros(size, dtype=bool)
            for i in ids:
                mask |= regions[i].mask
            out.append(Question(link_question_text(regions[q].text), "link", mask, ids))
        return out
