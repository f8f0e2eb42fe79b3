"""The files `dociq segment` writes for one document, a page at a time, each written atomically.

    OUT/<rel>/<stem>.json                dociq's JSON (always; written last: it marks the document done)
    OUT/<rel>/<stem>.coco.json           a COCO file (images = pages, annotations = regions)
    OUT/<rel>/<stem>.labelstudio.json    Label Studio tasks with pre-annotations, one per page;
    OUT/<rel>/<stem>-pages/pNNN.png        the page images they name (/data/local-files/?d=...)
    OUT/<rel>/<stem>.docling.json        a DoclingDocument (docling-core's own JSON export)
    OVERLAY/<rel>/<stem>-pNNN.png        the page with its regions and a legend (--overlay)

<rel> is the document's folder under the INPUT folder it was found in; docs/segment.md has the
formats.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence


from dociq.data.image_io import save_page_image
from dociq.io.atomic import atomic_file, atomic_write_text
from dociq.inference.document_formats import (add_docling_page, category_ids, coco_document, coco_page,
                                              json_document, json_page, new_docling)
from dociq.inference.documents import PageResult
from dociq.inference.overlay import draw_overlay

FORMATS = ("json", "coco", "labelstudio", "docling")
SUFFIXES = {"json": ".json", "coco": ".coco.json", "labelstudio": ".labelstudio.json", "docling": ".docling.json"}


@dataclass(frozen=True)
class Target:
    """Where one document's outputs go: `base` is OUT/<rel>/<stem> (no suffix)."""
    base: Path
    overlay_base: Path | None

    def path(self, fmt: str) -> Path:
        return self.base.with_name(self.base.name + SUFFIXES[fmt])

    def overlay(self, page: int) -> Path:
        return self.overlay_base.with_name(f"{self.overlay_base.name}-p{page:03d}.png")

    def page_image(self, page: int) -> Path:
        return self.base.with_name(f"{self.base.name}-pages") / f"p{page:03d}.png"

    def files(self, formats: Sequence[str], pages: Sequence[int]) -> list[Path]:
        """Every file the document's run writes (all there: the document is done)."""
        out = [self.path(f) for f in formats]
        if "labelstudio" in formats:
            out += [self.page_image(n) for n in pages]
        if self.overlay_base is not None:
            out += [self.overlay(n) for n in pages]
        return out


class DocumentOutputs:
    """Collects a document's pages in every asked format (`add`), then writes the files (`write`).
    Only the formats' small per-page parts are kept: masks go out of memory with each page."""

    def __init__(self, source: str, target: Target, formats: Sequence[str], categories: Sequence[str],
                 questions: Sequence[str], model_version: str, out_dir: Path) -> None:
        self.source, self.target, self.formats = source, target, list(formats)
        self.questions, self.model_version, self.out_dir = list(questions), model_version, out_dir
        self.ids = category_ids(categories)
        self.pages: list[dict] = []
        self.coco_images: list[dict] = []
        self.coco_annotations: list[dict] = []
        self.tasks: list[dict] = []
        self.docling = new_docling(target.base.name) if "docling" in self.formats else None

    def add(self, page: PageResult) -> None:
        if self.target.overlay_base is not None:
            picture = draw_overlay(page.image, page.regions, questions=self.questions, legend=True)
            save_page_image(picture, self.target.overlay(page.page))
        self.pages.append(json_page(page))
        if "coco" in self.formats:
            image, annotations = coco_page(self.source, page, self.ids, len(self.coco_annotations) + 1)
            self.coco_images.append(image)
            self.coco_annotations += annotations
        if "labelstudio" in self.formats:
            self.tasks.append(self._task(page))
        if self.docling is not None:
            add_docling_page(self.docling, page)

    def _task(self, page: PageResult) -> dict:
        # deferred: the engine's module imports FastAPI, needed only for this format
        from dociq.engine.label_studio import pre_annotation_task

        path = self.target.page_image(page.page)
        save_page_image(page.image, path)
        ref = "/data/local-files/?d=" + path.relative_to(self.out_dir).as_posix()
        masks = [(r.mask, r.question or r.category, r.score) for r in page.regions]
        return pre_annotation_task(ref, masks, self.model_version,
                                   data={"source": self.source, "page": page.page})

    def write(self) -> None:
        """Every format's file; dociq's JSON last, so it exists only when the others do."""
        if self.docling is not None:
            with atomic_file(self.target.path("docling")) as tmp:
                self.docling.save_as_json(tmp)
        if "coco" in self.formats:
            coco = coco_document(self.source, self.coco_images, self.coco_annotations, self.ids)
            atomic_write_text(self.target.path("coco"), json.dumps(coco))
        if "labelstudio" in self.formats:
            atomic_write_text(self.target.path("labelstudio"), json.dumps(self.tasks))
        if "json" in self.formats:
            atomic_write_text(self.target.path("json"), json.dumps(json_document(self.source, self.pages)))


def write_label_config(out_dir: Path, labels: Sequence[str]) -> Path:
    """OUT/label_config.xml: the Label Studio project's labelling config for the tasks' labels."""
    # deferred: the engine's module imports FastAPI, needed only for this format
    from dociq.engine.label_studio import label_config_xml

    path = out_dir / "label_config.xml"
    atomic_write_text(path, label_config_xml(list(labels)))
    return path
