"""The ONNX export and its torch-free runner give the Predictor's masks.

Tolerance: the graphs compute what the torch modules compute, op for op, but onnxruntime fuses and
reorders float32 reductions (attention, layer norms, matmuls) and the runner resizes in numpy, so
logits agree to float32 rounding, not bit for bit: a max abs difference of 1e-3 on logits whose
magnitude is ~1-10 is ~1e-4 relative, 100x above the ~1e-5 measured and far below what moves a
mask (IoU >= 0.99 of the thresholded masks)."""
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from dociq.data.collate import _to_input_frame, lexical_match  # noqa: E402
from dociq.inference import onnx_geometry as geo  # noqa: E402
from dociq.inference import onnx_inputs  # noqa: E402
from dociq.inference.model_folder import export_checkpoint  # noqa: E402
from dociq.inference.onnx_export import export_onnx  # noqa: E402
from dociq.inference.onnx_predictor import OnnxPredictor  # noqa: E402
from dociq.inference.predictor import Predictor  # noqa: E402
from dociq.models import grounding as tg  # noqa: E402

LOGIT_TOL = 1e-3
# One worker takes the whole module, so its export fixture runs once (pyproject: --dist loadgroup).
pytestmark = pytest.mark.xdist_group("onnx_export")


def _page(h: int, w: int, seed: int):
    """A page of word-shaped ink boxes on lines, with their words and pixel boxes."""
    rng = np.random.default_rng(seed)
    image = np.full((h, w, 3), 255, np.uint8)
    words, boxes = [], []
    vocab = ["Invoice", "total", "amount", "date", "Lawyer", "section", "page", "footer", "table", "value"]
    for line in range(int(h / 28) - 2):
        x = 12
        while x < w - 80:
            ww = int(rng.integers(25, 70))
            y = 14 + 28 * line
            words.append(str(rng.choice(vocab)) + (str(line) if rng.random() < 0.3 else ""))
            boxes.append([x, y, x + ww, y + 14])
            image[y + 2:y + 12, x:x + ww] = rng.integers(0, 90)
            x += ww + int(rng.integers(8, 30))
    return image, words, np.asarray(boxes, np.float32)


@pytest.fixture(scope="module")
def folders(finetune_checkpoint, tmp_path_factory):
    path, _ = finetune_checkpoint
    folder = export_checkpoint(path, tmp_path_factory.mktemp("onnx") / "model")
    export_onnx(folder, optimize=False)      # onnxruntime optimizes at load; skipping torch.onnx's pass saves ~8 s
    return folder


@pytest.fixture(scope="module")
def pair(folders):
    torch_predictor = Predictor.from_pretrained(folders)
    return torch_predictor, OnnxPredictor(folders, threads=1)


PROMPTS = [dict(question=["where is the Invoice total?", "the footer"]),
           dict(boxes=[[20, 30, 200, 120]]),
           dict(points=[[60, 45]]),                                           # a lone click: multimask pick
           dict(points=[[60, 45], [150, 100]], point_labels=[1, 0], boxes=[10, 10, 220, 160],
                question=["which line mentions Lawyer?"])]


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return 1.0 if union == 0 else float(np.logical_and(a, b).sum() / union)


@pytest.mark.parametrize("size", [(300, 230), (200, 340)])
def test_onnx_masks_and_logits_match_torch(pair, size):
    torch_predictor, onnx_predictor = pair
    image, words, boxes = _page(*size, seed=size[0])
    for p in (torch_predictor, onnx_predictor):
        p.set_image(image, words=words, word_boxes=boxes)
    for prompts in PROMPTS + [dict(question="the title", mask_input=np.random.default_rng(0).normal(
            size=(1, 1, *torch_predictor.low_res_size)).astype(np.float32))]:
        ref = torch_predictor.predict(**prompts, return_logits=True)
        out = onnx_predictor.predict(**prompts, return_logits=True)
        assert np.abs(out[2] - ref[2]).max() <= LOGIT_TOL, prompts           # low-res logits
        assert np.abs(out[0] - ref[0]).max() <= LOGIT_TOL, prompts           # at the page's size
        np.testing.assert_allclose(out[1], ref[1], atol=LOGIT_TOL)
        for snap in (None, "blocks"):
            with torch_predictor.snapping(snap):
                onnx_predictor.snap = snap
                ref_masks, _ = torch_predictor.predict(**prompts)
                masks, _ = onnx_predictor.predict(**prompts)
            assert masks.shape == ref_masks.shape == (ref[0].shape[0], *size)
            assert min(_iou(a, b) for a, b in zip(masks, ref_masks)) >= 0.99, (prompts, snap)
    onnx_predictor.snap = "blocks"


def test_multimask_and_defaults_match(pair):
    torch_predictor, onnx_predictor = pair
    image, words, boxes = _page(260, 200, seed=3)
    ref = torch_predictor.predict(image, points=[[40, 30]], multimask_output=True, words=words, word_boxes=boxes)
    out = onnx_predictor.predict(image, points=[[40, 30]], multimask_output=True, words=words, word_boxes=boxes)
    assert out[0].shape == ref[0].shape == (1, 3, 260, 200) and onnx_predictor.snap == torch_predictor.snap
    np.testing.assert_allclose(out[1], ref[1], atol=LOGIT_TOL)
    assert min(_iou(a, b) for a, b in zip(out[0][0], ref[0][0])) >= 0.99


def test_numpy_inputs_match_the_torch_ones(pair):
    torch_predictor, onnx_predictor = pair
    image, words, boxes = _page(300, 170, seed=5)
    x, scale = _to_input_frame(image, 128)
    ours, our_scale = onnx_inputs.letterbox(image, 128)
    assert our_scale == scale and np.abs(ours[0] - x.numpy()).max() < 1e-4     # float32 rounding of values ~2
    onnx_predictor.set_image(image, words=words, word_boxes=boxes)
    tokens = onnx_predictor.page.tokens
    questions = ["where is the Invoice total?", "“Lawyer” section 3"]
    ids = onnx_inputs.question_ids(onnx_predictor.question_tokenizer, questions, 32)
    assert (ids == torch_predictor.question_tokenizer(questions).numpy()).all()
    word_index = torch.from_numpy(tokens["word_index"])
    match, word_pos = lexical_match([words], [questions], word_index, 12, 32)
    our_match, our_pos = onnx_inputs.lexical_match(words, questions, tokens["word_index"][0], 12, 32,
                                                   onnx_predictor.question_tokenizer)
    assert (our_match == match[0].numpy()).all() and (our_pos == word_pos[0].numpy()).all() and our_match.any()
    # the word geometry the prompt graph takes as inputs
    boxes_t = torch.from_numpy(tokens["ocr_boxes"])
    blocks = onnx_inputs.block_index(words, boxes, tokens["word_index"][0])
    coords = np.array([[[30.0, 20.0], [70.0, 50.0]], [[5.0, 5.0], [100.0, 90.0]]], np.float32)
    labels = np.array([[1, 0], [2, 3]])
    clicked = geo.clicked_words(coords, labels, tokens["ocr_boxes"][0], tokens["word_index"][0], 128, 20.0)
    boxed = geo.boxed_words(coords, labels, tokens["ocr_boxes"][0], tokens["word_index"][0], 128)
    ref_clicked = tg.clicked_words(torch.from_numpy(coords), torch.from_numpy(labels), boxes_t, word_index, 128, 20.0)
    ref_boxed = tg.boxed_words(torch.from_numpy(coords), torch.from_numpy(labels), boxes_t, word_index, 128)
    assert (clicked == ref_clicked.numpy()).all() and clicked.any() and (boxed == ref_boxed.numpy()).all() and boxed.any()
    ref = tg.prompt_geometry(torch.from_numpy(our_match), boxes_t, ref_clicked, ref_boxed,
                             torch.from_numpy(blocks)[None], alignment=True)
    on = (our_match > 0).astype(np.float32)
    ours = dict(zip(("match_row", "match_column"), geo.line_and_column(on, tokens["ocr_boxes"][0])))
    ours.update(zip(("click_row", "click_column"), geo.line_and_column(clicked, tokens["ocr_boxes"][0])))
    ours.update(match_block=geo.in_tagged_block(on, blocks), click_block=geo.in_tagged_block(clicked, blocks),
                box_block=geo.in_tagged_block(boxed, blocks), block_boxes=geo.block_extents(tokens["ocr_boxes"][0], blocks))
    assert set(ours) == set(ref)
    for key, value in ours.items():
        np.testing.assert_allclose(value, ref[key].numpy(), atol=1e-6, err_msg=key)


def test_runner_never_imports_torch(folders):
    """The runner in a fresh interpreter where `import torch` fails."""
    code = textwrap.dedent(f"""
        import sys
        for name in ("torch", "open_clip", "transformers", "timm"):
            sys.modules[name] = None          # any import of them raises ImportError
        import numpy as np
        from dociq.inference.onnx_predictor import OnnxPredictor
        image = np.full((120, 90, 3), 255, np.uint8)
        image[20:30, 10:60] = 0
        p = OnnxPredictor({str(folders)!r}, threads=1)
        masks, scores = p.predict(image, question=["the title"], boxes=[5, 5, 70, 40],
                                  words=["Title", "text"], word_boxes=[[10, 20, 60, 30], [10, 50, 40, 60]])
        assert masks.shape == (1, 120, 90) and masks.dtype == bool, masks.shape
        loaded = [m for m, mod in sys.modules.items() if mod is not None and m.split(".")[0] in
                  ("torch", "open_clip", "transformers", "timm")]
        print("ok", sorted(loaded))
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "ok []"


def test_export_folder_and_cli(folders, tmp_path, capsys):
    from dociq.cli.predict import main as predict_main
    from PIL import Image

    config = json.loads((folders / "onnx" / "onnx_config.json").read_text())
    assert all((folders / "onnx" / name).is_file() for name in config["files"].values())
    image, words, boxes = _page(150, 120, seed=7)
    Image.fromarray(image).save(tmp_path / "page.png")
    words_json = tmp_path / "words.json"
    words_json.write_text(json.dumps([{"text": t, "box": b.tolist()} for t, b in zip(words, boxes)]))
    out = tmp_path / "overlay.png"
    assert predict_main([str(folders), str(tmp_path / "page.png"), "--backend", "onnx", "--question", "the total",
                         "--words", str(words_json), "--out", str(out)]) == 0
    assert out.is_file() and "predicted IoU" in capsys.readouterr().out
    code = predict_main([str(folders / "model.safetensors"), str(tmp_path / "page.png"), "--backend", "onnx",
                         "--box", "1", "1", "50", "50"])
    assert code == 2 and "dociq export CKPT DIR --onnx" in capsys.readouterr().err


def test_segment_on_the_onnx_backend_runs_without_torch_and_finds_the_torch_regions(folders, tmp_path, text_pdf):
    """`dociq segment --backend onnx` in an interpreter where `import torch` fails, against the
    torch backend on the same exported folder and PDF."""
    from dociq.cli.segment import main as segment_main

    pages = [[(16, 20, 170, "Annual Report"), (9, 20, 140, "Revenue grew in every region this year."),
              (9, 20, 128, "Costs fell after the new plant opened."), (7, 130, 12, "page 1")],
             [(12, 20, 170, "Results by region"), (9, 20, 140, "North sold more than south."), (7, 130, 12, "page 2")]]
    pdf = tmp_path / "report.pdf"
    pdf.write_bytes(text_pdf(pages, width=300, height=200))
    assert segment_main([str(folders), str(pdf), "--out", str(tmp_path / "torch"), "--threads", "1"]) == 0
    code = textwrap.dedent(f"""
        import sys
        for name in ("torch", "torchvision", "open_clip", "transformers", "timm"):
            sys.modules[name] = None          # any import of them raises ImportError
        from dociq.cli.segment import main
        code = main([{str(folders)!r}, {str(pdf)!r}, "--out", {str(tmp_path / "onnx")!r}, "--backend", "onnx",
                     "--threads", "1", "--question", "the page footer"])
        loaded = [m for m, mod in sys.modules.items() if mod is not None and m.split(".")[0] in
                  ("torch", "torchvision", "open_clip", "transformers", "timm")]
        print("ok", code, sorted(loaded))
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "ok 0 []"
    ours = json.loads((tmp_path / "onnx" / "report.json").read_text())
    ref = json.loads((tmp_path / "torch" / "report.json").read_text())
    assert len(ours["pages"]) == len(ref["pages"]) == 2
    for page, expect in zip(ours["pages"], ref["pages"]):
        regions = [r for r in page["regions"] if r["class"] != "answer"]
        assert len(regions) == len(expect["regions"]) > 0
        for r, e in zip(regions, expect["regions"]):
            assert r["class"] == e["class"] and r["text"] == e["text"]
            np.testing.assert_allclose(r["box"], e["box"], atol=2)


def test_word_class_probabilities_read_each_words_first_token(pair):
    """The runner's word classes from the page graph's `word_class_logits` (the fixture model has no
    word-class head, so the output is given here), as `Predictor.word_class_probabilities` reads them."""
    _torch_predictor, onnx_predictor = pair
    image, words, boxes = _page(200, 160, seed=3)
    onnx_predictor.set_image(image, words=words, word_boxes=boxes)
    assert onnx_predictor.word_class_probabilities() is None            # no head, no output
    word_index = onnx_predictor.page.tokens["word_index"]
    logits = np.random.default_rng(0).standard_normal((1, word_index.shape[1], 5)).astype(np.float32)
    onnx_predictor.page.embedding["word_class_logits"] = logits
    got = onnx_predictor.word_class_probabilities()
    first = tg.first_subtokens(torch.from_numpy(word_index))[0]
    expect = np.zeros((len(words), 5), np.float32)
    expect[word_index[0, first.numpy()]] = torch.from_numpy(logits)[0, first].softmax(-1).numpy()
    assert got.shape == (len(words), 5) and (got.sum(1) > 0).all()
    np.testing.assert_allclose(got, expect, atol=1e-6)


def test_class_questions_take_the_named_units_on_both_backends(pair, monkeypatch):
    """A question naming a text class is answered from the units the unit classifier names, on the
    runner as on torch: the packaged classifier, and one that calls the unit holding the middle
    word the page number."""
    from dociq.data.schema import REGION_CLASSES

    torch_predictor, onnx_predictor = pair
    image, words, boxes = _page(260, 230, seed=5)
    questions = ["where is the page number?", "all paragraphs", "the footer"]
    packaged = [p.predict(image, question=questions, words=words, word_boxes=boxes)[0]
                for p in (torch_predictor, onnx_predictor)]
    np.testing.assert_array_equal(packaged[0], packaged[1])

    class MiddleWordIsTheNumber:
        classes = REGION_CLASSES

        def unit_probabilities(self, image, word_boxes, words_, units, ocr=False):
            probs = np.full((len(units), len(REGION_CLASSES)), 0.01)
            probs[:, REGION_CLASSES.index("paragraph")] = 0.5
            probs[[len(words) // 2 in unit for unit in units], REGION_CLASSES.index("page_number")] = 0.9
            return probs

    answers = []
    for p in (torch_predictor, onnx_predictor):
        monkeypatch.setattr(p, "unit_classifier", MiddleWordIsTheNumber())
        answers.append(p.predict(image, question=questions, words=words, word_boxes=boxes)[0])
    np.testing.assert_array_equal(answers[0], answers[1])
    x0, y0, x1, y1 = boxes[len(words) // 2].astype(int)
    number, paragraphs = answers[0][0], answers[0][1]
    assert number[y0:y1, x0:x1].all() and number.sum() < paragraphs.sum() / 4   # its unit, not the page
    # words the OCR doubts (those without a digit, here) name no unit, on the runner as on torch
    from dociq.data.ocr import OcrWords

    doubted = OcrWords(words, boxes, image.shape[:2], np.full(len(words), 10.0))
    both = [p.predict(image, question=questions, words=doubted)[0] for p in (torch_predictor, onnx_predictor)]
    np.testing.assert_array_equal(both[0], both[1])
    assert not np.array_equal(both[0], answers[0])
