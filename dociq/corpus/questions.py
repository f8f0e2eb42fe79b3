"""Questions about a labelled real page, from the synthetic generator's own question makers.

The page is seen as the generator's `Draft` (placed words, regions, table grids), so a real page
gets the same kinds and phrasings as a synthetic one: layout ("all section headings"), reading
("which paragraph mentions “Hiera”?", "where does the section “Usage” start?") and cell
("what is the <column> of <row>?") where a table's grid is known.
"""
from __future__ import annotations

import random

from dociq.data.synthetic.draft import Draft, DraftRegion, PlacedWord, TableInfo
from dociq.data.synthetic.questions import make_questions

from dociq.corpus.labels_tagged import TableGrid


def as_draft(words: list[str], boxes: list[list[float]], regions: list[dict], grids: list[TableGrid],
             height: int, width: int) -> Draft:
    draft = Draft(height=height, width=width)
    draft.words = [PlacedWord(t, None, (int(b[0]), int(b[1])), tuple(int(round(v)) for v in b), (0, 0, 0))
                   for t, b in zip(words, boxes)]
    draft.regions = [DraftRegion(r["label"], tuple(int(round(v)) for v in r["box"]), list(r["word_ids"]))
                     for r in regions]
    for grid in grids:
        table = _table_info(draft, grid)
        if table is not None:
            draft.tables.append(table)
    return draft


def _table_info(draft: Draft, grid: TableGrid) -> TableInfo | None:
    """A grid the cell questions can use: rectangular, with a header row and row keys that read."""
    rows = grid.cells
    if len(rows) < 2 or len({len(r) for r in rows}) != 1 or len(rows[0]) < 2:
        return None
    header = [draft.region_text(i) for i in rows[0]]
    row_keys = [draft.region_text(row[0]) for row in rows[1:]]
    if not all(h.strip() for h in header[1:]) or not all(k.strip() for k in row_keys):
        return None
    return TableInfo(region=grid.region, header=header, row_keys=row_keys, cells=[list(r) for r in rows])


def page_questions(words, boxes, regions, grids, height, width, rng: random.Random, n: int) -> list[dict]:
    draft = as_draft(words, boxes, regions, grids, height, width)
    return [{"text": text, "kind": kind, "region_ids": ids} for text, kind, ids in make_questions(draft, rng, n)]
