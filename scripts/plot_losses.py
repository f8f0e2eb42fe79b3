"""Plot the loss curves of a run from its CSV log (Lightning CSVLogger's metrics.csv).

    python scripts/plot_losses.py                                  # newest run under outputs/
    python scripts/plot_losses.py outputs/pretrain/runs/<run>      # a run dir (or its metrics.csv)
    python scripts/plot_losses.py RUN --out docs/img/pretrain_losses.png   # for the docs: explicit

The figure goes to <run dir>/losses.png unless --out is given (never into docs/ by default).
The stage is read from the columns:
- pretraining: one panel per loss (D-JEPA, MLM, MIM, total) and MLM accuracy: training steps as a
  thin line plus a smoothed line, validation as markers; then the collapse signals (std across pages
  of the target, predicted and — with task.reg on — online context features) and, when the run
  logged it, the image encoder's unit-class probe (online and EMA target, callbacks.unit_probe);
- fine-tuning (val/miou logged): the losses (focal, dice, IoU head, word grounding, total), then
  validation mIoU per prompt set (question: val/miou, box: val/box_miou, ...) and per region kind.
Prints a first/last table of every loss (and mIoU).
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LOSSES = (("djepa", "D-JEPA (smooth-L1)"), ("jepa", "I-JEPA (smooth-L1)"), ("mlm", "MLM (cross-entropy)"),
          ("mim", "MIM (pixel MSE)"), ("loss", "total (weighted)"),
          ("unexplained", "JEPA MSE / target variance"), ("mlm_acc", "MLM accuracy (masked words)"))
COLLAPSE = (("target_std", "target feature std"), ("pred_std", "predicted feature std"),
            ("content_std", "online content std"))
FINETUNE_LOSSES = (("focal", "focal"), ("dice_loss", "dice"), ("iou_mse", "IoU head (MSE)"),
                   ("word_bce", "word grounding (BCE)"), ("loss", "total (weighted, all rounds)"))


def detect_stage(series: dict) -> str:
    """"finetune" when the log has the segmentation metrics, else "pretrain" (any encoder stage)."""
    keys = set(series)
    return "finetune" if "val/miou" in keys or {"train/focal", "train/dice_loss"} & keys else "pretrain"


def miou_columns(series: dict) -> tuple[list[str], list[str]]:
    """(per prompt set: val/miou, val/box_miou, ...; per region kind: val/miou_<kind>)."""
    sets = sorted((k for k in series if k == "val/miou" or (k.startswith("val/") and k.endswith("_miou"))),
                  key=lambda k: (k != "val/miou", k))
    kinds = sorted(k for k in series if k.startswith("val/miou_"))
    return sets, kinds


def find_metrics(path: Path | None, root: Path = Path("outputs")) -> Path:
    """metrics.csv of `path` (a file, a run dir, or the newest run of any stage under `root`)."""
    if path is None:
        runs = sorted(root.glob("*/runs/*/csv/metrics.csv"), key=lambda p: p.stat().st_mtime)
        if not runs:
            raise FileNotFoundError(f"no {root}/<stage>/runs/*/csv/metrics.csv: run "
                                    "`python train.py stage=pretrain` first, or pass a CSV path")
        return runs[-1]
    if path.is_dir():
        found = sorted(path.glob("**/metrics.csv"))
        if not found:
            raise FileNotFoundError(f"no metrics.csv under {path}: give the run dir of a logger=csv run")
        return found[0]
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: give a metrics.csv or a run dir")
    return path


def read_series(csv_path: Path) -> dict[str, tuple[list[int], list[float]]]:
    """column -> (steps, values), skipping empty cells (CSVLogger writes sparse rows)."""
    series: dict[str, tuple[list[int], list[float]]] = {}
    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None or "step" not in reader.fieldnames:
            raise ValueError(f"{csv_path} has no `step` column: is it a Lightning CSVLogger metrics.csv?")
        for row in reader:
            step = int(float(row["step"]))
            for key, value in row.items():
                if key in ("step", "epoch") or value in ("", None):
                    continue
                steps, values = series.setdefault(key, ([], []))
                steps.append(step)
                values.append(float(value))
    return series


def run_dir(csv_path: Path) -> Path:
    """The run folder of a metrics.csv (<run>/csv/metrics.csv), or the CSV's own folder."""
    return csv_path.parent.parent if csv_path.parent.name == "csv" else csv_path.parent


def smooth(values: list[float], weight: float = 0.8) -> list[float]:
    """Exponential moving average; short series (a few logged points) are left as they are,
    where an average would mostly show its own lag."""
    if len(values) < 20:
        return list(values)
    out, last = [], None
    for v in values:
        last = v if last is None else weight * last + (1 - weight) * v
        out.append(last)
    return out


def _curves(ax, series: dict, name: str) -> None:
    if f"train/{name}" in series:
        steps, values = series[f"train/{name}"]
        ax.plot(steps, values, color="tab:blue", alpha=0.25, lw=1, marker="." if len(values) < 20 else None)
        ax.plot(steps, smooth(values), color="tab:blue", lw=1.8, label="train")
    if f"val/{name}" in series:
        steps, values = series[f"val/{name}"]
        ax.plot(steps, values, "o-", color="tab:orange", ms=4, lw=1.2, label="val")


def _collapse_panel(ax, series: dict) -> None:
    for (name, label), color in zip(COLLAPSE, ("tab:green", "tab:red", "tab:purple")):
        if f"train/{name}" in series:
            steps, values = series[f"train/{name}"]
            ax.plot(steps, smooth(values), color=color, lw=1.5, label=label,
                    marker="." if len(values) < 20 else None)
    ax.set_title("collapse signals", fontsize=10)
    ax.set_ylim(bottom=0)


def _probe_panel(ax, series: dict) -> None:
    for key, label, color in (("val/probe_bacc", "online encoder", "tab:blue"),
                              ("val/probe_bacc_target", "EMA target", "tab:orange")):
        if key in series:
            steps, values = series[key]
            ax.plot(steps, values, "o-", color=color, ms=4, lw=1.2, label=label)
    ax.set_title("unit-class probe (balanced acc.)", fontsize=10)


def _miou_panel(ax, series: dict, keys: list[str], title: str) -> None:
    for key in keys:
        steps, values = series[key]
        main = key == "val/miou"
        ax.plot(steps, values, "o-", ms=4 if main else 3, lw=2.0 if main else 1.0,
                label=key.removeprefix("val/") + (" (monitored)" if main else ""))
    ax.set_title(title, fontsize=10)
    ax.set_ylim(0, 1)


def plot(series: dict, out: Path, title: str) -> list[str]:
    """Draw the figure for the run's stage into `out`; returns the panel titles."""
    stage = detect_stage(series)
    losses = FINETUNE_LOSSES if stage == "finetune" else LOSSES
    panels = [(name, label) for name, label in losses if f"train/{name}" in series or f"val/{name}" in series]
    if not panels:
        raise ValueError(f"no train/<loss> or val/<loss> columns among {sorted(series)}")
    extra = []   # (drawer, arguments) of the panels after the losses
    if stage == "finetune":
        sets, kinds = miou_columns(series)
        if sets:
            extra.append((_miou_panel, (sets, "val mIoU per prompt set")))
        if kinds:
            extra.append((_miou_panel, (kinds, "val mIoU per region kind (question prompts)")))
    else:
        extra.append((_collapse_panel, ()))
        if "val/probe_bacc" in series:
            extra.append((_probe_panel, ()))
    ncols = len(panels) + len(extra)
    fig, axes = plt.subplots(1, ncols, figsize=(3.6 * ncols, 3.2), squeeze=False)
    axes = list(axes[0])
    for ax, (name, label) in zip(axes, panels):
        _curves(ax, series, name)
        ax.set_title(label, fontsize=10)
    axes[0].legend(fontsize=8)
    for ax, (draw, args) in zip(axes[len(panels):], extra):
        draw(ax, series, *args)
        ax.legend(fontsize=7)
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.suptitle(f"{title} ({stage})", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return [ax.get_title() for ax in axes]


def summary(series: dict) -> list[tuple[str, float, float, int]]:
    names = [name for name, _ in (*LOSSES, *FINETUNE_LOSSES)]
    keys = [f"{split}/{name}" for name in dict.fromkeys(names) for split in ("train", "val")]
    keys += miou_columns(series)[0]
    rows = []
    for key in keys:
        if key in series and series[key][1]:
            steps, values = series[key]
            rows.append((key, values[0], values[-1], steps[-1]))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", nargs="?", type=Path, help="metrics.csv or a run dir (default: newest run)")
    parser.add_argument("--out", type=Path, default=None,
                        help="the PNG to write (default: <run dir>/losses.png; docs figures: docs/img/...)")
    args = parser.parse_args(argv)
    try:
        csv_path = find_metrics(args.path)
        series = read_series(csv_path)
        args.out = args.out or run_dir(csv_path) / "losses.png"
        plot(series, args.out, title=str(run_dir(csv_path).name))
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{'metric':<18} {'first':>9} {'last':>9} {'at step':>8}")
    for key, first, last, step in summary(series):
        print(f"{key:<18} {first:>9.4f} {last:>9.4f} {step:>8d}" if math.isfinite(last) else key)
    print(f"wrote {args.out} from {csv_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
