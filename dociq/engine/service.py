"""What the engine's two sets of routes share: its state, its errors, masks on the wire, page
proposals and retrain rounds.

`dociq.engine.server` (the JSON API under /api and the browser UI) and `dociq.engine.label_studio`
(the Label Studio ML-backend routes at the root) both import this module; neither imports the
other's internals (the server only calls `label_studio.register_routes`).

Nothing here loads torch at import: the automatic segmenter, the predictor and the retrain round
are imported when a request first needs them.
"""
from __future__ import annotations

import base64
import importlib.util
import io
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from fastapi.responses import JSONResponse

from dociq.data import masks as mask_geometry
from dociq.engine.page_cache import ActivePagePredictor
from dociq.io import rle as rle_codec

log = logging.getLogger("dociq.engine.server")     # the server's log, where these messages always went

DEFAULT_MAX_UPLOAD_BYTES = 50 * 2**20
MASK_COLOUR = (30, 144, 255)
MAX_PROPOSAL_PAGES = 64          # pages whose "propose all" regions stay cached


class RequestError(Exception):
    """A client mistake the handlers report as `status` with `message` (never a 500)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# ---- masks on the wire ------------------------------------------------------------------------

mask_to_rle = rle_codec.encode_rle     # bool [H, W] -> COCO compressed RLE {"size": [H, W], "counts": str}


def rle_to_mask(rle: Any, size: tuple[int, int]) -> np.ndarray:
    """A COCO RLE (compressed `counts` str or uncompressed list) of a page of `size` (H, W) -> bool
    [H, W]; a wrong size or counts that do not cover the page exactly are a ValueError that names
    the request's `mask` field."""
    return rle_codec.rle_to_mask(rle, size, name="mask")


def mask_png(mask: np.ndarray, colour: tuple[int, int, int] = MASK_COLOUR) -> str:
    """bool [H, W] -> base64 palette PNG (0 transparent, 1 `colour`) the browser draws as is."""
    from PIL import Image

    image = Image.fromarray(mask.astype(np.uint8), mode="P")
    image.putpalette([0, 0, 0, *colour] + [0] * (256 - 2) * 3)
    buf = io.BytesIO()
    image.save(buf, format="PNG", transparency=0, compress_level=1)   # fast; masks compress well anyway
    return base64.b64encode(buf.getvalue()).decode("ascii")


def mask_box(mask: np.ndarray) -> list[float] | None:
    """The mask's tight box (`dociq.data.masks.mask_box`) as JSON: [x0, y0, x1, y1] (exclusive),
    None (null) when empty."""
    box = mask_geometry.mask_box(mask)
    return box.tolist() if box is not None else None


# ---- the engine's state -----------------------------------------------------------------------

@dataclass
class Engine:
    """What the routes share: the store, the cache of embedded pages, options."""
    store: Any
    cache: Any
    token: str | None = None
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES
    proposal_options: dict = field(default_factory=dict)
    ls_question: str | None = None            # Label Studio pre-annotation: ask this instead of proposals
    ls_ocr: str = "auto"                      # OCR of the images Label Studio tasks bring (importer modes)
    model_version: str = "dociq"
    checkpoint: Path | None = None            # what the predictor was loaded from (a retrain's base)
    proposals: dict = field(default_factory=dict)   # (page id, points_per_side) -> list of region dicts
    retrain_state: dict = field(default_factory=lambda: {"running": False, "last": None, "error": None})
    retrain_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def data_dir(self) -> Path:
        return Path(self.store.data_dir)

    def page_size(self, page_id: str) -> tuple[int, int]:
        record = self.store.page(page_id)            # UnknownPageError (KeyError) -> 404
        return int(record.height), int(record.width)

    def reload_model(self, checkpoint: Path) -> None:
        """Predict with a new checkpoint from now on (a retrain round promoted it)."""
        # deferred: the model stack (torch); the engine's modules import without it
        from dociq.inference.predictor import load_predictor

        predictor = load_predictor(checkpoint, self.cache.predictor.device)
        self.cache.set_predictor(predictor)
        self.proposals.clear()
        self.checkpoint = Path(checkpoint)
        self.model_version = model_version_of(checkpoint)


def model_version_of(checkpoint: Path | str | None) -> str:
    if checkpoint is None:
        return "dociq-untrained"
    path = Path(checkpoint)
    stamp = int(path.stat().st_mtime) if path.exists() else 0
    return f"dociq-{path.stem}-{stamp}"


# ---- proposals ----------------------------------------------------------------------------------

def page_proposals(engine: Engine, page_id: str, points_per_side: int | None = None,
                   refresh: bool = False) -> tuple[list[dict], float]:
    """The automatic segmenter's regions of a page (cached per page until the model changes)."""
    # deferred: the automatic segmenter pulls in torch; only "propose all" needs it
    from dociq.inference.automatic import PageSegmenter

    options = dict(engine.proposal_options)
    if points_per_side is not None:
        options["points_per_side"] = points_per_side
    key = (page_id, options.get("points_per_side"))
    start = time.perf_counter()
    cached = None if refresh else engine.proposals.get(key)
    if cached is None:
        def run(predictor):
            page = predictor.page
            segmenter = PageSegmenter(ActivePagePredictor(predictor), **options)
            return segmenter.segment(page.image, words=page.words, word_boxes=page.word_boxes)
        regions = engine.cache.run(page_id, run)
        found = [{"index": i, "mask": mask_to_rle(r.mask), "mask_png": mask_png(r.mask),
                  "box": [float(v) for v in r.box], "score": float(r.score), "category": r.category,
                  "area": r.area} for i, r in enumerate(regions)]
        with engine.cache.lock:                                           # handlers run in threads
            while len(engine.proposals) >= MAX_PROPOSAL_PAGES:          # bounded: oldest page out
                engine.proposals.pop(next(iter(engine.proposals)))
            engine.proposals[key] = found
        return found, 1e3 * (time.perf_counter() - start)
    return cached, 1e3 * (time.perf_counter() - start)


# ---- retrain -----------------------------------------------------------------------------------

def retrain_available() -> bool:
    return importlib.util.find_spec("dociq.engine.retrain") is not None


def start_retrain(engine: Engine, options: dict) -> Any:
    """Run a retrain round in a background thread (dociq.engine.retrain.run_round); 501 when that
    module is not part of this installation."""
    if not retrain_available():
        return JSONResponse({"error": "retraining is not available: dociq.engine.retrain is not installed in "
                                      "this version; export the annotations (GET /api/export) and fine-tune "
                                      "with `python train.py stage=finetune data=coco ...`"}, status_code=501)
    with engine.retrain_lock:
        if engine.retrain_state["running"]:
            return JSONResponse({"error": "a retrain round is already running: wait for it (GET /api/retrain)"},
                                status_code=409)
        engine.retrain_state.update(running=True, error=None, started=time.time())

    def job():
        # deferred: torch and the training stack; the module may also be absent (retrain_available)
        from dociq.engine import retrain

        try:
            before = engine.store.checkpoint()
            result = retrain.run_round(engine.store, base_checkpoint=engine.checkpoint, **options)
            engine.retrain_state["last"] = result.to_json() if hasattr(result, "to_json") else result
            after = engine.store.checkpoint()
            base = before or (Path(engine.checkpoint).resolve() if engine.checkpoint else None)
            if after is not None and Path(after).resolve() != base:       # promoted: predict with it
                engine.reload_model(after)
        except Exception as err:   # noqa: BLE001 — reported through GET /api/retrain
            log.exception("engine: retrain round failed")
            engine.retrain_state["error"] = " ".join(str(err).split()) or type(err).__name__
        finally:
            engine.retrain_state["running"] = False

    threading.Thread(target=job, name="dociq-retrain", daemon=True).start()
    return JSONResponse({"started": True, "status": "GET /api/retrain"}, status_code=202)
