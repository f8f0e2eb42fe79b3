"""Can the JEPA predictor learn its targets when its context is perfect? A check of the predictor
alone, outside any training stage.

A frozen image encoder (a random tiny Hiera, or a checkpoint's online / EMA target encoder) encodes
real corpus pages once; its layer-normed unit tokens are the targets, as I-JEPA's are. The
predictor (`JEPAPredictor`, the model config's size) is trained on I-JEPA multi-block masks with
the *targets themselves* at the context units as its context — the best a context encoder could
give it — and scored by `unexplained` on held-out pages (MSE over the across-page variance; 1 =
each unit's mean page), beside the ridge regression from a unit's 8 neighbours
(`dociq.training.probe.neighbour_predictability`). `--target-norm page` takes each unit's mean
training page out of the targets, as `task.target_norm=page` does per batch.

    python scripts/predictor_oracle.py --corpus data/corpus_384 [--encoder CKPT[:target]] [--steps 2000]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_encoder import load_encoder  # noqa: E402  (a random or checkpointed encoder, as that script takes)


def masked_ridge(train: torch.Tensor, test: torch.Tensor, grid, masking, generator, ridge: float = 1e-2,
                 draws: int = 16) -> float:
    """`unexplained` on the test pages of a ridge regression that predicts a target unit's token
    (minus its unit's mean training page) from those of its 8 neighbours that are context units
    under `draws` draws of `masking` per page (a masked neighbour gives zeros and a flag): the linear,
    local counterpart of the predictor, with what the predictor is given."""
    from dociq.training.probe import neighbour_features, ridge_weights

    unit_mean = train.mean(0)

    def samples(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        p, n, _ = tokens.shape
        ctx_idx, tgt_idx = masking(p, generator)
        visible = torch.zeros(p, n, dtype=torch.bool).scatter_(1, ctx_idx, True)[..., None]
        features = neighbour_features(torch.cat([(tokens - unit_mean) * visible, visible.to(tokens)], -1), grid)
        units = tgt_idx.reshape(p, -1)
        pick = lambda t: t.gather(1, units[..., None].expand(-1, -1, t.shape[-1])).flatten(0, 1)
        return pick(features).double(), pick(tokens - unit_mean).double(), units.flatten()

    gram = moment = None
    for _ in range(draws):   # accumulated, so that many draws fit in memory
        x, y, _ = samples(train)
        gram = x.T @ x if gram is None else gram + x.T @ x
        moment = x.T @ y if moment is None else moment + x.T @ y
    weights = ridge_weights(gram, moment, ridge)
    unit_variance = test.double().var(0).mean(-1)
    errors, variances = [], []
    for _ in range(draws):
        x, y, units = samples(test)
        errors.append(((y - x @ weights) ** 2).mean())
        variances.append(unit_variance[units].mean())
    return float(torch.stack(errors).mean() / torch.stack(variances).mean())


def main(argv=None) -> dict:
    from dociq.data.datasets.corpus.dataset import CorpusDocuments
    from dociq.data.masking import MultiBlockMasking
    from dociq.models.common import build_part
    from dociq.models.jepa_predictor import JEPAPredictor
    from dociq.models.sizes import complete_model_config
    from dociq.training.probe import encode_pages, neighbour_predictability

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--encoder", default="random", help="'random[:SEED]' or CKPT[:target], as probe_encoder.py")
    ap.add_argument("--train-pages", type=int, default=1024)
    ap.add_argument("--test-pages", type=int, default=128)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--target-norm", choices=("layer", "page"), default="layer")
    ap.add_argument("--masking", choices=("blocks", "units"), default="blocks",
                    help="blocks: I-JEPA's multi-block masks (the stages'); units: 4 single units, the rest context")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--image-size", type=int, default=256,
                    help="the input side: 512 gives the tiny model a 16 x 16 grid of 32-px units")
    ap.add_argument("--predictor", default="", help="the predictor's size instead of the model config's, "
                    "e.g. 'dim=128,depth=4,num_heads=4,positions=rope'")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    t0 = time.time()
    size_overrides = {k: int(v) if v.isdigit() else v for k, v in (kv.split("=") for kv in args.predictor.split(",") if kv)}
    model = complete_model_config({"size": "tiny", "image_size": args.image_size, "predictor": size_overrides})
    size = int(model["image_size"])
    encoder = load_encoder(args.encoder, "tiny", size)
    pages = {split: list(CorpusDocuments(args.corpus, split=split, max_pages=n))
             for split, n in (("train", args.train_pages), ("val", args.test_pages))}
    tokens = {split: encode_pages(encoder, p, size) for split, p in pages.items()}
    grid = encoder.unit_grid
    mean_error, ridge_error = neighbour_predictability(tokens["train"], tokens["val"], grid)
    targets = {split: F.layer_norm(t, t.shape[-1:]) for split, t in tokens.items()}
    if args.target_norm == "page":
        unit_mean = targets["train"].mean(0)
        targets = {split: t - unit_mean for split, t in targets.items()}
    print(f"{len(pages['train'])} + {len(pages['val'])} pages encoded in {time.time() - t0:.0f} s; "
          f"held-out unexplained: unit mean {mean_error:.3f}, ridge from 8 neighbours {ridge_error:.3f}")

    torch.manual_seed(args.seed)
    predictor = build_part(JEPAPredictor, "predictor", model, in_dim=tokens["train"].shape[-1])
    optimizer = torch.optim.AdamW(predictor.parameters(), lr=args.lr, weight_decay=0.05)
    warmup = max(1, args.steps // 20)   # linear warm-up, then cosine to zero: the stages' schedule
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (
        1 + math.cos(math.pi * min(1.0, max(0, s + 1 - warmup) / max(1, args.steps - warmup)))))
    blocks = MultiBlockMasking(grid)
    generator = torch.Generator().manual_seed(args.seed)

    def masking(batch: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        if args.masking == "blocks":
            return blocks(batch, g)
        order = torch.stack([torch.randperm(grid[0] * grid[1], generator=g) for _ in range(batch)])
        return order[:, 4:].sort(1).values, order[:, :4, None]          # context, 4 one-unit targets

    context_ridge = masked_ridge(targets["train"], targets["val"], grid, masking, generator)
    print(f"ridge from the neighbours in the context: held-out unexplained {context_ridge:.3f}")

    unit_variance = {split: t.var(0).mean(-1) for split, t in targets.items()}

    def loss_on(split: str, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(MSE of the predictions, the across-page variance at the target units)"""
        x = targets[split][index]                                     # [B, N, E]
        ctx_idx, tgt_idx = masking(len(index), generator)
        B, M, Nt = tgt_idx.shape
        context = x.gather(1, ctx_idx[..., None].expand(-1, -1, x.shape[-1]))
        pred = predictor(context.repeat_interleave(M, 0), ctx_idx.repeat_interleave(M, 0), tgt_idx.reshape(B * M, Nt), grid)
        target = x.gather(1, tgt_idx.reshape(B, M * Nt)[..., None].expand(-1, -1, x.shape[-1])).reshape(B * M, Nt, -1)
        return F.mse_loss(pred, target), unit_variance[split][tgt_idx].mean()

    def unexplained(split: str) -> float:
        n = len(pages[split]) if split == "val" else len(pages["val"])   # as many training pages as held-out
        predictor.eval()
        with torch.no_grad():
            errors, variances = zip(*(loss_on(split, torch.arange(i, min(i + 64, n))) for i in range(0, n, 64)))
        predictor.train()
        return float(torch.stack(errors).mean() / torch.stack(variances).mean())

    curve = []
    for step in range(1, args.steps + 1):
        index = torch.randint(len(pages["train"]), (args.batch_size,), generator=generator)
        loss, _ = loss_on("train", index)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % max(1, args.steps // 5) == 0 or step == args.steps:
            curve.append([step, round(unexplained("val"), 4), round(unexplained("train"), 4)])
            print(f"step {step}: unexplained held-out {curve[-1][1]:.3f}, training pages {curve[-1][2]:.3f} "
                  f"({time.time() - t0:.0f} s)")
    result = {"encoder": args.encoder, "image_size": size, "target_norm": args.target_norm, "masking": args.masking,
              "predictor": dict(model["predictor"]), "unit_mean_unexplained": mean_error,
              "context_neighbour_unexplained": context_ridge,
              "neighbour_unexplained": ridge_error, "predictor_unexplained_val_train": curve, "seconds": time.time() - t0}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
