"""A segmented document, page by page (dociq.inference.documents.PageResult), in the formats `dociq
segment` writes: dociq's own JSON, a COCO file, and a docling `DoclingDocument` (Label Studio tasks
are the data engine's: dociq.engine.label_studio.pre_annotation_task). Each is built a page at a
time, so a long document never holds every page's masks at once. docs/segment.md describes each.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from dociq.inference.automatic import to_coco_results
from dociq.inference.documents import PageRegion, PageResult
from dociq.io.rle import encode_rle

DOCLING_MISSING = ("docling output needs the docling-core library, which is not installed. "
                   "Fix: pip install 'dociq[segment]' (or pip install 'docling-core>=2')")


def page_name(source: str | Path, page: int) -> str:
    """A page's name as COCO's file_name: `paper.pdf#page=2` (a PDF's page fragment), or the image's name."""
    name = Path(source).name
    return f"{name}#page={page}" if name.lower().endswith(".pdf") else name


def region_json(region: PageRegion) -> dict:
    return {"class": region.category, "score": round(float(region.score), 4),
            "box": [round(float(v), 2) for v in region.box], "rle": encode_rle(region.mask),
            "text": region.text, "question": region.question}


def json_page(p: PageResult) -> dict:
    """A page of dociq's JSON: {"page", "width", "height", "dpi", "words", "regions"}."""
    return {"page": p.page, "width": p.width, "height": p.height, "dpi": p.dpi, "words": p.word_source,
            "regions": [region_json(r) for r in p.regions]}


def json_document(source: str, pages: Sequence[dict]) -> dict:
    return {"source": source, "pages": list(pages)}


def category_ids(categories: Sequence[str]) -> dict[str, int]:
    """COCO category ids, numbered from 1 in `categories`' order."""
    return {name: i for i, name in enumerate(categories, start=1)}


def coco_page(source: str, p: PageResult, ids: dict[str, int], first_id: int) -> tuple[dict, list[dict]]:
    """A page's COCO image (id = the page number) and annotations (ids from `first_id`): RLE
    segmentation, bbox x, y, w, h, score; a question's answer has category "answer" and its `question`."""
    image = {"id": p.page, "file_name": page_name(source, p.page), "width": p.width, "height": p.height}
    annotations = []
    for region in p.regions:
        for result in to_coco_results([region], p.page, ids):     # [] for a class not in `ids`
            result.update(id=first_id + len(annotations), iscrowd=0, question=region.question, text=region.text)
            annotations.append(result)
    return image, annotations


def coco_document(source: str, images: Sequence[dict], annotations: Sequence[dict], ids: dict[str, int]) -> dict:
    """A COCO file `pycocotools.coco.COCO(path)` loads (images, annotations, categories)."""
    return {"info": {"description": f"dociq segment of {source}"}, "images": list(images),
            "annotations": list(annotations),
            "categories": [{"id": i, "name": name, "supercategory": "layout"} for name, i in ids.items()]}


# dociq's layout classes -> docling's labels; page_number goes by its place on the page
DOCLING_LABELS = {"title": "title", "section_heading": "section_header", "paragraph": "text",
                  "list_item": "list_item", "form_key": "field_key", "form_value": "field_value",
                  "table": "table", "table_cell": "text", "page_header": "page_header",
                  "page_footer": "page_footer", "figure": "picture", "stamp": "picture",
                  "signature": "picture", "caption": "caption", "code": "code"}


def docling_label(region: PageRegion, page_height: int) -> str | None:
    """docling's label of a region, None for a question's answer (docling has no such item)."""
    if region.question is not None:
        return None
    if region.category == "page_number":
        return "page_header" if (region.box[1] + region.box[3]) / 2 < page_height / 2 else "page_footer"
    if region.category in DOCLING_LABELS:
        return DOCLING_LABELS[region.category]
    return "text" if region.text else "picture"      # an unnamed region


def nested_regions(regions: Sequence[PageRegion]) -> set[int]:
    """Indices of the regions whose words all lie in a larger region (a line inside its paragraph, a
    cell inside its table): a document that reads as text would repeat them. Answers do not count."""
    words = [set(r.word_index.tolist()) if r.question is None else set() for r in regions]
    nested = set()
    for i, mine in enumerate(words):
        for j, theirs in enumerate(words):
            if i != j and mine and mine <= theirs and (regions[j].area, -j) > (regions[i].area, -i):
                nested.add(i)
                break
    return nested


def new_docling(name: str):
    """An empty DoclingDocument (a ValueError naming the extra when docling-core is missing)."""
    try:
        from docling_core.types.doc import DoclingDocument
    except ImportError as err:      # an optional extra: dociq[segment]
        raise ValueError(DOCLING_MISSING) from err
    return DoclingDocument(name=name)


def add_docling_page(doc, p: PageResult) -> None:
    """The page and an item per region in reading order, with its provenance box (PDF points and a
    bottom-left origin for a PDF, as docling's converter writes them; pixels for an image). A table
    is one cell holding its words (dociq does not recover the grid); consecutive list items share a
    list group; regions nested in a larger one (`nested_regions`) and answers to questions (docling
    has no such item) are left out."""
    from docling_core.types.doc import (BoundingBox, ContentLayer, CoordOrigin, DocItemLabel, ProvenanceItem, Size,
                                        TableCell, TableData)

    scale = 72.0 / p.dpi if p.dpi else 1.0
    height = p.height * scale
    doc.add_page(page_no=p.page, size=Size(width=p.width * scale, height=height))
    group = None
    nested = nested_regions(p.regions)
    for k, region in enumerate(p.regions):
        label = docling_label(region, p.height)
        if label is None or k in nested:
            continue
        x0, y0, x1, y1 = (float(v) * scale for v in region.box)
        bbox = BoundingBox(l=x0, t=y0, r=x1, b=y1, coord_origin=CoordOrigin.TOPLEFT).to_bottom_left_origin(height)
        prov = ProvenanceItem(page_no=p.page, bbox=bbox, charspan=(0, len(region.text)))
        if label != "list_item":
            group = None
        if label == "table":
            cell = TableCell(text=region.text, bbox=bbox, start_row_offset_idx=0, end_row_offset_idx=1,
                             start_col_offset_idx=0, end_col_offset_idx=1)
            doc.add_table(data=TableData(table_cells=[cell], num_rows=1, num_cols=1), prov=prov)
        elif label == "picture":
            doc.add_picture(prov=prov)
        elif label == "list_item":
            group = group or doc.add_list_group()
            doc.add_list_item(text=region.text, prov=prov, parent=group)
        else:
            furniture = label in ("page_header", "page_footer")
            doc.add_text(label=DocItemLabel(label), text=region.text, prov=prov,
                         content_layer=ContentLayer.FURNITURE if furniture else None)
