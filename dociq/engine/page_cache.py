"""Embedded pages for the data engine: each page is embedded once, every click is only the prompt
encoder + mask decoder (SAM's interactive loop).

    cache = PageCache(predictor, store, capacity=16)
    result = cache.predict(page_id, session="tab-1", points=[[120, 40]])           # embeds the page
    result = cache.predict(page_id, session="tab-1", points=[[120, 40], [300, 90]],
                           point_labels=[1, 0], use_previous=True)                 # decoder only

`Predictor.set_image` keeps a page as a `PageState` (image, words, embedding, sizes) in
`predictor.page`; the cache keeps up to `capacity` of those states (least recently used out) and
switching pages swaps the state back in — no re-embedding. The CPU model is not re-entrant, so
one lock guards every use of it. Per (session, page) the cache keeps the last prediction: its
low-res logits go back in as `mask_input` on the next click (SAM's refinement), its mask is what
"accept the last prediction" saves.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

DEFAULT_CAPACITY = 16
DEFAULT_SESSIONS = 256


@dataclass
class Prediction:
    """One interactive prediction: the mask at the page's size and what the next click needs."""
    page_id: str
    mask: np.ndarray          # bool [H, W]
    score: float              # the model's predicted IoU
    logits: np.ndarray        # float32 [1, 1, h, w] low-res logits (the next click's mask_input)
    question: str | None
    server_ms: float          # time inside the model lock (embedding included when it happened)
    embedded: bool            # True when this call had to embed the page


class PageCache:
    """LRU of embedded pages (`Predictor.page` states) + the last prediction per (session, page).

    predictor:  a `dociq.inference.predictor.Predictor`.
    load_page:  page id -> (image uint8 [H, W, 3], words, word_boxes [N, 4]); raises KeyError
                (the store's UnknownPageError) for an unknown page. An `EngineStore` works via
                `PageCache.from_store`.
    capacity:   how many embedded pages stay in memory (a model=base page embedding is tens of MB).
    sessions:   how many (session, page) last predictions are kept (least recently used out).
    """

    def __init__(self, predictor, load_page: Callable[[str], tuple[np.ndarray, list, np.ndarray]],
                 capacity: int = DEFAULT_CAPACITY, sessions: int = DEFAULT_SESSIONS) -> None:
        if capacity < 1:
            raise ValueError(f"capacity={capacity}: keep at least 1 embedded page")
        if sessions < 1:
            raise ValueError(f"sessions={sessions}: keep at least 1 last prediction")
        self.predictor = predictor
        self.load_page = load_page
        self.capacity = int(capacity)
        self.max_sessions = int(sessions)
        self.lock = threading.RLock()           # the model is not re-entrant: one user at a time
        self._pages: OrderedDict[str, Any] = OrderedDict()
        self._last: OrderedDict[tuple[str, str], Prediction] = OrderedDict()
        self.embed_count = 0                     # how many times a page was embedded (tests, stats)

    @classmethod
    def from_store(cls, predictor, store, **kwargs) -> "PageCache":
        def load(page_id: str):
            image = store.page_image(page_id)
            words, boxes = store.page_words(page_id)
            return image, list(words), np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
        return cls(predictor, load, **kwargs)

    # ---- pages --------------------------------------------------------------------------------

    def activate(self, page_id: str) -> bool:
        """Make `page_id` the predictor's page; embed it only when it is not cached. Call with
        `self.lock` held. -> True when the page had to be embedded."""
        state = self._pages.get(page_id)
        if state is not None:
            self._pages.move_to_end(page_id)
            # putting a cached state back is what set_image would have computed, without the encoders
            self.predictor.set_page_state(state)
            return False
        image, words, boxes = self.load_page(page_id)
        self.predictor.set_image(image, words=words, word_boxes=boxes)
        self.embed_count += 1
        self._pages[page_id] = self.predictor.page
        while len(self._pages) > self.capacity:
            self._pages.popitem(last=False)
        return True

    def cached_pages(self) -> list[str]:
        with self.lock:
            return list(self._pages)

    def forget_page(self, page_id: str) -> None:
        with self.lock:
            self._pages.pop(page_id, None)
            for key in [k for k in self._last if k[1] == page_id]:
                del self._last[key]

    def clear(self) -> None:
        """Drop every embedding and last prediction (a new checkpoint makes them stale)."""
        with self.lock:
            self._pages.clear()
            self._last.clear()
            self.predictor.reset_image()

    def set_predictor(self, predictor) -> None:
        with self.lock:
            self.clear()
            self.predictor = predictor

    # ---- prompts ------------------------------------------------------------------------------

    def predict(self, page_id: str, session: str = "default", question: str | None = None,
                points: Any = None, point_labels: Any = None, box: Any = None,
                use_previous: bool = False) -> Prediction:
        """One mask for the prompts; with `use_previous` the session's last logits on this page are
        the mask prompt. Bad prompts raise the Predictor's ValueError (naming the argument)."""
        with self.lock:
            start = time.perf_counter()
            embedded = self.activate(page_id)
            previous = self._last.get((session, page_id)) if use_previous else None
            masks, scores, low_res = self.predictor.predict_masks(
                question=question, points=points, point_labels=point_labels,
                boxes=None if box is None else [box],
                mask_input=None if previous is None else previous.logits)
            result = Prediction(page_id=page_id, mask=np.asarray(masks[0], dtype=bool), score=float(scores[0]),
                                logits=np.asarray(low_res[:1], dtype=np.float32), question=question,
                                server_ms=1e3 * (time.perf_counter() - start), embedded=embedded)
            self._remember(session, result)
            return result

    def last(self, session: str, page_id: str) -> Prediction | None:
        with self.lock:
            return self._last.get((session, page_id))

    def forget_last(self, session: str, page_id: str) -> None:
        with self.lock:
            self._last.pop((session, page_id), None)

    def _remember(self, session: str, result: Prediction) -> None:
        key = (session, result.page_id)
        self._last[key] = result
        self._last.move_to_end(key)
        while len(self._last) > self.max_sessions:
            self._last.popitem(last=False)

    def run(self, page_id: str, fn: Callable[[Any], Any]) -> Any:
        """`fn(predictor)` with `page_id` set as the predictor's page, under the model lock (the
        automatic segmenter's batches of clicks, for example)."""
        with self.lock:
            self.activate(page_id)
            return fn(self.predictor)


class ActivePagePredictor:
    """The predictor as `PageSegmenter` sees it when the page is already set (and cached):
    `set_image` is a no-op, everything else goes to the real predictor. Use inside `PageCache.run`."""

    def __init__(self, predictor) -> None:
        self._predictor = predictor

    def set_image(self, *args, **kwargs) -> None:   # the cache has set (and embedded) the page
        pass

    def __getattr__(self, name: str):
        return getattr(self._predictor, name)
