"""The embedded default data set: synthetic document pages with words, regions, links and questions.

    ds = SyntheticDocuments(num_pages=1000, image_size=512, seed=0, degrade=0.3)
    page = ds[7]          # a dociq.data.schema.Page, identical whichever worker or order reads it

A page is laid out (synthetic_layout) from Faker text (synthetic_content) in DejaVu fonts
(synthetic_fonts), rendered (synthetic_render), asked questions about (synthetic_questions) and
optionally scanned badly (degrade). All randomness comes from one seed derived from (seed, index).
"""
from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
from torch.utils.data import Dataset

from dociq.data.degrade import degrade_page
from dociq.data.schema import Page, Question, Region
from dociq.data.synthetic.content import page_faker
from dociq.data.synthetic.layout import layout_page
from dociq.data.synthetic.questions import make_questions
from dociq.data.synthetic.render import region_masks, render_image

MIN_SIDE = 128  # below this the body text no longer fits a line of words


def page_seed(seed: int, index: int) -> int:
    """A well-mixed 63-bit seed for page `index` of data set `seed` (nearby pairs do not collide)."""
    return int(np.random.SeedSequence([seed, index]).generate_state(1, dtype=np.uint64)[0] >> 1)


def parse_image_size(image_size: int | Sequence[int]) -> tuple[int, int]:
    """int -> square page; (H, W) -> that page. Raises naming the argument and the fix."""
    if isinstance(image_size, (int, np.integer)):
        size = (int(image_size), int(image_size))
    elif isinstance(image_size, Sequence) and len(image_size) == 2 and all(isinstance(v, (int, np.integer)) for v in image_size):
        size = (int(image_size[0]), int(image_size[1]))
    else:
        raise ValueError(f"image_size={image_size!r}: pass an int (square page) or a pair of ints (H, W)")
    if min(size) < MIN_SIDE:
        raise ValueError(f"image_size={image_size!r}: each side must be >= {MIN_SIDE} pixels for text to fit")
    return size


def parse_degrade(degrade: bool | float) -> float:
    """False/True or a probability in [0, 1] that a page gets scan degradations."""
    p = float(degrade)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"degrade={degrade!r}: pass False/True or a probability in [0, 1]")
    return p


def generate_page(index: int, seed: int = 0, image_size: int | Sequence[int] = 512,
                  degrade: bool | float = False, questions_per_page: int = 8) -> Page:
    """Page `index` of the synthetic data set `seed`; a pure function of its arguments."""
    height, width = parse_image_size(image_size)
    p_degrade = parse_degrade(degrade)
    s = page_seed(seed, index)
    rng = random.Random(s)
    fake = page_faker(s)
    draft = layout_page(rng, fake, height, width, page_number=rng.randint(1, 40))
    image = render_image(draft, rng)
    masks = region_masks(draft.regions, height, width)
    regions = [Region(label=r.label, box=np.asarray(r.box, dtype=np.float32), mask=m,
                      text=draft.region_text(i), word_ids=list(r.word_ids))
               for i, (r, m) in enumerate(zip(draft.regions, masks))]
    asked = make_questions(draft, rng, questions_per_page)
    question_masks = np.zeros((len(asked), height, width), dtype=bool)
    questions = []
    for (text, kind, ids), mask in zip(asked, question_masks):
        for i in ids:  # union over each region's box window only
            x0, y0, x1, y1 = draft.regions[i].box
            mask[y0:y1, x0:x1] |= masks[i, y0:y1, x0:x1]
        questions.append(Question(text=text, kind=kind, mask=mask, region_ids=ids))
    page = Page(
        image=image,
        words=[w.text for w in draft.words],
        word_boxes=np.asarray([w.box for w in draft.words], dtype=np.float32).reshape(-1, 4),
        regions=regions,
        questions=questions,
        links=list(draft.links),
        meta={"page_id": f"synthetic-{seed}-{index:06d}", "source": "synthetic", "seed": seed,
              "index": index, "original_size": (height, width), "degradations": []},
    )
    if p_degrade > 0 and rng.random() < p_degrade:
        page = degrade_page(page, np.random.default_rng(s))
    return page


class SyntheticDocuments(Dataset):
    """`num_pages` synthetic pages of `image_size` (int or (H, W)), deterministic per (seed, index).

    degrade: False, True, or the probability that a page gets scan degradations (noise, blur,
             rotation <= 2 degrees, JPEG) with its ground truth transformed alike.
    questions_per_page: at most this many questions per page, kinds mixed.
    """

    def __init__(self, num_pages: int, image_size: int | Sequence[int] = 512, seed: int = 0,
                 degrade: bool | float = False, questions_per_page: int = 8):
        if not isinstance(num_pages, (int, np.integer)) or num_pages < 0:
            raise ValueError(f"num_pages={num_pages!r}: pass a non-negative int")
        if not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed={seed!r}: pass a non-negative int")
        if not isinstance(questions_per_page, (int, np.integer)) or questions_per_page < 1:
            raise ValueError(f"questions_per_page={questions_per_page!r}: pass an int >= 1")
        self.num_pages = int(num_pages)
        self.image_size = parse_image_size(image_size)
        self.seed = int(seed)
        self.degrade = parse_degrade(degrade)
        self.questions_per_page = int(questions_per_page)

    def __len__(self) -> int:
        return self.num_pages

    def __getitem__(self, index: int) -> Page:
        if not -self.num_pages <= index < self.num_pages:
            raise IndexError(f"page index {index} out of range for {self.num_pages} synthetic pages")
        index = index % self.num_pages if self.num_pages else index
        return generate_page(index, self.seed, self.image_size, self.degrade, self.questions_per_page)
