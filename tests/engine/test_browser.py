"""The browser UI end to end: Chromium (Playwright, sync API) against a real uvicorn server on
127.0.0.1. Open a page, ask a question, see a mask, click to correct it, accept; the annotation is
in the store and in /api/export. DOCIQ_SCREENSHOT=<file.png> also saves a screenshot there (the
docs' picture, with a trained model, comes from scripts/engine_screenshot.py)."""
import os
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (Python) is not installed: "
                               "pip install playwright (the browser is Debian's chromium)")
if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing: apt-get install chromium", allow_module_level=True)
pytest.importorskip("uvicorn")

import httpx  # noqa: E402

from dociq.engine.server import ServerThread, create_app  # noqa: E402
from dociq.engine.store import EngineStore  # noqa: E402
from dociq.inference.predictor import Predictor  # noqa: E402


@pytest.fixture
def live(tmp_path, finetune_checkpoint):
    from dociq.data.synthetic.generator import SyntheticDocuments

    store = EngineStore(tmp_path / "data", create=True)
    for i in range(2):
        page = SyntheticDocuments(2, image_size=(330, 256), seed=11)[i]
        store.add_page(page.image, page.words, page.word_boxes, source=f"synthetic-{i}")
    # relaxed filters: the untrained test model's proposals pass them
    app = create_app(store, Predictor.from_checkpoint(finetune_checkpoint[0]),
                     proposal_options={"points_per_side": 2, "pred_iou_thresh": 0.0, "stability_score_thresh": 0.0,
                                       "min_region_area": 1, "classify": False})
    with ServerThread(app) as url:
        yield url, store


@pytest.fixture
def browser():
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


def test_ask_click_accept_undo_in_the_browser(live, browser):
    url, store = live
    page = browser.new_page(viewport={"width": 1280, "height": 820})
    errors = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    predicts = []
    page.on("request", lambda req: predicts.append(req) if req.url.endswith("/predict") else None)

    page.goto(url + "/")
    page.wait_for_selector("#page-list .page.current")
    page_id = store.pages()[0].id
    # the list marks the page at once; its name is written once its image has loaded
    page.wait_for_function("id => document.querySelector('#page-name').textContent.startsWith(id)",
                           arg=page_id, timeout=10_000)
    assert page.text_content("#page-name").startswith(page_id)

    # a question -> a mask overlay
    page.fill("#question", "all paragraphs")
    with page.expect_response(lambda r: r.url.endswith("/predict")) as first:
        page.press("#question", "Enter")
    assert first.value.status == 200
    page.wait_for_function("window.dociqState.predictionImage !== null")
    mask_before = page.evaluate("window.dociqState.prediction.mask.counts")

    # a click on the canvas refines it (the previous logits go along as the mask prompt)
    box = page.locator("#canvas").bounding_box()
    with page.expect_response(lambda r: r.url.endswith("/predict")) as second:
        page.mouse.click(box["x"] + box["width"] * 0.3, box["y"] + box["height"] * 0.4)
    body = second.value.request.post_data_json
    assert body["use_previous"] is True and body["question"] == "all paragraphs" and len(body["points"]) == 1
    page.wait_for_function(f"window.dociqState.prediction.mask.counts !== {mask_before!r}")
    assert len(predicts) == 2 and page.text_content("#clicks") == "1"

    # words toggle draws without errors; accept with Enter (focus off the text field)
    page.check("#show-words")
    page.fill("#category", "paragraph")
    page.locator("#canvas-wrap").focus()
    page.evaluate("document.activeElement.blur()")
    with page.expect_response(lambda r: r.url.endswith("/annotations")) as saved:
        page.keyboard.press("Enter")
    assert saved.value.status == 201
    ann_id = saved.value.json()["id"]
    page.wait_for_function("document.querySelectorAll('#annotations .item').length === 1")

    (record,) = store.annotations(page_id)
    assert record.id == ann_id and record.category == "paragraph" and record.clicks == 1
    assert record.question == "all paragraphs" and record.seconds is not None
    export = httpx.get(url + "/api/export").json()
    assert [(a["id"], a["segmentation"]) for a in export["annotations"]] == [(ann_id, record.rle)]
    assert export["images"][0]["page_id"] == page_id

    if os.environ.get("DOCIQ_SCREENSHOT"):
        with page.expect_response(lambda r: r.url.endswith("/predict")):
            page.mouse.click(box["x"] + box["width"] * 0.6, box["y"] + box["height"] * 0.7)
        page.wait_for_timeout(300)
        out = Path(os.environ["DOCIQ_SCREENSHOT"])
        out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out))
        page.keyboard.press("Escape")

    # Ctrl+Z undoes it; N goes to the next page
    with page.expect_response(lambda r: r.url.endswith("/undo")):
        page.keyboard.press("Control+z")
    page.wait_for_function("document.getElementById('progress-text').textContent.startsWith('0/2')")
    assert store.annotations(page_id) == []
    page.keyboard.press("n")
    page.wait_for_function(f"!document.getElementById('page-name').textContent.startsWith({page_id!r})")
    assert errors == []


def test_propose_all_then_accept_and_reject_proposals(live, browser):
    url, store = live
    page = browser.new_page(viewport={"width": 1280, "height": 820})
    errors = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.goto(url + "/")
    # the list marks the page before the page is open; "propose all" acts on an open page only
    page.wait_for_function("window.dociqState && window.dociqState.image !== null", timeout=10_000)
    with page.expect_response(lambda r: r.url.endswith("/proposals")) as res:
        page.click("#propose")
    regions = res.value.json()["regions"]
    assert regions
    page.wait_for_function(f"document.querySelectorAll('#proposals .item').length === {len(regions)}")
    with page.expect_response(lambda r: r.url.endswith("/annotations")) as first:
        page.locator("#proposals .item .ok").first.click()
    assert first.value.status == 201
    page.wait_for_function("document.querySelectorAll('#annotations .item').length === 1")
    if len(regions) > 1:
        page.locator("#proposals .item .show").nth(1).click()
        page.evaluate("document.activeElement.blur()")
        with page.expect_response(lambda r: r.url.endswith("/annotations")):
            page.keyboard.press("Backspace")
    page_id = store.pages()[0].id
    saved = store.annotations(page_id, status=None)
    assert saved[0].status == "accepted" and saved[0].category == regions[0]["category"]
    assert saved[0].rle["counts"] == regions[0]["mask"]["counts"]
    assert [a.status for a in saved[1:]] == (["rejected"] if len(regions) > 1 else [])
    assert errors == []


def test_the_ui_works_with_a_token(tmp_path, finetune_checkpoint, browser):
    from dociq.data.synthetic.generator import SyntheticDocuments

    store = EngineStore(tmp_path / "data", create=True)
    page = SyntheticDocuments(1, image_size=(160, 128), seed=4)[0]
    store.add_page(page.image, page.words, page.word_boxes, source="synthetic")
    app = create_app(store, Predictor.from_checkpoint(finetune_checkpoint[0]), token="browser-token-123")
    with ServerThread(app) as url:
        tab = browser.new_page()
        assert tab.goto(url + "/").status == 401                       # no token: nothing, not even the page
        tab.goto(url + "/?token=browser-token-123")                   # the cookie carries the scripts and image
        tab.wait_for_function("window.dociqState && window.dociqState.image !== null")
        tab.fill("#question", "the title")
        with tab.expect_response(lambda r: r.url.endswith("/predict")) as res:
            tab.press("#question", "Enter")
        assert res.value.status == 200
