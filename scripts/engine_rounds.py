"""Does the data engine reduce the clicks per mask, round over round? (SAM's data-engine measure)

    python scripts/engine_rounds.py --checkpoint /path/to/finetune/last.ckpt --data /tmp/engine_rounds \
        --rounds 3 --pages-per-round 6 --heldout-pages 8 --steps 200 --json engine_rounds.json \
        --plot docs/img/engine_rounds.png

"The user's documents" are synthetic pages from a seed the model never trained on, all scanned
badly (`--degrade 1.0`; the fine-tuning recipe degraded 30% of its pages). A new store gets
(rounds + 1) x pages-per-round train pages and `--heldout-pages` held-out pages whose ground-truth
masks are saved as their accepted annotations. Then, for each model m_0 (the checkpoint) .. m_R:

  1. clicks on FIXED pages: the simulated annotator (dociq.engine.simulate) works through every
     held-out question with m_r, nothing saved — the same targets every round, so the numbers are
     comparable (the held-out mIoU is its 0-click IoU);
  2. annotation: the annotator works through batch r of the train pages with m_r and saves the
     accepted masks with their clicks (SAM's measure: clicks on the pages being annotated);
  3. (r < R) retrain: dociq.engine.retrain.run_round on everything accepted so far, mixed with
     synthetic pages; the new model is promoted only if held-out mIoU does not drop.

Prints a table, writes the rows as JSON (--json) and a figure (--plot).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from dociq.data.synthetic.generator import generate_page
from dociq.engine.retrain import HELDOUT_SPLIT, TRAIN_SPLIT, run_round
from dociq.engine.simulate import IOU_TARGET, MAX_CLICKS, annotate_page, save_ground_truth, summarise
from dociq.engine.store import EngineStore


def build_store(data: Path, checkpoint: Path, n_train: int, n_heldout: int, seed: int, image_size: int,
                degrade: float):
    store = EngineStore(data, create=True)
    if store.pages():
        raise SystemExit(f"--data {data} already holds an engine store with pages: give a new folder")
    train, heldout = {}, {}
    for i in range(n_train + n_heldout):
        page = generate_page(i, seed=seed, image_size=image_size, degrade=degrade)
        split = TRAIN_SPLIT if i < n_train else HELDOUT_SPLIT
        pid = store.add_page(page.image, page.words, page.word_boxes, f"synthetic-{seed}-{i}", split=split)
        (train if split == TRAIN_SPLIT else heldout)[pid] = page
    for pid, page in heldout.items():
        save_ground_truth(store, pid, page)
    store.set_checkpoint(checkpoint)
    return store, train, heldout


def simulate(predictor, store, pages: dict, save: bool) -> list:
    out = []
    for pid, page in pages.items():
        out += annotate_page(predictor, store, pid, page, save=save)
    return out


def fmt(v, spec=".2f", scale=1.0):
    return "-" if v is None else format(v * scale, spec)


def print_table(rows: list[dict]) -> None:
    head = ("| model | pages annotated | masks | clicks/mask | clicks to IoU .75 | drawn | held-out clicks/mask "
            "| held-out clicks to .75 | held-out mIoU | retrain: steps, mIoU old -> new | promoted |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        rt = r.get("retrain")
        retrain = "-" if rt is None else f"{rt['steps']}, {100 * rt['miou_old']:.1f} -> {100 * rt['miou_new']:.1f}"
        promoted = "-" if rt is None else ("yes" if rt["promoted"] else "REFUSED")
        h = r["heldout"]
        print(f"| m{r['model']} | {r['pages_annotated']} | {r['masks']} | {fmt(r['clicks_per_mask'])} | "
              f"{fmt(r['noc@75'])} | {fmt(r['drawn_fraction'], '.0f', 100)}% | {fmt(h['clicks_per_mask'])} | "
              f"{fmt(h['noc@75'])} | {fmt(h['first_iou'], '.1f', 100)} | {retrain} | {promoted} |")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["model"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    a.plot(x, [r["clicks_per_mask"] for r in rows], "o-", label="pages being annotated")
    a.plot(x, [r["heldout"]["clicks_per_mask"] for r in rows], "s--", label="fixed held-out pages")
    a.plot(x, [r["noc@75"] for r in rows], "o:", color="C0", alpha=0.6, label="annotated, to IoU 0.75")
    a.plot(x, [r["heldout"]["noc@75"] for r in rows], "s:", color="C1", alpha=0.6, label="held-out, to IoU 0.75")
    a.set_xlabel("model (m0 = starting checkpoint, m_r = after r rounds)")
    a.set_ylabel(f"clicks per mask (to IoU {IOU_TARGET}, max {MAX_CLICKS})")
    a.set_xticks(x)
    a.set_ylim(0, MAX_CLICKS)
    a.legend(fontsize=8)
    b.plot(x, [100 * r["heldout"]["first_iou"] for r in rows], "o-", color="C2")
    values = [100 * r["heldout"]["first_iou"] for r in rows]
    for xi, v in zip(x, values):
        b.annotate(f"{v:.1f}", (xi, v), fontsize=8, xytext=(0, 6), textcoords="offset points", ha="center")
    mid = (max(values) + min(values)) / 2   # at least 6 points of axis: small changes look small
    half = max(3.0, (max(values) - min(values)) / 2 + 1.0)
    b.set_ylim(mid - half, mid + half)
    b.set_xlabel("model")
    b.set_ylabel("held-out mIoU x100 (question only)")
    b.set_xticks(x)
    for r in rows:   # each round's candidate, kept or refused
        rt = r.get("retrain")
        if rt is not None:
            kept = rt["promoted"]
            b.plot([r["model"] + 1], [100 * rt["miou_new"]], "x", color="C2" if kept else "C3", ms=8)
            if not kept:
                b.annotate("refused", (r["model"] + 1, 100 * rt["miou_new"]), fontsize=8, color="C3",
                           xytext=(4, -10), textcoords="offset points")
    fig.suptitle("data engine rounds (simulated annotator)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", type=Path, help="stage=finetune checkpoint to start from (required)")
    p.add_argument("--data", type=Path, help="a new folder for the engine store (required)")
    p.add_argument("--rounds", type=int, default=3, help="retrain rounds (models m0..m_rounds are measured)")
    p.add_argument("--pages-per-round", type=int, default=6)
    p.add_argument("--heldout-pages", type=int, default=8)
    p.add_argument("--steps", type=int, default=200, help="optimizer steps per round")
    p.add_argument("--synthetic-fraction", type=float, default=0.5)
    p.add_argument("--lr", type=float, default=None, help="peak learning rate of a round (default: run_round's)")
    p.add_argument("--seed", type=int, default=4242, help="synthetic seed of the user's pages (unseen)")
    p.add_argument("--degrade", type=float, default=1.0, help="share of the user's pages scanned badly")
    p.add_argument("--image-size", type=int, default=256)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--plot", type=Path, default=None)
    p.add_argument("--replot", type=Path, default=None,
                   help="only redraw --plot from the JSON of an earlier run (no model work)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for each round's train.py")
    args = p.parse_args(argv)
    if args.replot:
        rows = json.loads(args.replot.read_text())["rows"]
        print_table(rows)
        if args.plot:
            plot(rows, args.plot)
        return 0

    if args.checkpoint is None or args.data is None:
        p.error("--checkpoint and --data are required (unless --replot)")
    from dociq.inference.predictor import Predictor

    start = time.time()
    n_train = (args.rounds + 1) * args.pages_per_round
    store, train, heldout = build_store(args.data, args.checkpoint.resolve(), n_train, args.heldout_pages,
                                        args.seed, args.image_size, args.degrade)
    batches = [dict(list(train.items())[r * args.pages_per_round:(r + 1) * args.pages_per_round])
               for r in range(args.rounds + 1)]
    rows = []
    for r in range(args.rounds + 1):
        t0 = time.time()
        predictor = Predictor.from_checkpoint(store.checkpoint())
        fixed = summarise(simulate(predictor, store, heldout, save=False))
        annotated = summarise(simulate(predictor, store, batches[r], save=True))
        row = {"model": r, "checkpoint": str(store.checkpoint()), "pages_annotated": len(batches[r]),
               **annotated, "heldout": fixed, "annotate_seconds": time.time() - t0, "retrain": None}
        del predictor
        if r < args.rounds:
            kwargs = {} if args.lr is None else {"lr": args.lr}
            result = run_round(store, steps=args.steps, synthetic_fraction=args.synthetic_fraction,
                               overrides=args.overrides, **kwargs)
            row["retrain"] = result.to_json()
        rows.append(row)
        print(f"[engine_rounds] model m{r}: {json.dumps({k: v for k, v in row.items() if k != 'retrain'})}",
              flush=True)
        if row["retrain"]:
            rt = row["retrain"]
            print(f"[engine_rounds] round {rt['round']}: mIoU {rt['miou_old']:.4f} -> {rt['miou_new']:.4f} "
                  f"{rt['status']} (train {rt['train_seconds']:.0f} s, {rt['train_annotations']} annotations)",
                  flush=True)
    total = time.time() - start
    print()
    print_table(rows)
    print(f"\ntotal {total / 60:.1f} min; store {args.data}")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows,
                                         "total_seconds": total}, indent=1))
    if args.plot:
        plot(rows, args.plot)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
