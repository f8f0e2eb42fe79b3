"""A screenshot of the data engine's UI with a real model (the README's picture).

    python scripts/engine_screenshot.py <finetune ckpt> --out docs/img/engine_ui.png

Builds a store of held-out synthetic pages in a temporary folder, serves it on 127.0.0.1 with the
checkpoint, and drives Debian's chromium (Playwright): one question answered and accepted, a
second question asked and refined with a click, then the screenshot.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

from dociq.data.synthetic.generator import SyntheticDocuments
from dociq.engine.server import ServerThread, create_app
from dociq.engine.store import EngineStore
from dociq.inference.predictor import Predictor

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--out", default="engine_ui.png")
    p.add_argument("--chromium", default="/usr/bin/chromium")
    p.add_argument("--questions", nargs=2, default=["segment the titles", "all paragraphs"])
    args = p.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        store = EngineStore(Path(tmp) / "data", create=True)
        pages = SyntheticDocuments(3, image_size=(1100, 850), seed=1000003, degrade=0.3)
        for i in range(len(pages)):
            store.add_page(pages[i].image, pages[i].words, pages[i].word_boxes, source=f"held-out page {i}")
        app = create_app(store, Predictor.from_checkpoint(args.checkpoint))
        with ServerThread(app) as url, sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(url + "/")
            page.wait_for_selector("#page-list .page.current")
            first, second = args.questions
            page.fill("#question", first)
            with page.expect_response(lambda r: r.url.endswith("/predict")):
                page.press("#question", "Enter")
            page.wait_for_function("window.dociqState.predictionImage !== null")
            page.fill("#category", "title")
            page.evaluate("document.activeElement.blur()")
            with page.expect_response(lambda r: r.url.endswith("/annotations")):
                page.keyboard.press("Enter")
            page.fill("#question", second)
            with page.expect_response(lambda r: r.url.endswith("/predict")):
                page.press("#question", "Enter")
            page.wait_for_function("window.dociqState.predictionImage !== null")
            page.check("#show-words")
            page.wait_for_timeout(300)
            page.screenshot(path=args.out)
            browser.close()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
