"""Curves of scripts/objectives_study_gpu.sh's runs: the unit-class probe of the online encoder and
D-JEPA / I-JEPA's `unexplained` (training and held-out) against the step, one line per run, and the
same curves as JSON.

    python scripts/plot_objectives.py outputs/objectives --out docs/img/objectives_h200.png \
        --json docs/gpu/objectives_h200.json

A run folder written by two runs (a metrics.csv appended to) keeps only the rows of the last one:
those after its last step-0 probe.
"""
from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

KEYS = ("val/probe_bacc", "val/probe_bacc_target", "train/unexplained", "val/unexplained", "val/pred_std",
        "val/target_std", "val/mim", "val/mlm_acc", "train/device/batches_per_sec")


def last_run_rows(metrics: Path) -> list[dict]:
    rows = list(csv.DictReader(open(metrics)))
    starts = [i for i, r in enumerate(rows) if r.get("val/probe_bacc") and r["step"] == "0"]
    return rows[starts[-1]:] if starts else rows


def curves(rows: list[dict]) -> dict[str, list[list[float]]]:
    out = {}
    for key in KEYS:
        points = [[int(r["step"]), round(float(r[key]), 4)] for r in rows if r.get(key)]
        if points:
            out[key] = points
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("work", type=Path, help="the study's WORK folder (one <arm>_s<seed>/ per run)")
    ap.add_argument("--out", type=Path, required=True, help="the figure (.png)")
    ap.add_argument("--json", type=Path, default=None, help="also write the curves here")
    args = ap.parse_args(argv)
    runs = {p.parents[1].name: curves(last_run_rows(p)) for p in sorted(args.work.glob("*_s*/csv/metrics.csv"))}
    if not runs:
        raise SystemExit(f"no <arm>_s<seed>/csv/metrics.csv under {args.work}: pass the study's WORK folder")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    arms = sorted({run.rsplit("_s", 1)[0] for run in runs})
    colours = {arm: plt.get_cmap("tab10")(i % 10) for i, arm in enumerate(arms)}   # one per arm, variants too
    for run, c in runs.items():
        arm, seed = run.rsplit("_s", 1)
        style = dict(color=colours[arm], linestyle="-" if seed == "0" else "--", marker="o", ms=3)
        if "val/probe_bacc" in c:
            axes[0].plot(*zip(*c["val/probe_bacc"]), label=run, **style)
        for key, width in (("val/unexplained", 1.5), ("train/unexplained", 0.7)):
            points = [p for p in c.get(key, []) if p[0] > 0]
            if points:
                axes[1].plot(*zip(*points), color=style["color"], linestyle=style["linestyle"], lw=width,
                             label=f"{run} {key.split('/')[0]}")
    axes[0].set(xlabel="step", ylabel="balanced accuracy", title="unit-class probe, online encoder")
    axes[1].axhline(1.0, color="black", lw=0.8)
    axes[1].set_ylim(0.8, 2.0)
    axes[1].set(xlabel="step", ylabel="MSE / across-page variance",
                title="unexplained (thick: held-out, thin: training)")
    axes[0].legend(fontsize=7)
    axes[1].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1) + "\n")
    print(f"wrote {args.out}" + (f" and {args.json}" if args.json else ""))
    return runs


if __name__ == "__main__":
    main()
