"""Learning curves of `stage=finetune` runs from their CSV logs: validation mIoU per question kind
against training steps and against wall-clock minutes (one line style per run, e.g. per seed).

    python scripts/plot_learning_curves.py outputs/finetune/runs/<run> [<run2> ...] --out curves.png
    python scripts/plot_learning_curves.py RUN --label "seed 0" RUN2 --label "seed 1"   (labels in order)

Panels: question mIoU (overall and per kind: layout, reading, cell, link) by step, the same by
wall-clock (`val/wall_min`, logged by FinetuneTask), box-prompt mIoU (`val/box_miou`) by step, and
single-click mIoU (`val/point_miou`) by step when the runs logged it.
Prints the last validation row of each run.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from plot_losses import find_metrics, read_series  # noqa: E402  (a sibling: `python scripts/...` puts scripts/ on sys.path)

KINDS = (("miou", "all", "black"), ("miou_layout", "layout", "tab:blue"), ("miou_reading", "reading", "tab:orange"),
         ("miou_cell", "cell", "tab:green"), ("miou_link", "link", "tab:red"))
STYLES = ("-", "--", ":", "-.")


def curves(series: dict, prefix: str = "val/") -> dict[str, tuple[list[int], list[float]]]:
    return {key: series[f"{prefix}{key}"] for key, _, _ in KINDS if f"{prefix}{key}" in series}


def wall_minutes(series: dict, steps: list[int]) -> list[float] | None:
    """Minutes since fit start at each validation step, or None when the run did not log them."""
    if "val/wall_min" not in series:
        return None
    by_step = dict(zip(*series["val/wall_min"]))
    return [by_step.get(s, float("nan")) for s in steps]


def plot(runs: list[tuple[str, dict]], out: Path) -> None:
    clicks = any("val/point_miou" in series for _, series in runs)
    fig, axes = plt.subplots(1, 4 if clicks else 3, figsize=(20 if clicks else 15, 4.2))
    for (label, series), style in zip(runs, STYLES * 4):
        question = curves(series)
        if not question:
            raise ValueError(f"run {label!r} has no val/miou columns: is it a stage=finetune run?")
        for key, name, color in KINDS:
            if key not in question:
                continue
            steps, values = question[key]
            values = [100 * v for v in values]
            axes[0].plot(steps, values, style, color=color, marker="o", ms=3, label=f"{name} ({label})")
            minutes = wall_minutes(series, steps)
            if minutes is not None:
                axes[1].plot(minutes, values, style, color=color, marker="o", ms=3)
            for panel, name in ((2, "box"), (3, "point")):
                other = series.get(f"val/{name}_{key}")
                if other is not None and panel < len(axes):
                    axes[panel].plot(other[0], [100 * v for v in other[1]], style, color=color, marker="o", ms=3)
    titles = ("question prompts: val mIoU by step", "question prompts: val mIoU by wall-clock",
              "box prompts: val mIoU by step", "one click (target: a region of the answer): val mIoU by step")
    for ax, title, xlabel in zip(axes, titles, ("step", "minutes of fine-tuning", "step", "step")):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("mIoU (x100)")
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="finetune run dirs or their metrics.csv")
    parser.add_argument("--label", action="append", default=[], help="a name per run, in order")
    parser.add_argument("--out", type=Path, default=Path("learning_curves.png"))
    args = parser.parse_args(argv)
    labels = args.label + [p.name for p in args.runs[len(args.label):]]
    try:
        runs = [(label, read_series(find_metrics(path))) for label, path in zip(labels, args.runs)]
        plot(runs, args.out)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for label, series in runs:
        last = {name: f"{100 * curves(series)[key][1][-1]:.1f}" for key, name, _ in KINDS if key in curves(series)}
        step = curves(series)["miou"][0][-1]
        print(f"{label}: step {step}, question mIoU {last}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
