"""The data engine's server: model-assisted annotation in the browser (SAM's data engine loop).

    dociq engine serve --data DATA_DIR --checkpoint run.ckpt                # http://127.0.0.1:8765/
    dociq engine serve DATA_DIR --host 0.0.0.0 --token SECRET               # on a network: token required

    from dociq.engine.server import create_app
    app = create_app(EngineStore(data_dir), Predictor.from_checkpoint(ckpt), token=None)

One process holds the store (`dociq.engine.store.EngineStore`), the model and an LRU of embedded
pages (`dociq.engine.page_cache.PageCache`): a page is embedded once, then every click runs only
the prompt encoder and mask decoder, with the previous low-res logits as the mask prompt. The JSON
API is under /api (docs/engine.md), the Label Studio ML-backend protocol at the root
(/health, /setup, /predict, /webhook: dociq.engine.label_studio), the browser UI at / (the files
of dociq/engine/static, no build step, no CDN). What both sets of routes share (the `Engine` state,
`RequestError`, masks on the wire, proposals, retrain rounds) is in dociq.engine.service.

Every mistake in a request is a 4xx with {"error": "..."}: malformed JSON or fields (422), an
unknown page or annotation (404), a prompt outside the page (422, the Predictor's message), an
upload too large (413) or not a PNG/JPEG/PDF (415), a file name with a path (400), no token (401).
"""
from __future__ import annotations

import base64
import hmac
import ipaddress
import logging
import os
import re
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

from fastapi import FastAPI, File, Form, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.trustedhost import TrustedHostMiddleware

from dociq.engine.importer import import_folder
from dociq.engine.label_studio import register_routes as register_label_studio_routes
from dociq.engine.page_cache import PageCache
# the routes' shared pieces
from dociq.engine.service import (
    DEFAULT_MAX_UPLOAD_BYTES, Engine, RequestError, mask_box, mask_png, mask_to_rle, model_version_of,
    page_proposals, retrain_available, rle_to_mask, start_retrain,
)
from dociq.engine.store import EngineStore

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent / "static"
TOKEN_ENV = "DOCIQ_ENGINE_TOKEN"
TOKEN_COOKIE = "dociq_engine_token"
DEFAULT_PORT = 8765
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1", "[::1]")
# magic bytes of the uploads the importer reads
UPLOAD_TYPES = {b"\x89PNG\r\n\x1a\n": ".png", b"\xff\xd8\xff": ".jpg", b"%PDF-": ".pdf"}


# ---- request bodies: unknown fields are refused (a typo is a 422, not silently ignored) ----

class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PredictBody(Strict):
    question: str | None = Field(None, max_length=500)
    points: list[list[float]] | None = Field(None, max_length=64)
    point_labels: list[int] | None = Field(None, max_length=64)
    box: list[float] | None = Field(None, min_length=4, max_length=4)
    use_previous: bool = False
    session: str = Field("default", min_length=1, max_length=128)


class ProposalsBody(Strict):
    points_per_side: int | None = Field(None, ge=1, le=32)
    refresh: bool = False


class RleBody(BaseModel):
    size: list[int] = Field(min_length=2, max_length=2)
    counts: str | list[int]


class AnnotationBody(Strict):
    question: str = Field("", max_length=500)
    category: str | None = Field(None, max_length=100)
    status: Literal["accepted", "rejected"] = "accepted"
    clicks: int = Field(0, ge=0, le=100000)
    kind: str = "layout"
    author: str = Field("", max_length=100)
    seconds: float | None = Field(None, ge=0)
    mask: RleBody | None = None
    session: str = Field("default", min_length=1, max_length=128)


class RelabelBody(Strict):
    category: str | None = Field(None, max_length=100)
    question: str | None = Field(None, max_length=500)


class RetrainBody(Strict):
    """The options of `dociq.engine.retrain.run_round` a browser may set (no Hydra overrides: a
    request must not choose what the training subprocess runs)."""
    steps: int | None = Field(None, ge=1, le=100000)
    synthetic_fraction: float | None = Field(None, ge=0.0, lt=1.0)   # 1 would leave no user pages
    heldout_min: int | None = Field(None, ge=1)
    tolerance: float | None = Field(None, ge=0.0, le=1.0)
    lr: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0)


# ---- auth -------------------------------------------------------------------------------------

def _presented_token(request) -> tuple[str | None, bool]:
    """(token the request carries, came from the query string)."""
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value:
        return value.strip(), False
    if scheme.lower() == "basic" and value:          # Label Studio's ML-backend auth: user:token
        try:
            user_pass = base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            return None, False
        return user_pass.partition(":")[2], False
    cookie = request.cookies.get(TOKEN_COOKIE)
    if cookie:
        return cookie, False
    if request.method in ("GET", "HEAD") and request.query_params.get("token"):
        return request.query_params["token"], True  # URLs the browser loads itself (<img>, the page)
    return None, False


def token_matches(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


# ---- the app ----------------------------------------------------------------------------------

def create_app(store, predictor, token: str | None = None, cache_size: int = 16,
               max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES, proposal_options: dict | None = None,
               ls_question: str | None = None, ls_ocr: str = "auto", model_version: str | None = None,
               checkpoint: str | Path | None = None, trusted_hosts: list[str] | None = None):
    """The FastAPI app of the engine.

    store:            an `EngineStore`.
    predictor:        a `dociq.inference.predictor.Predictor` (the cache embeds pages with it).
    token:            when set, every request needs `Authorization: Bearer <token>` (or Basic with
                      the token as password, Label Studio's way), or `?token=` on a GET the browser
                      loads (which also sets an HttpOnly SameSite=Strict cookie for the page's
                      later requests); otherwise 401.
    cache_size:       embedded pages kept in memory (LRU).
    max_upload_bytes: larger uploads get 413.
    proposal_options: `PageSegmenter` keyword arguments for "propose all" (default: an 8x8 grid
                      + one seed per OCR line, classes named).
    ls_question:      Label Studio pre-annotations without a click: masks for this question instead
                      of the page's proposals.
    ls_ocr:           OCR of the images Label Studio tasks add to the store ("auto": tesseract when
                      installed, "none": no words).
    checkpoint:       the file the predictor came from: a retrain round's starting point when the
                      store has no promoted checkpoint yet.
    trusted_hosts:    Host headers to answer (others get 400): `serve` passes the loopback names when
                      it runs without a token, so a DNS-rebinding page cannot reach the engine.

    A browser request from another origin (an `Origin` header that is not this server) may not
    change anything (403 on POST/PATCH/PUT/DELETE): no other web page can upload into or annotate
    a store through the user's browser.
    """
    options = {"points_per_side": 8, "points_per_batch": 64}
    options.update(proposal_options or {})
    engine = Engine(store=store, cache=PageCache.from_store(predictor, store, capacity=cache_size), token=token,
                    max_upload_bytes=int(max_upload_bytes), proposal_options=options, ls_question=ls_question,
                    ls_ocr=ls_ocr, checkpoint=None if checkpoint is None else Path(checkpoint),
                    model_version=model_version or model_version_of(checkpoint or store.checkpoint()))
    app = FastAPI(title="dociq data engine", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.engine = engine
    if trusted_hosts:
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(trusted_hosts))
    register_error_handlers(app)
    register_guard(app, engine)
    register_page_routes(app, engine)
    register_prediction_routes(app, engine)
    register_annotation_routes(app, engine)
    register_export_routes(app, engine)
    register_upload_routes(app, engine)
    register_retrain_routes(app, engine)
    register_label_studio_routes(app, engine)      # Label Studio ML backend (root paths)
    register_static_routes(app, engine)
    return app


def error(status: int, message: str, **extra) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status)


def register_error_handlers(app) -> None:
    """Errors are JSON messages, never a traceback."""
    @app.exception_handler(RequestError)
    async def _request_error(_request, err: RequestError):
        return error(err.status, err.message)

    @app.exception_handler(StarletteHTTPException)            # unknown route, wrong method, ...
    async def _http_error(_request, err: StarletteHTTPException):
        return JSONResponse({"error": str(err.detail)}, status_code=err.status_code, headers=err.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request, err: RequestValidationError):
        parts = []
        for e in err.errors():
            if e.get("type") == "json_invalid":
                parts.append(f"the body is not valid JSON ({e.get('ctx', {}).get('error', 'decode error')})")
                continue
            where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
            parts.append(f"{where}: {e.get('msg', 'invalid')}")
        return error(422, "; ".join(parts) or "invalid request")

    @app.exception_handler(KeyError)                  # UnknownPageError, UnknownAnnotationError
    async def _not_found(_request, err: KeyError):
        return error(404, str(err.args[0]) if err.args else "not found")

    @app.exception_handler(ValueError)                # dociq's checks name the field and the fix
    async def _bad_value(_request, err: ValueError):
        return error(422, " ".join(str(err).split()))

    @app.exception_handler(Exception)
    async def _unexpected(_request, err: Exception):
        log.exception("engine: unexpected error")
        return error(500, f"internal error ({type(err).__name__}); the server log has the details")


def register_guard(app, engine: Engine) -> None:
    """Auth, same-origin writes and upload size: checked before any route reads the body."""
    @app.middleware("http")
    async def _guard(request: Request, call_next):
        set_cookie = False
        if engine.token is not None:
            given, from_query = _presented_token(request)
            if not token_matches(given, engine.token):
                return JSONResponse({"error": "unauthorized: send 'Authorization: Bearer <token>' (the token "
                                              f"the server was started with, --token or {TOKEN_ENV})"},
                                    status_code=401, headers={"WWW-Authenticate": "Bearer"})
            set_cookie = from_query
        origin = request.headers.get("origin")
        if request.method not in ("GET", "HEAD", "OPTIONS") and origin is not None:
            if urlparse(origin).netloc != request.headers.get("host", ""):
                return error(403, f"cross-origin request from {origin} refused: use the engine's own page")
        if request.url.path == "/api/uploads":
            length = request.headers.get("content-length")
            if length is not None and length.isdigit() and int(length) > engine.max_upload_bytes + 2**20:
                return error(413, f"upload of {int(length)} bytes exceeds the limit of "
                                  f"{engine.max_upload_bytes} bytes: split it into smaller files")
        start = time.perf_counter()
        response = await call_next(request)
        # the whole handler (model, RLE and PNG encoding, store): what a click costs the server
        response.headers["x-server-ms"] = f"{1e3 * (time.perf_counter() - start):.2f}"
        if set_cookie:
            response.set_cookie(TOKEN_COOKIE, engine.token, httponly=True, samesite="strict")
        return response


def register_page_routes(app, engine: Engine) -> None:
    store = engine.store

    @app.get("/api/pages")
    def list_pages():
        return {"pages": [{"id": p.id, "width": p.width, "height": p.height, "source": p.source, "split": p.split,
                           "num_words": p.num_words, "num_accepted": p.num_accepted} for p in store.pages()],
                "progress": store.progress()}

    @app.get("/api/pages/{page_id}")
    def get_page(page_id: str):
        record = store.page(page_id)
        words, boxes = store.page_words(page_id)
        annotations = [a.to_json() for a in store.annotations(page_id, status=None)]
        return {"id": record.id, "width": record.width, "height": record.height, "source": record.source,
                "split": record.split, "num_accepted": record.num_accepted,
                "words": [{"text": t, "box": [float(v) for v in b]} for t, b in zip(words, boxes)],
                "annotations": annotations}

    @app.get("/api/pages/{page_id}/image")
    def page_image(page_id: str):
        store.page(page_id)
        path = store.page_path(page_id)
        if not path.is_file():
            raise RequestError(404, f"the image of page {page_id} is missing from {path.parent}")
        return FileResponse(path, media_type="image/png")


def register_prediction_routes(app, engine: Engine) -> None:
    store = engine.store

    @app.post("/api/pages/{page_id}/predict")
    def predict(page_id: str, body: PredictBody):
        store.page(page_id)
        if body.question is None and body.points is None and body.box is None:
            if not (body.use_previous and engine.cache.last(body.session, page_id) is not None):
                raise RequestError(422, "predict needs a prompt: question, points (with point_labels) and/or box")
        if body.points is not None and any(len(p) != 2 for p in body.points):
            raise RequestError(422, "points must be [[x, y], ...] pixel coordinates of the page")
        question = body.question if body.question and body.question.strip() else None
        if body.question is not None and question is None and body.points is None and body.box is None:
            raise RequestError(422, "question is empty: ask something (e.g. 'the page footer') or click")
        result = engine.cache.predict(page_id, session=body.session, question=question, points=body.points,
                                      point_labels=body.point_labels, box=body.box, use_previous=body.use_previous)
        return {"page_id": page_id, "mask": mask_to_rle(result.mask), "mask_png": mask_png(result.mask),
                "score": result.score, "area": int(result.mask.sum()), "box": mask_box(result.mask),
                "server_ms": round(result.server_ms, 2), "embedded": result.embedded, "session": body.session}

    @app.post("/api/pages/{page_id}/proposals")
    def proposals(page_id: str, body: ProposalsBody | None = None):
        body = body or ProposalsBody()
        store.page(page_id)
        regions, ms = page_proposals(engine, page_id, body.points_per_side, body.refresh)
        return {"page_id": page_id, "regions": regions, "server_ms": round(ms, 2)}


def register_annotation_routes(app, engine: Engine) -> None:
    store = engine.store

    @app.post("/api/pages/{page_id}/annotations", status_code=201)
    def save(page_id: str, body: AnnotationBody):
        size = engine.page_size(page_id)
        if body.mask is not None:
            mask = rle_to_mask(body.mask.model_dump(), size)
        else:
            last = engine.cache.last(body.session, page_id)
            if last is None:
                raise RequestError(422, f"no mask: send mask (COCO RLE) or predict on page {page_id} first in "
                                        f"session {body.session!r} (the last prediction is saved)")
            mask = last.mask
        question = body.question
        if not question.strip() and body.mask is None:
            last = engine.cache.last(body.session, page_id)
            question = (last.question or "") if last is not None else ""
        ann_id = store.save_annotation(page_id, mask, question, category=body.category or None, status=body.status,
                                       clicks=body.clicks, kind=body.kind, author=body.author, seconds=body.seconds)
        if body.mask is None:
            engine.cache.forget_last(body.session, page_id)   # the next object starts from scratch
        return {"id": ann_id, "page_id": page_id, "status": body.status, "area": int(mask.sum())}

    @app.post("/api/annotations/{annotation_id}/undo")
    def undo(annotation_id: int):
        store.undo(annotation_id)
        return {"id": annotation_id, "undone": True}

    @app.patch("/api/annotations/{annotation_id}")
    def relabel(annotation_id: int, body: RelabelBody):
        store.relabel(annotation_id, category=body.category, question=body.question)
        return store.annotation(annotation_id).to_json()

    @app.get("/api/progress")
    def progress():
        return store.progress()


def register_export_routes(app, engine: Engine) -> None:
    @app.get("/api/export")
    def export(split: str | None = None):
        # deferred: coco_export reads dociq.data.datasets.coco, which imports torch
        from dociq.engine.coco_export import export_coco

        # inside the store folder: the export hard-links the page PNGs instead of copying them
        with tempfile.TemporaryDirectory(prefix=".export-", dir=engine.data_dir) as tmp:
            path = export_coco(engine.store, Path(tmp) / "export.json", split=split)
            return Response(Path(path).read_bytes(), media_type="application/json")


def register_upload_routes(app, engine: Engine) -> None:
    @app.post("/api/uploads", status_code=201)
    def upload(files: list[UploadFile] = File(...), ocr: str = Form("auto")):
        if ocr not in ("auto", "tesseract", "pdf", "none"):
            raise RequestError(422, f"ocr={ocr!r}: use auto, tesseract, pdf or none")
        return import_uploads(engine, files, ocr)


def register_retrain_routes(app, engine: Engine) -> None:
    @app.post("/api/retrain")
    def retrain(body: RetrainBody | None = None):
        return start_retrain(engine, body.model_dump(exclude_none=True) if body else {})

    @app.get("/api/retrain")
    def retrain_status():
        return {"available": retrain_available(), **engine.retrain_state}


def register_static_routes(app, engine: Engine) -> None:
    """The browser UI: / and the files of dociq/engine/static."""
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/")
    def index(request: Request):
        if "text/html" not in request.headers.get("accept", ""):   # Label Studio checks GET / as health
            return {"status": "UP", "model_class": "DociqEngine", "model_version": engine.model_version}
        return HTMLResponse((STATIC_DIR / "index.html").read_text(encoding="utf-8"))


# ---- uploads -----------------------------------------------------------------------------------

_DRIVE = re.compile(r"^[A-Za-z]:")


def check_upload_name(name: str | None) -> str:
    """A plain file name: no folders, no '..', not absolute -> 400 otherwise."""
    if not name or not name.strip():
        raise RequestError(400, "the upload has no file name: send the file with its name (e.g. page.png)")
    if "\x00" in name or name.startswith(("/", "\\")) or _DRIVE.match(name):
        raise RequestError(400, f"file name {name!r} is an absolute path: send the file's name only")
    parts = re.split(r"[\\/]", name)
    if ".." in parts:
        raise RequestError(400, f"file name {name!r} climbs out of its folder ('..'): send the file's name only")
    if len(parts) > 1:
        raise RequestError(400, f"file name {name!r} has folders: send the file's name only")
    if name in (".", "..") or name.startswith("."):
        raise RequestError(400, f"file name {name!r} is hidden or special: send a name like page.png")
    return name


def upload_suffix(head: bytes, name: str) -> str:
    for magic, suffix in UPLOAD_TYPES.items():
        if head.startswith(magic):
            return suffix
    raise RequestError(415, f"{name}: not a PNG, JPEG or PDF (by its first bytes); upload page images or PDFs")


def import_uploads(engine: Engine, files: list, ocr: str) -> dict:
    """Check every file (name, size, type) before any is imported, then import them into the store."""
    if not files:
        raise RequestError(422, "no files: send one or more PNG/JPEG/PDF files in the 'files' field")
    folder = engine.data_dir / "uploads" / f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
    checked = []
    total = 0
    for upload in files:
        name = check_upload_name(upload.filename)
        data = upload.file.read(engine.max_upload_bytes + 1)
        total += len(data)
        if len(data) > engine.max_upload_bytes or total > engine.max_upload_bytes:
            raise RequestError(413, f"{name}: the upload exceeds the limit of {engine.max_upload_bytes} bytes")
        suffix = upload_suffix(data[:8], name)
        stem = Path(name).stem or "upload"
        checked.append((f"{stem}{suffix}", data))
    if len({n for n, _ in checked}) != len(checked):
        raise RequestError(400, "two uploads have the same name: rename one")
    folder.mkdir(parents=True, exist_ok=False)
    for name, data in checked:
        (folder / name).write_bytes(data)
    result = import_folder(engine.store, folder, ocr=ocr)
    skipped = [{"name": s.name, "reason": s.reason} for s in result.skipped]
    if not result and not result.existing:
        reasons = "; ".join(f"{s['name']}: {s['reason']}" for s in skipped) or "no pages found"
        raise RequestError(422, f"nothing was imported ({reasons})")
    return {"pages": list(result), "existing": list(result.existing), "skipped": skipped}


# ---- serving -----------------------------------------------------------------------------------

def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False            # a host name other than localhost: assume it is reachable


def check_bind(host: str, token: str | None) -> str | None:
    """The token to use for `host`: loopback needs none; any other address prints a warning and
    requires one (--token or DOCIQ_ENGINE_TOKEN), else a ValueError refuses to start."""
    token = token or os.environ.get(TOKEN_ENV) or None
    if token is not None and len(token) < 8:
        raise ValueError(f"the token is {len(token)} characters long: use at least 8 (e.g. `python -c "
                         "'import secrets; print(secrets.token_urlsafe())'`)")
    if not is_loopback(host):
        print(f"WARNING: --host {host} is not a loopback address: the engine (pages, annotations, uploads) "
              "is reachable from the network. Every request must carry the token.", file=sys.stderr)
        if token is None:
            raise ValueError(f"--host {host} exposes the engine to the network and no token is set: give "
                             f"--token SECRET or set {TOKEN_ENV}, or bind --host 127.0.0.1")
    return token


class ServerThread:
    """Run an app with uvicorn in a background thread (tests, notebooks, benchmarks):

        with ServerThread(app) as url:      # http://127.0.0.1:<free port>
            httpx.get(url + "/api/pages")
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, timeout: float = 30.0) -> None:
        import uvicorn

        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                                    lifespan="off"))
        self.server.install_signal_handlers = lambda: None    # not the main thread
        self.thread = threading.Thread(target=self.server.run, name="dociq-engine-server", daemon=True)
        self.host, self.timeout = host, timeout
        self.url = ""

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.time() + self.timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.time() > deadline:
                raise RuntimeError("the engine server did not start (is the port free?)")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://{self.host}:{port}"
        return self.url

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(self.timeout)


def build_app(data_dir: str | Path, checkpoint: str | Path | None = None, token: str | None = None,
              device: str = "cpu", create: bool = False, **options):
    """The app for a store folder and a checkpoint (default: the store's promoted checkpoint)."""
    # deferred: the model stack (torch); importing the server does not load it
    from dociq.inference.predictor import load_predictor

    store = EngineStore(data_dir, create=create)
    checkpoint = checkpoint or store.checkpoint()
    if checkpoint is None:
        raise ValueError(f"no checkpoint: give --checkpoint CKPT (a stage=finetune .ckpt or a model folder); the "
                         f"store {store.data_dir} has none promoted yet")
    predictor = load_predictor(checkpoint, device)
    return create_app(store, predictor, token=token, checkpoint=checkpoint, **options)


def serve(data_dir: str | Path, checkpoint: str | Path | None = None, host: str = "127.0.0.1",
          port: int = DEFAULT_PORT, token: str | None = None, **options) -> None:
    """Run the engine with uvicorn (blocks). A non-loopback host needs a token."""
    import uvicorn

    token = check_bind(host, token)
    if token is None:       # loopback without a token: answer only loopback Host names (DNS rebinding)
        options.setdefault("trusted_hosts", list(LOOPBACK_NAMES))
    app = build_app(data_dir, checkpoint, token=token, **options)
    where = f"http://{host}:{port}/" + (f"?token={token}" if token else "")
    print(f"dociq engine: open {where}", file=sys.stderr)
    uvicorn.run(app, host=host, port=port, log_level="warning")
