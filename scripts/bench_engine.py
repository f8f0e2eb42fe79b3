"""Server time per click of the data engine, after the page's first prompt (which embeds it).

A store with `--pages` synthetic pages is served by a real uvicorn on 127.0.0.1 (the engine's
`ServerThread`); per page one question embeds the page, then `--clicks` clicks on OCR words follow,
each with the previous mask as the mask prompt (`use_previous`), as the browser sends them.
Reported, median over all clicks after the first prompt of each page:
  model ms:    inside the model lock (prompt encoder + mask decoder + resizing to the page),
  handler ms:  the whole request inside the server (model + COCO RLE + PNG of the mask + JSON),
  round trip:  what the client waits for (handler + HTTP on loopback).

    python scripts/bench_engine.py                              # model=tiny, random init (configs/model/tiny.yaml)
    python scripts/bench_engine.py CKPT_OR_FOLDER               # a stage=finetune .ckpt or a from_pretrained folder
    python scripts/bench_engine.py --model base --clicks 5      # model=base, 1024 px (slow on a CPU)
    python scripts/bench_engine.py --json

Target: <= 50 ms of handler time per click for model=tiny on 2 CPU cores. Results: docs/engine.md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")          # random init: nothing may reach a hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

TARGET_MS = 50.0


def run(args) -> dict:
    import httpx

    from bench_predictor import bench_page, build_predictor   # a sibling: `python scripts/...` puts scripts/ on sys.path
    from dociq.engine.server import ServerThread, create_app
    from dociq.engine.store import EngineStore

    torch.set_num_threads(args.threads)
    predictor = build_predictor(args.checkpoint, args.model, args.device)
    rng = np.random.default_rng(args.seed)
    model_ms, handler_ms, trip_ms, first_ms = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        store = EngineStore(Path(tmp) / "data", create=True)
        pages = [bench_page(args.page_height, args.page_width, args.seed + i) for i in range(args.pages)]
        ids = [store.add_page(p.image, p.words, p.word_boxes, source=f"bench-{i}") for i, p in enumerate(pages)]
        app = create_app(store, predictor, cache_size=max(args.pages, 1))
        with ServerThread(app) as url, httpx.Client(base_url=url, timeout=600) as http:
            for page, page_id in zip(pages, ids):
                question = page.questions[0].text if page.questions else "the title"
                start = time.perf_counter()
                res = http.post(f"/api/pages/{page_id}/predict", json={"question": question, "session": "bench"})
                res.raise_for_status()
                first_ms.append(1e3 * (time.perf_counter() - start))
                boxes = page.word_boxes if len(page.word_boxes) else np.array([[10, 10, 60, 30]], np.float32)
                for i in rng.integers(0, len(boxes), size=args.clicks):
                    x, y = float((boxes[i, 0] + boxes[i, 2]) / 2), float((boxes[i, 1] + boxes[i, 3]) / 2)
                    body = {"points": [[x, y]], "point_labels": [int(rng.random() > 0.2)], "use_previous": True,
                            "session": "bench"}
                    start = time.perf_counter()
                    res = http.post(f"/api/pages/{page_id}/predict", json=body)
                    trip_ms.append(1e3 * (time.perf_counter() - start))
                    res.raise_for_status()
                    model_ms.append(res.json()["server_ms"])
                    handler_ms.append(float(res.headers["x-server-ms"]))
    params = sum(p.numel() for p in predictor.model.parameters())
    return {"model": "checkpoint" if args.checkpoint else args.model, "checkpoint": args.checkpoint,
            "image_size": predictor.image_size, "params_M": params / 1e6,
            "page_hw": [args.page_height, args.page_width], "pages": args.pages, "clicks": len(model_ms),
            "threads": args.threads, "first_prompt_ms": statistics.median(first_ms),
            "model_ms": statistics.median(model_ms), "handler_ms": statistics.median(handler_ms),
            "round_trip_ms": statistics.median(trip_ms),
            "handler_p90_ms": float(np.percentile(handler_ms, 90)),
            "meets_target": statistics.median(handler_ms) <= TARGET_MS, "target_ms": TARGET_MS,
            "load_average": list(os.getloadavg())}


def table(results: list[dict]) -> str:
    lines = ["| model | input px | page | clicks | first prompt ms (embeds) | model ms / click | handler ms / click "
             "| handler p90 | round trip ms / click | load avg (1, 5, 15 min) |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        lines.append(f"| {r['model']} | {r['image_size']} | {r['page_hw'][0]}x{r['page_hw'][1]} | {r['clicks']} | "
                     f"{r['first_prompt_ms']:.0f} | {r['model_ms']:.1f} | {r['handler_ms']:.1f} | "
                     f"{r['handler_p90_ms']:.1f} | {r['round_trip_ms']:.1f} | "
                     f"{' '.join(f'{v:.2f}' for v in r['load_average'])} |")
    lines += ["", "Medians over the clicks after each page's first prompt; "
              f"target <= {TARGET_MS:.0f} ms handler time per click: " +
              ", ".join(f"{r['model']} {'met' if r['meets_target'] else 'NOT met'}" for r in results) + "."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", nargs="?", help="a stage=finetune .ckpt or a from_pretrained folder "
                                                 "(default: random init of --model)")
    p.add_argument("--model", default="tiny", choices=["tiny", "base"],
                   help="configs/model/<name>.yaml for random init")
    p.add_argument("--pages", type=int, default=3, help="pages in the store (default 3)")
    p.add_argument("--clicks", type=int, default=10, help="clicks per page after its first prompt (default 10)")
    p.add_argument("--page-height", type=int, default=1100)
    p.add_argument("--page-width", type=int, default=850)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the markdown table")
    args = p.parse_args(argv)
    if args.pages < 1 or args.clicks < 1:
        p.error("--pages and --clicks must be >= 1")
    result = run(args)
    print(json.dumps(result, indent=2) if args.json else table([result]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
