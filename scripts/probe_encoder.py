"""Linear probe of image encoders on per-unit region classes (dociq/training/probe.py), one row per encoder.

    python scripts/probe_encoder.py random outputs/ijepa/runs/<run>/checkpoints/last.ckpt \
        outputs/pretrain/runs/<run>/checkpoints/last.ckpt:target

Each argument is `random` or `random:SEED` (a fresh tiny Hiera, seed 0 or SEED) or a checkpoint of any stage, optionally
suffixed `:target` to probe the EMA target encoder (`target_encoder.*`) instead of the online one.
Pages: --train-pages from the training generator seed, --test-pages from the held-out seed; with
--corpus DIR real pages instead: --train-pages of its train split, --test-pages of its held-out val split
(spread over documents), their weak region labels as the classes.
Prints a Markdown table; --json writes the rows.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def load_encoder(spec: str, size: str, image_size: int):
    from dociq.models.document_model import image_encoder_from_config
    from dociq.models.image_encoder import load_image_encoder_from_checkpoint
    from dociq.models.sizes import complete_model_config
    from dociq.training.tasks.pretrain import state_under

    name, _, seed = spec.partition(":")
    torch.manual_seed(int(seed) if name == "random" and seed else 0)
    encoder = image_encoder_from_config(complete_model_config({"size": size, "image_size": image_size}))
    if name == "random":
        return encoder
    path, _, part = spec.partition(":")
    if part not in ("", "target"):
        raise ValueError(f"{spec}: the suffix after ':' must be 'target' (the EMA target encoder)")
    if part == "target":
        weights = state_under(path, "target_encoder.")
        if not weights:
            raise KeyError(f"{path} has no target_encoder.* weights (only ijepa/pretrain checkpoints do)")
    else:
        weights = load_image_encoder_from_checkpoint(path)
    encoder.load_encoder_state_dict(weights, source=path)
    return encoder


def main(argv: list[str] | None = None) -> list[dict]:
    from dociq.data.synthetic.generator import SyntheticDocuments
    from dociq.training.probe import probe_encoder

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("encoders", nargs="+", help="'random[:SEED]' or CKPT[:target]")
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--unit-px", type=int, default=32)
    parser.add_argument("--train-pages", type=int, default=192)
    parser.add_argument("--test-pages", type=int, default=64)
    parser.add_argument("--corpus", type=Path, help="a `dociq corpus build` folder: probe on its real pages")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    t0 = time.time()
    if args.corpus:
        from dociq.data.datasets.corpus.dataset import CorpusDocuments
        train = [p for p in CorpusDocuments(args.corpus, split="train", max_pages=args.train_pages)]
        test = [p for p in CorpusDocuments(args.corpus, split="val", max_pages=args.test_pages)]
    else:
        train = [p for p in SyntheticDocuments(args.train_pages, args.image_size, seed=0, degrade=0.3)]
        test = [p for p in SyntheticDocuments(args.test_pages, args.image_size, seed=1000003, degrade=0.3)]
    print(f"{len(train)} + {len(test)} pages read in {time.time() - t0:.0f} s")
    rows = []
    for spec in args.encoders:
        encoder = load_encoder(spec, args.size, args.image_size)
        r = probe_encoder(encoder, train, test, args.image_size, args.unit_px)
        rows.append({"encoder": spec, **vars(r)})
    print("\n| encoder | unit acc | balanced acc | position-only bal. acc | page_std | eff. rank | "
          "unexplained: unit mean / 8 neighbours |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['encoder']} | {r['accuracy']:.3f} | {r['balanced_accuracy']:.3f} | "
              f"{r['position_balanced_accuracy']:.3f} | {r['page_std']:.4f} | {r['effective_rank']:.1f} | "
              f"{r['unit_mean_unexplained']:.3f} / {r['neighbour_unexplained']:.3f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
