"""Evidence that pretraining helps promptable segmentation (issue 6).

Fine-tunes `stage=finetune` with the same budget from several starting points and reports the
held-out synthetic validation split's mIoU (overall and per question kind):

  random   random initialisation
  ijepa+mlm  image encoder from `stage=ijepa`, text encoder from `stage=mlm`
  pretrain   the D-JEPA document model from `stage=pretrain` (optim=adamw and optim=sngd)
  layout-only  the pretrain init with the OCR words removed in training and evaluation

Checkpoints of the earlier stages can be given (--pretrain-ckpt, --ijepa-ckpt, --mlm-ckpt);
otherwise the script runs those stages itself with --pretrain-steps / --encoder-steps.
Every run goes through `dociq.training.train.train(dociq.training.config.compose([...]))`, i.e. exactly what
`python train.py <overrides>` does; outputs land in --workdir.

    python scripts/eval_segment.py --json outputs/eval_segment.json \
        --finetune-steps 150 --pretrain-steps 150 --encoder-steps 150 --batch-size 4

Prints a table and writes {"runs": [{"init", "optim", "ocr", "miou", "dice", "miou_by_kind",
"steps", "output_dir"}], "settings": {...}} to --json.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

RUNS = ("random", "ijepa+mlm", "pretrain", "pretrain-sngd", "layout-only")
KINDS = ("layout", "reading", "cell", "link", "category")


def common_overrides(args, stage: str, steps: int, out: Path) -> list[str]:
    return [f"stage={stage}", f"trainer.max_steps={steps}", f"trainer.val_check_interval={steps}",
            f"optim.scheduler.warmup_steps={min(10, max(1, steps // 10))}",
            f"data.batch_size={args.batch_size}", f"data.num_workers={args.num_workers}",
            f"data.val_set.num_pages={args.val_pages}", "trainer.limit_val_batches=1.0",
            "trainer.enable_progress_bar=false", f"seed={args.seed}",
            f"paths.output_dir={out}", *args.override]


def run_stage(overrides: list[str]) -> tuple[dict[str, float], Path]:
    from dociq.training.config import compose
    from dociq.training.train import train

    cfg = compose(overrides)
    t0 = time.time()
    metrics = train(cfg)
    metrics["seconds"] = time.time() - t0
    return metrics, Path(cfg.paths.output_dir)


def pretrained(args, stage: str, given: str | None, steps: int) -> str:
    """A checkpoint of `stage`: the given one, or a fresh run of `steps` steps."""
    if given:
        if not Path(given).is_file():
            raise FileNotFoundError(f"--{stage}-ckpt {given} does not exist")
        return given
    out = args.workdir / stage
    ckpt = out / "checkpoints" / "last.ckpt"
    if ckpt.is_file() and not args.rerun:
        print(f"[eval_segment] reusing {ckpt} (pass --rerun to train it again)")
        return str(ckpt)
    print(f"[eval_segment] training stage={stage} for {steps} steps -> {out}")
    run_stage(common_overrides(args, stage, steps, out))
    return str(ckpt)


def finetune(args, name: str, init: list[str], optim: str, ocr: bool) -> dict:
    out = args.workdir / f"finetune-{name}"
    overrides = common_overrides(args, "finetune", args.finetune_steps, out) + init + [
        f"optim={optim}", f"task.ocr={str(ocr).lower()}", *args.finetune_override]
    print(f"[eval_segment] finetune {name}: {' '.join(overrides)}")
    metrics, _ = run_stage(overrides)
    by_kind = {k: metrics[f"val/miou_{k}"] for k in KINDS if f"val/miou_{k}" in metrics}
    return {"run": name, "init": name.replace("-sngd", "").replace("layout-only", "pretrain"),
            "optim": optim, "ocr": ocr, "miou": metrics.get("val/miou"), "dice": metrics.get("val/dice"),
            "miou_by_kind": by_kind, "steps": args.finetune_steps, "seconds": round(metrics["seconds"]),
            "output_dir": str(out)}


def table(runs: list[dict]) -> str:
    kinds = [k for k in KINDS if any(k in r["miou_by_kind"] for r in runs)]
    head = f"| run | init | optim | OCR | mIoU | " + " | ".join(f"mIoU {k}" for k in kinds) + " |"
    lines = [head, "|" + "---|" * (5 + len(kinds))]
    pct = lambda v: "-" if v is None else f"{100 * v:.1f}"  # noqa: E731
    for r in runs:
        lines.append(f"| {r['run']} | {r['init']} | {r['optim']} | {'yes' if r['ocr'] else 'no'} | "
                     f"{pct(r['miou'])} | " + " | ".join(pct(r["miou_by_kind"].get(k)) for k in kinds) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, required=True, help="where to write the results")
    p.add_argument("--workdir", type=Path, default=Path("outputs/eval_segment"))
    p.add_argument("--runs", nargs="+", default=list(RUNS), choices=RUNS)
    p.add_argument("--finetune-steps", type=int, default=150)
    p.add_argument("--pretrain-steps", type=int, default=150, help="stage=pretrain steps when --pretrain-ckpt is not given")
    p.add_argument("--encoder-steps", type=int, default=150, help="stage=ijepa and stage=mlm steps each")
    p.add_argument("--pretrain-ckpt")
    p.add_argument("--ijepa-ckpt")
    p.add_argument("--mlm-ckpt")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--val-pages", type=int, default=48, help="held-out synthetic pages (val_set seed)")
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave torch's default)")
    p.add_argument("--rerun", action="store_true", help="retrain stages whose checkpoints exist in --workdir")
    p.add_argument("--override", action="append", default=[],
                   help="extra Hydra override for every run of every stage, e.g. --override model.fusion.depth=1")
    p.add_argument("--finetune-override", action="append", default=[],
                   help="extra Hydra override for the fine-tuning runs, e.g. --finetune-override task.rounds=1")
    args = p.parse_args(argv)
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    args.workdir = args.workdir.resolve()

    results: list[dict] = []

    def save() -> None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        args.json.write_text(json.dumps({"runs": results, "settings": settings}, indent=2))

    need_pretrain = any(r in args.runs for r in ("pretrain", "pretrain-sngd", "layout-only"))
    pretrain_ckpt = pretrained(args, "pretrain", args.pretrain_ckpt, args.pretrain_steps) if need_pretrain else None
    for name in args.runs:
        if name == "random":
            init = []
        elif name == "ijepa+mlm":
            init = [f"init.image_encoder={pretrained(args, 'ijepa', args.ijepa_ckpt, args.encoder_steps)}",
                    f"init.text_encoder={pretrained(args, 'mlm', args.mlm_ckpt, args.encoder_steps)}"]
        else:
            init = [f"init.from={pretrain_ckpt}"]
        optim = "sngd" if name == "pretrain-sngd" else "adamw"
        results.append(finetune(args, name, init, optim, ocr=name != "layout-only"))
        save()   # after every run: a crash keeps what was measured
        print(table(results), flush=True)
    print("\n" + table(results))
    return {"runs": results}


if __name__ == "__main__":
    main()
