"""The engine as a Label Studio ML backend: the routes Label Studio calls, at the server's root.

    GET  /health, GET / (without Accept: text/html)  -> {"status": "UP", "model_class": ...}
    POST /setup    {project, schema}                  -> {"model_version": ...}
    POST /predict  {tasks, label_config, params: {context: {result: [keypoints / rectangles]}}}
                   -> {"results": [{"result": [...], "score": ..., "model_version": ...}, ...]}
    POST /webhook  {action: ANNOTATION_CREATED | ANNOTATION_UPDATED | ANNOTATION_DELETED |
                    START_TRAINING, annotation, task, project}

As label_studio_ml/api.py (HumanSignal/label-studio-ml-backend) defines them. Interactive
("smart") keypoints and rectangles in `params.context.result` become the points / box prompt of one
mask; without a context each task gets the page's automatic proposals (or the masks of a configured
question). Masks go back as `brushlabels` in Label Studio's own brush RLE (rle-pack of the RGBA
pixels, not COCO's RLE: `encode_ls_rle`, byte-for-byte what label_studio_converter.brush.mask2rle
writes), or as `polygonlabels` (points in percent) when the label config has PolygonLabels only.
`pre_annotation_task` writes the same results as a task file Label Studio imports (`dociq segment
--format labelstudio`).

Task images are never downloaded: a task names a store page (`data.page_id`, or the engine's own
`/api/pages/<id>/image` URL), a file under the store folder (a path, or Label Studio's
`/data/local-files/?d=<path>`), or carries the image as a `data:` URL; the last two are added to
the store (once: pages are matched by their pixels). Remote URLs are refused with 422.
"""
from __future__ import annotations

import base64
import io
import re
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse
from xml.sax.saxutils import quoteattr

import numpy as np
from fastapi import Request  # module level: the routes' annotations are resolved from these globals
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from dociq.data.image_io import load_page_image, to_rgb_array
from dociq.data.synthetic.questions import LAYOUT_PHRASES
from dociq.engine.importer import import_folder
from dociq.engine.service import RequestError, page_proposals, retrain_available, rle_to_mask, start_retrain
from dociq.engine.store import image_sha256

MODEL_CLASS = "DociqEngine"
MAX_DATA_URL_BYTES = 50 * 2**20
AUTHOR_PREFIX = "label-studio:annotation:"
TRAIN_EVENTS = ("ANNOTATION_CREATED", "ANNOTATION_UPDATED", "ANNOTATION_DELETED", "START_TRAINING")


# ---- Label Studio's brush RLE (thi-ng rle-pack over RGBA bytes) --------------------------------

def encode_ls_rle(values: np.ndarray, word_size: int = 8, rle_sizes: tuple[int, ...] = (3, 4, 8, 16)) -> list[int]:
    """uint8 values -> rle-pack bytes as a list of ints: a 32-bit count, 5 bits word size - 1, four
    4-bit run-length field sizes - 1, then per run: 1 = repeat (2-bit size index, length - 1, one
    value) or 0 = literal; single values are written as literal runs of one. Padded with 1..8 zero
    bits to whole bytes, as label_studio_converter.brush.encode_rle does."""
    values = np.asarray(values).ravel()
    if values.size and (values.min() < 0 or values.max() >= 2**word_size):
        raise ValueError(f"values must fit {word_size} bits")
    bits = [f"{values.size:032b}", f"{word_size - 1:05b}", *(f"{s - 1:04b}" for s in rle_sizes)]
    if values.size:
        change = np.flatnonzero(values[1:] != values[:-1])
        ends = np.append(change, values.size - 1)
        lengths = np.diff(np.append(-1, ends))
        limits = [2**s for s in rle_sizes]
        for length, value in zip(lengths.tolist(), values[ends].tolist()):
            word = format(value, f"0{word_size}b")
            if length == 1:
                bits.append("0" + "00" + "0" * rle_sizes[0] + word)
                continue
            while length > limits[-1]:                   # longer than the widest field: chunks of 2^16
                bits.append("1" + format(len(limits) - 1, "02b") + "1" * rle_sizes[-1] + word)
                length -= limits[-1]
            index = next(i for i, limit in enumerate(limits) if length <= limit)
            bits.append("1" + format(index, "02b") + format(length - 1, f"0{rle_sizes[index]}b") + word)
    text = "".join(bits)
    text += "0" * (8 - len(text) % 8)
    return np.packbits(np.frombuffer(text.encode("ascii"), np.uint8) - 48).tolist()


def decode_ls_rle(rle: Any) -> np.ndarray:
    """rle-pack bytes -> uint8 values (thi-ng/umbrella rle-pack `decode`)."""
    data = np.asarray(rle, dtype=np.int64)
    if data.ndim != 1 or data.size < 6 or data.min() < 0 or data.max() > 255:
        raise ValueError("rle must be a list of bytes (0..255) in Label Studio's brush format")
    bits = np.unpackbits(data.astype(np.uint8))
    pos = 0

    def read(n: int) -> int:
        nonlocal pos
        if pos + n > bits.size:
            raise ValueError("rle ends early: not Label Studio's brush format (or cut)")
        chunk = bits[pos:pos + n]
        pos += n
        return int("".join("01"[b] for b in chunk), 2) if n else 0

    num = read(32)
    word_size = read(5) + 1
    sizes = [read(4) + 1 for _ in range(4)]
    if num > 4 * 2**26:
        raise ValueError(f"rle holds {num} values: larger than any page this engine accepts")
    out = np.zeros(num, np.uint8)
    i = 0
    while i < num:
        repeat = read(1)
        j = min(i + 1 + read(sizes[read(2)]), num)
        if repeat:
            out[i:j] = read(word_size)
        else:
            for k in range(i, j):
                out[k] = read(word_size)
        i = j
    return out


def mask_to_ls_rle(mask: np.ndarray) -> list[int]:
    """bool [H, W] -> Label Studio brush RLE (RGBA pixels, 255 where the mask is: mask2rle's input)."""
    return encode_ls_rle(np.repeat(mask.astype(np.uint8).ravel() * 255, 4))


def ls_rle_to_mask(rle: Any, height: int, width: int) -> np.ndarray:
    values = decode_ls_rle(rle)
    if values.size != height * width * 4:
        raise ValueError(f"brush rle holds {values.size} values, the {width}x{height} page needs "
                         f"{height * width * 4} (RGBA)")
    return values.reshape(height, width, 4)[:, :, 3] > 0


def mask_to_polygon(mask: np.ndarray, max_points: int = 200) -> list[list[float]]:
    """The outline of the mask's largest part, in percent of the page (Label Studio's polygon)."""
    import contourpy

    h, w = mask.shape
    padded = np.pad(mask.astype(np.float64), 1)
    lines = contourpy.contour_generator(z=padded).lines(0.5)
    if not lines:
        return []
    line = max(lines, key=len)[:, :] - 1.0                 # undo the padding: (x, y) in pixels
    step = max(1, len(line) // max_points)
    line = line[::step]
    return [[float(np.clip(x, 0, w) * 100 / w), float(np.clip(y, 0, h) * 100 / h)] for x, y in line]


def polygon_to_mask(points: list, height: int, width: int) -> np.ndarray:
    from PIL import Image, ImageDraw

    xy = [(float(x) * width / 100, float(y) * height / 100) for x, y in points]
    if len(xy) < 3:
        raise ValueError("a polygon needs at least 3 points")
    canvas = Image.new("1", (width, height), 0)
    ImageDraw.Draw(canvas).polygon(xy, fill=1)
    return np.array(canvas, dtype=bool)


# ---- the label config ---------------------------------------------------------------------------

@dataclass
class LabelConfig:
    """What the engine needs from a Label Studio label config."""
    image_name: str = "image"                 # the <Image name>
    image_key: str = "image"                  # task.data key ($image)
    output_type: str = "brushlabels"          # brushlabels | polygonlabels
    from_name: str = "tag"
    labels: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, text: str | None) -> "LabelConfig":
        if not text:
            return cls()
        try:
            root = ET.fromstring(text)
        except ET.ParseError as err:
            raise ValueError(f"label_config is not XML ({err}): pass the project's label config") from err
        config = cls()
        for tag in root.iter("Image"):
            config.image_name = tag.get("name", "image")
            config.image_key = (tag.get("value") or "$image").lstrip("$")
            break
        for kind in ("BrushLabels", "PolygonLabels"):
            for tag in root.iter(kind):
                config.output_type = kind.lower()
                config.from_name = tag.get("name", "tag")
                config.image_name = tag.get("toName", config.image_name)
                config.labels = [label.get("value") for label in tag.iter("Label") if label.get("value")]
                return config
        raise ValueError("label_config has no <BrushLabels> or <PolygonLabels> tag: add one (toName the <Image>) "
                         "so the engine's masks have somewhere to go")

    def label_for(self, name: str | None) -> str | None:
        """The config's label matching `name` (case, spaces, '-' and '_' ignored), else the first."""
        if name:
            key = re.sub(r"[\s_-]+", "", name.lower())
            for label in self.labels:
                if re.sub(r"[\s_-]+", "", label.lower()) == key:
                    return label
        return self.labels[0] if self.labels else name

    def result(self, mask: np.ndarray, label: str | None, score: float) -> dict:
        h, w = mask.shape
        out = {"id": uuid.uuid4().hex[:10], "from_name": self.from_name, "to_name": self.image_name,
               "original_width": int(w), "original_height": int(h), "image_rotation": 0,
               "type": self.output_type, "score": float(score), "readonly": False}
        labels = [label] if label else []
        if self.output_type == "brushlabels":
            out["value"] = {"format": "rle", "rle": [int(v) for v in mask_to_ls_rle(mask)], "brushlabels": labels}
        else:
            out["value"] = {"points": mask_to_polygon(mask), "polygonlabels": labels, "closed": True}
        return out


# ---- task images -> store pages -------------------------------------------------------------------

_OWN_IMAGE_URL = re.compile(r"^(?:https?://[^/]+)?/api/pages/([A-Za-z0-9_-]+)/image(?:\?.*)?$")


def resolve_page(engine, data: dict, image_key: str) -> str:
    """The store page of a task (adding a local file or data: URL image to the store once)."""
    store = engine.store
    if not isinstance(data, dict):
        raise RequestError(422, "task.data must be an object with the image (e.g. {\"image\": ...})")
    if data.get("page_id"):
        store.page(str(data["page_id"]))                      # 404 when unknown
        return str(data["page_id"])
    ref = data.get(image_key)
    if not isinstance(ref, str) or not ref:
        raise RequestError(422, f"task.data has no {image_key!r} image (the label config's <Image value=\"$"
                                f"{image_key}\">): give a store page id, a file under the data folder or a "
                                "data: URL")
    own = _OWN_IMAGE_URL.match(ref)
    if own:
        store.page(own.group(1))
        return own.group(1)
    if ref.startswith("data:"):
        header, _, payload = ref.partition(",")
        if ";base64" not in header or not header[5:].startswith("image/"):
            raise RequestError(422, "a data: URL image must be data:image/...;base64,...")
        if len(payload) > MAX_DATA_URL_BYTES * 4 // 3 + 4:
            raise RequestError(413, f"the data: URL image exceeds {MAX_DATA_URL_BYTES} bytes")
        try:
            from PIL import Image

            raw = base64.b64decode(payload, validate=True)
            image = to_rgb_array(Image.open(io.BytesIO(raw)))
        except Exception as err:   # noqa: BLE001 — any decoding failure is the client's data
            raise RequestError(422, f"the data: URL is not a readable image ({type(err).__name__}: {err})") from err
        existing = store.page_by_hash(image_sha256(image))
        if existing is not None:
            return existing
        from PIL import Image

        path = engine.data_dir / "uploads" / "label-studio" / f"{image_sha256(image)[:16]}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(path)
    else:
        path = local_path(ref, engine.data_dir)
        existing = store.page_by_hash(image_sha256(load_page_image(path)))
        if existing is not None:
            return existing
    return import_page(engine, path)


def import_page(engine, path: Path) -> str:
    """One image file into the store with the importer (words by OCR when it is available)."""
    result = import_folder(engine.store, path, ocr=engine.ls_ocr)
    ids = list(result) + list(result.existing)
    if not ids:
        reason = result.skipped[0].reason if result.skipped else "no page in it"
        raise RequestError(422, f"the task image {path.name} could not be read: {reason}")
    return ids[0]


def local_path(ref: str, data_dir: Path) -> Path:
    """A task image reference -> a file inside `data_dir` (RequestError otherwise)."""
    parsed = urlparse(ref)
    if parsed.scheme in ("http", "https", "s3", "gs", "azure-blob", "ftp"):
        if parsed.path.startswith("/data/local-files/"):
            pass
        else:
            raise RequestError(422, f"the task image {ref[:100]!r} is a remote URL: the engine does not download "
                                    "images. Give a file under the data folder, Label Studio's "
                                    "/data/local-files/?d=<path>, or a data: URL")
    if parsed.path.startswith("/data/local-files/"):
        d = parse_qs(parsed.query).get("d", [None])[0]
        if not d:
            raise RequestError(422, f"{ref[:100]!r}: /data/local-files/ needs ?d=<path under the data folder>")
        candidate = data_dir / unquote(d)
    elif parsed.scheme in ("", "file"):
        raw = Path(unquote(parsed.path if parsed.scheme == "file" else ref))
        candidate = raw if raw.is_absolute() else data_dir / raw
    else:
        raise RequestError(422, f"the task image {ref[:100]!r} has the scheme {parsed.scheme!r}: give a file under "
                                "the data folder or a data: URL")
    resolved = candidate.resolve()
    root = data_dir.resolve()
    if root != resolved and root not in resolved.parents:
        raise RequestError(403, f"the task image {ref[:100]!r} lies outside the data folder {root}: copy it there")
    if not resolved.is_file():
        raise RequestError(404, f"the task image {ref[:100]!r} is not a file under the data folder {root}")
    return resolved


# ---- predictions --------------------------------------------------------------------------------

def context_prompts(context: dict, size: tuple[int, int]) -> tuple[list, list, list | None, str | None]:
    """Label Studio's interactive context -> (points, labels, box, the label the user chose) in page
    pixels. Keypoint and rectangle values are percent of the image."""
    h, w = size
    points, labels, box, chosen = [], [], None, None
    for item in context.get("result") or []:
        if not isinstance(item, dict):
            continue
        kind = str(item.get("type", "")).lower()
        value = item.get("value") or {}
        if kind not in ("keypointlabels", "rectanglelabels"):
            continue
        try:
            x, y = float(value["x"]) * w / 100, float(value["y"]) * h / 100
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"context {kind} has no numeric value.x / value.y ({err})") from err
        names = value.get(kind) or value.get("labels") or []
        chosen = names[0] if names else chosen
        if kind == "keypointlabels":
            points.append([x, y])
            labels.append(1 if item.get("is_positive", True) else 0)
        else:
            try:
                bw, bh = float(value["width"]) * w / 100, float(value["height"]) * h / 100
            except (KeyError, TypeError, ValueError) as err:
                raise ValueError(f"context rectanglelabels has no numeric value.width / value.height ({err})") from err
            box = [x, y, x + bw, y + bh]
    return points, labels, box, chosen


def predict_task(engine, task: dict, config: LabelConfig, context: dict | None) -> dict:
    page_id = resolve_page(engine, task.get("data") if isinstance(task, dict) else None, config.image_key)
    size = engine.page_size(page_id)
    results = []
    if context and context.get("result"):
        points, labels, box, chosen = context_prompts(context, size)
        if points or box:
            session = f"label-studio:{task.get('id')}"
            pred = engine.cache.predict(page_id, session=session, points=points or None,
                                        point_labels=labels or None, box=box)
            if pred.mask.any():
                results.append(config.result(pred.mask, config.label_for(chosen), pred.score))
    elif engine.ls_question:
        pred = engine.cache.predict(page_id, session=f"label-studio:{task.get('id')}", question=engine.ls_question)
        if pred.mask.any():
            results.append(config.result(pred.mask, config.label_for(None), pred.score))
    else:
        regions, _ms = page_proposals(engine, page_id)
        for region in regions:
            mask = rle_to_mask(region["mask"], size)
            results.append(config.result(mask, config.label_for(region["category"]), region["score"]))
    return prediction(results, engine.model_version)


def prediction(results: list[dict], model_version: str) -> dict:
    """One Label Studio prediction: its results and their mean score."""
    score = float(np.mean([r["score"] for r in results])) if results else 0.0
    return {"result": results, "score": score, "model_version": model_version}


def pre_annotation_task(image_ref: str, masks: list[tuple[np.ndarray, str | None, float]], model_version: str,
                        config: LabelConfig | None = None, data: dict | None = None) -> dict:
    """A Label Studio task with its pre-annotation, as Label Studio imports it from a JSON file
    (`{"data": {image_key: image_ref, ...}, "predictions": [{"result": [...], ...}]}`): one result
    per (mask, label, score), written as `/predict` writes them."""
    config = config or LabelConfig()
    results = [config.result(mask, config.label_for(label), score) for mask, label, score in masks]
    return {"data": {config.image_key: image_ref, **(data or {})}, "predictions": [prediction(results, model_version)]}


def label_config_xml(labels: list[str], config: LabelConfig | None = None) -> str:
    """A Label Studio label config with a brush label per name, matching `pre_annotation_task`'s results."""
    config = config or LabelConfig()
    tag = "BrushLabels" if config.output_type == "brushlabels" else "PolygonLabels"
    items = "".join(f"\n    <Label value={quoteattr(label)}/>" for label in labels)
    return (f'<View>\n  <Image name="{config.image_name}" value="${config.image_key}"/>\n  <{tag} '
            f'name="{config.from_name}" toName="{config.image_name}">{items}\n  </{tag}>\n</View>\n')


# ---- webhook: Label Studio's annotations into the store -------------------------------------------

def question_for(label: str) -> str:
    """The question an instance of `label` answers: the model's own singular phrasing when it is a
    layout class it was trained on, else 'the <label>'."""
    key = re.sub(r"[\s-]+", "_", label.strip().lower())
    if key in LAYOUT_PHRASES:
        return LAYOUT_PHRASES[key][0][0]
    return f"the {label.strip()}"


def annotation_masks(annotation: dict, size: tuple[int, int]) -> list[tuple[np.ndarray, str | None]]:
    """(mask, label) of every brush / polygon result of a Label Studio annotation."""
    h, w = size
    out = []
    for item in annotation.get("result") or []:
        if not isinstance(item, dict):
            continue
        kind = str(item.get("type", "")).lower()
        value = item.get("value") or {}
        ow, oh = item.get("original_width", w), item.get("original_height", h)
        if (ow, oh) != (w, h):
            raise ValueError(f"result {item.get('id')!r} is for a {ow}x{oh} image, the page is {w}x{h}")
        if kind == "brushlabels" and "rle" in value:
            mask = ls_rle_to_mask(value["rle"], h, w)
        elif kind == "polygonlabels" and "points" in value:
            mask = polygon_to_mask(value["points"], h, w)
        else:
            continue
        names = value.get(kind) or []
        out.append((mask, names[0] if names else None))
    return out


def handle_webhook(engine, payload: dict) -> tuple[dict, int]:
    action = payload.get("action")
    if action not in TRAIN_EVENTS:
        return {"status": "Unknown event", "action": action}, 200
    if action == "START_TRAINING":
        if not retrain_available():
            return {"status": "ok", "result": "retraining is not available in this version (dociq.engine.retrain "
                                              "is not installed); the annotations are in the store"}, 200
        response = start_retrain(engine, {})
        return {"status": "ok" if response.status_code == 202 else "busy",
                "result": response.body.decode("utf-8")}, 201
    annotation = payload.get("annotation")
    task = payload.get("task")
    if not isinstance(annotation, dict) or "id" not in annotation or not isinstance(task, dict):
        raise ValueError(f"{action} needs 'annotation' (with its id) and 'task' objects")
    config = LabelConfig.parse((payload.get("project") or {}).get("label_config"))
    page_id = resolve_page(engine, task.get("data"), config.image_key)
    author = f"{AUTHOR_PREFIX}{annotation['id']}"
    undone = []
    if action in ("ANNOTATION_UPDATED", "ANNOTATION_DELETED"):    # replace what this annotation saved before
        for record in engine.store.annotations(page_id, status=None):
            if record.author == author:
                engine.store.undo(record.id)
                undone.append(record.id)
    saved = []
    if action != "ANNOTATION_DELETED":
        size = engine.page_size(page_id)
        for mask, label in annotation_masks(annotation, size):
            if not mask.any():
                continue
            saved.append(engine.store.save_annotation(page_id, mask, question_for(label) if label else "",
                                                      category=label, status="accepted", author=author))
    return {"status": "ok", "result": {"page_id": page_id, "saved": saved, "undone": undone}}, 201


# ---- routes -------------------------------------------------------------------------------------

def register_routes(app, engine) -> None:
    async def json_body(request: Request) -> dict:
        import json

        try:
            body = json.loads(await request.body() or b"{}")
        except (ValueError, UnicodeDecodeError) as err:
            raise RequestError(422, f"the body is not JSON ({err})") from err
        if not isinstance(body, dict):
            raise RequestError(422, "the body must be a JSON object")
        return body

    @app.get("/health")
    def health():
        return {"status": "UP", "model_class": MODEL_CLASS, "model_version": engine.model_version}

    @app.get("/metrics")
    def metrics():
        return {}

    @app.post("/setup")
    async def setup(request: Request):
        body = await json_body(request)
        LabelConfig.parse(body.get("schema") or body.get("label_config"))     # a bad config fails here
        return {"model_version": engine.model_version}

    @app.post("/predict")
    async def predict(request: Request):
        body = await json_body(request)
        tasks = body.get("tasks")
        if not isinstance(tasks, list) or not tasks:
            raise RequestError(422, "tasks must be a non-empty list of {id, data: {image: ...}}")
        config = LabelConfig.parse(body.get("label_config"))
        params = body.get("params") or {}
        context = params.get("context") if isinstance(params, dict) else None
        results = []
        for task in tasks:   # the model work runs off the event loop
            results.append(await run_in_threadpool(predict_task, engine, task, config,
                                                   context if isinstance(context, dict) else None))
        return {"results": results, "model_version": engine.model_version}

    @app.post("/webhook")
    async def webhook(request: Request):
        body = await json_body(request)
        content, status = await run_in_threadpool(handle_webhook, engine, body)
        return JSONResponse(content, status_code=status)
