"""Write synthetic document pages to disk as a COCO-format data set.

    python scripts/make_synthetic.py --out data/synthetic --pages 1000 --seed 0 [--image-size 512]

Writes DIR/annotations.json and DIR/images/*.png (words, questions, links and region text in
dociq's extra fields). `CocoDocuments(DIR/annotations.json)` reads back the same pages that
`SyntheticDocuments(pages, image_size, seed)` yields.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from dociq.data.datasets.coco import write_coco
from dociq.data.synthetic.generator import SyntheticDocuments


def parse_size(text: str) -> int | tuple[int, int]:
    """'512' -> 512 (square); '640x480' -> (640, 480) as H x W."""
    try:
        if "x" in text.lower():
            h, w = text.lower().split("x")
            return int(h), int(w)
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--image-size {text!r}: use P (square) or HxW, e.g. 512 or 640x480")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path, help="output folder (created)")
    p.add_argument("--pages", required=True, type=int, help="number of pages")
    p.add_argument("--seed", type=int, default=0, help="data set seed (page i depends on (seed, i) only)")
    p.add_argument("--image-size", type=parse_size, default=512, help="P (square) or HxW, default 512")
    p.add_argument("--degrade", type=float, default=0.0, help="probability of scan degradations per page")
    p.add_argument("--questions-per-page", type=int, default=8)
    return p


def main(argv: list[str] | None = None) -> Path:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        dataset = SyntheticDocuments(args.pages, args.image_size, args.seed, degrade=args.degrade,
                                     questions_per_page=args.questions_per_page)
    except ValueError as err:  # name the flag, not the Python argument
        parser.error(str(err).replace("image_size", "--image-size").replace("num_pages", "--pages"))
    start = time.perf_counter()
    path = write_coco((dataset[i] for i in range(len(dataset))), args.out)
    seconds = time.perf_counter() - start
    print(f"wrote {len(dataset)} pages to {path} in {seconds:.1f} s ({len(dataset) / max(seconds, 1e-9):.1f} pages/s)")
    return path


if __name__ == "__main__":
    main(sys.argv[1:])
