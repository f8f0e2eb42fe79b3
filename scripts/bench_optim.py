"""Benchmark SubspaceNGD against AdamW and GaLore: optimizer memory, step time, loss.

Every optimizer trains the same model from the same initialisation on the same batches:

    python scripts/bench_optim.py --steps 100 --json bench_optim.json

Models (`--model`): `text` — a ~10.7M-parameter byte-level causal transformer (d=384, 6
layers) trained on the Python standard library's source files (local, deterministic data).
`dociq-pretrain` — the dociq `model=tiny` pretrain task (Hiera + layout BERT + fusion, D-JEPA +
MLM + MIM losses) on synthetic pages, composed as `python train.py stage=pretrain` would; the
EMA target stays at its initial copy (this measures the optimizer, not the schedule).

Columns: optimizer-state bytes per parameter (whole model / projected parameters only),
median and max optimizer-step time (step 0, which allocates the state, excluded) and their
ratio to AdamW, held-out loss after N steps and its ratio to AdamW, and the first step whose
trailing-10 train loss reaches AdamW's final trailing-10 train loss.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import sysconfig
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from dociq.optim import factory  # noqa: E402


# ---------------------------------------------------------------- model and data
class ByteLM(nn.Module):
    """Pre-norm causal transformer over bytes (torch.nn.TransformerEncoder blocks)."""

    def __init__(self, d_model=384, depth=6, heads=6, seq_len=128, vocab=256):
        super().__init__()
        self.tok_embed = nn.Embedding(vocab, d_model)
        self.pos_embed = nn.Parameter(torch.zeros(seq_len, d_model))
        layer = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        nn.init.normal_(self.pos_embed, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        T = ids.shape[1]
        x = self.tok_embed(ids) + self.pos_embed[:T]
        mask = nn.Transformer.generate_square_subsequent_mask(T, device=ids.device)
        return self.head(self.norm(self.blocks(x, mask=mask, is_causal=True)))


def stdlib_bytes(limit: int) -> torch.Tensor:
    """The first `limit` bytes of the standard library's .py files, in sorted order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(root.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= limit:
            break
    return torch.frombuffer(bytearray(b"".join(chunks)[:limit]), dtype=torch.uint8).long()


def build_text_lm(args) -> tuple[nn.Module, Callable, Callable]:
    corpus = stdlib_bytes(4_000_000)
    split = int(0.95 * len(corpus))
    train, held_out = corpus[:split], corpus[split:]
    T = args.seq_len

    def batch(step: int, eval_set: bool = False) -> torch.Tensor:
        data = held_out if eval_set else train
        gen = torch.Generator().manual_seed(10_000 * int(eval_set) + step)
        starts = torch.randint(0, len(data) - T - 1, (args.batch_size,), generator=gen)
        return torch.stack([data[s:s + T + 1] for s in starts.tolist()])

    def loss_fn(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        logits = model(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))

    torch.manual_seed(args.seed)
    model = ByteLM(d_model=args.d_model, depth=args.depth, heads=args.heads, seq_len=T)
    return model, batch, loss_fn


class TrainableOnly(nn.Module):
    """A task seen through its trainable parameters only (the EMA target is not optimized)."""

    def __init__(self, task: nn.Module):
        super().__init__()
        self.task = task

    def named_parameters(self, *args, **kwargs):
        return iter(self.task.trainable_named_parameters())

    def parameters(self, *args, **kwargs):
        return (p for _, p in self.named_parameters())


def build_dociq_pretrain(args) -> tuple[nn.Module, Callable, Callable]:
    from hydra.utils import instantiate

    from dociq.config import compose
    from dociq.data.collate import DocumentCollator
    from dociq.tasks.registry import resolve_stage

    cfg = compose(["stage=pretrain", f"seed={args.seed}", "data.num_workers=0"])
    data = instantiate(cfg.data, _convert_="all")
    torch.manual_seed(args.seed)
    task = resolve_stage("pretrain")(**instantiate(cfg.task, _convert_="all"))
    collator: DocumentCollator = data.train_collator
    cache: dict[tuple[int, bool], dict] = {}

    def batch(step: int, eval_set: bool = False) -> dict:
        # Identical pages and masks for every optimizer: made once per (step, split), then reused.
        key = (step, eval_set)
        if key not in cache:
            pages = data.val_set if eval_set else data.train_set
            collator.seed = 10_000 * int(eval_set) + step
            cache[key] = collator([pages[(step * args.batch_size + j) % len(pages)]
                                   for j in range(args.batch_size)])
        return cache[key]

    def loss_fn(model: nn.Module, b: dict) -> torch.Tensor:
        return model.task.compute_losses(b)["loss"]

    return TrainableOnly(task), batch, loss_fn


MODELS = {"text": build_text_lm, "dociq-pretrain": build_dociq_pretrain}


# ---------------------------------------------------------------- optimizers
def build_optimizer(name: str, named, args):
    """`name` is adamw | galore | sngd_<random|tucker>[_<carry|reset>][_bf16], optionally
    `@<lr>`; `_bf16` stores tucker factors in bfloat16."""
    name, _, lr = name.partition("@")
    if lr:
        args = argparse.Namespace(**(vars(args) | {"lr": float(lr), "sngd_lr": float(lr)}))
    if name == "adamw":
        return factory.adamw(named, lr=args.lr, weight_decay=args.weight_decay, foreach=True)
    if name == "galore":
        return factory.galore(named, rank=args.rank, update_proj_gap=args.refresh_every,
                              scale=args.galore_scale, lr=args.lr, weight_decay=args.weight_decay)
    if name.startswith("sngd_"):
        parts = name[len("sngd_"):].split("_")
        dtype = "bfloat16" if "bf16" in parts else "float32"      # stored tucker factors
        policy = next((p for p in parts[1:] if p in ("carry", "reset")), args.refresh_policy)
        return factory.sngd(named, lr=args.sngd_lr, weight_decay=args.weight_decay,
                            rank=args.rank, history=args.history, damping=args.damping,
                            refresh_every=args.refresh_every, projector=parts[0],
                            refresh_policy=policy, projector_dtype=dtype)
    raise ValueError(f"unknown optimizer {name!r}: use adamw, galore, sngd_random, sngd_tucker "
                     "(optionally with _carry/_reset)")


def state_bytes(opt: torch.optim.Optimizer) -> dict:
    """Persistent optimizer memory per parameter: state tensors, and tensors held by state
    objects (GaLore keeps its projector matrix in a GaLoreProjector)."""
    per_param = {}
    for p, st in opt.state.items():
        total = 0
        for value in st.values():
            if torch.is_tensor(value):
                total += value.numel() * value.element_size()
            elif hasattr(value, "ortho_matrix") and value.ortho_matrix is not None:
                mats = value.ortho_matrix if isinstance(value.ortho_matrix, (list, tuple)) else [value.ortho_matrix]
                total += sum(m.numel() * m.element_size() for m in mats)
        per_param[p] = total
    return per_param


def projected_set(model: nn.Module, args) -> set:
    """The parameters SubspaceNGD projects with these settings (the same set for every row)."""
    opt = factory.sngd(list(model.named_parameters()), rank=args.rank)
    return {p for g in opt.param_groups for p in g["params"] if opt.is_projected(p, g)}


# ---------------------------------------------------------------- run
class Run:
    """One optimizer's model, optimizer and measurements."""

    def __init__(self, name: str, args):
        self.name = name
        self.model, self.batch, self.loss_fn = MODELS[args.model](args)   # same seed, same init
        self.projected = projected_set(self.model, args)
        self.opt = build_optimizer(name, list(self.model.named_parameters()), args)
        self.sched = factory.warmup_cosine(self.opt, warmup_steps=max(1, args.steps // 10),
                                           total_steps=args.steps)
        self.losses, self.step_ms = [], []

    def train_step(self, tokens: torch.Tensor) -> None:
        loss = self.loss_fn(self.model, tokens)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        t0 = time.perf_counter()
        self.opt.step()
        self.step_ms.append(1e3 * (time.perf_counter() - t0))
        self.sched.step()
        self.losses.append(loss.item())

    def summary(self, args) -> dict:
        with torch.no_grad():
            final = statistics.fmean(self.loss_fn(self.model, self.batch(i, eval_set=True)).item()
                                     for i in range(args.eval_batches))
        per_param = state_bytes(self.opt)
        n_all = sum(p.numel() for p in self.model.parameters())
        n_proj = sum(p.numel() for p in self.projected)
        timed = self.step_ms[1:]
        return {
            "state_bytes_per_param": sum(per_param.values()) / n_all,
            "state_bytes_per_projected_param": sum(per_param.get(p, 0) for p in self.projected) / n_proj,
            "step_ms_median": statistics.median(timed),
            "step_ms_max": max(timed),
            "final_loss": final,
            "train_loss_curve": self.losses,
            "step_ms": self.step_ms,
            "params": n_all,
            "projected_params": n_proj,
            "skipped_steps": getattr(self.opt, "skipped_steps", 0),
        }


def run_all(names: list[str], args) -> dict:
    """Train every optimizer step-interleaved (AdamW step 0, GaLore step 0, ..., AdamW step 1,
    ...), so the load of a shared machine hits all of them alike."""
    runs = [Run(name, args) for name in names]
    for step in range(args.steps):
        tokens = runs[0].batch(step)
        for run in runs:
            run.train_step(tokens)
        if args.verbose and step % 10 == 0:
            print(f"step {step:4d} " + "  ".join(
                f"{r.name} {r.losses[-1]:.3f} ({r.step_ms[-1]:.0f} ms)" for r in runs), flush=True)
    return {run.name: run.summary(args) for run in runs}


def trailing(xs: list, i: int, w: int = 10) -> float:
    return statistics.fmean(xs[max(0, i - w + 1):i + 1])


def add_comparisons(results: dict) -> None:
    base = results["adamw"]
    target = trailing(base["train_loss_curve"], len(base["train_loss_curve"]) - 1)
    for r in results.values():
        r["step_ms_median_vs_adamw"] = r["step_ms_median"] / base["step_ms_median"]
        r["step_ms_max_vs_median"] = r["step_ms_max"] / r["step_ms_median"]
        r["final_loss_vs_adamw"] = r["final_loss"] / base["final_loss"]
        curve = r["train_loss_curve"]
        r["steps_to_adamw_loss"] = next((i + 1 for i in range(len(curve))
                                         if trailing(curve, i) <= target), None)


def print_table(results: dict, args) -> None:
    head = ("optimizer", "B/param", "B/proj.param", "step ms med", "max", "med/AdamW",
            "max/med", "loss@N", "loss/AdamW", "steps→AdamW loss")
    rows = [head]
    for name, r in results.items():
        rows.append((name, f"{r['state_bytes_per_param']:.3f}",
                     f"{r['state_bytes_per_projected_param']:.3f}",
                     f"{r['step_ms_median']:.1f}", f"{r['step_ms_max']:.1f}",
                     f"{r['step_ms_median_vs_adamw']:.2f}", f"{r['step_ms_max_vs_median']:.2f}",
                     f"{r['final_loss']:.4f}", f"{r['final_loss_vs_adamw']:.3f}",
                     str(r["steps_to_adamw_loss"] or f">{args.steps}")))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    print("\n".join(lines))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(MODELS), default="text",
                    help="text: 10.9M byte-level transformer; dociq-pretrain: the model=tiny pretrain task")
    ap.add_argument("--optimizers", default="adamw,galore,sngd_random,sngd_tucker")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--d-model", type=int, default=384)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--lr", type=float, default=1e-3, help="AdamW and GaLore learning rate")
    ap.add_argument("--sngd-lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--rank", type=int, default=32, help="SubspaceNGD rank; GaLore gets the same")
    ap.add_argument("--history", type=int, default=10)
    ap.add_argument("--damping", type=float, default=1.0)
    ap.add_argument("--refresh-every", type=int, default=50, help="also GaLore's update_proj_gap")
    ap.add_argument("--refresh-policy", default="carry", choices=["carry", "reset"])
    ap.add_argument("--galore-scale", type=float, default=0.25)
    ap.add_argument("--eval-batches", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="write the results here as JSON")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    names = [n.strip() for n in args.optimizers.split(",") if n.strip()]
    if "adamw" not in names:
        names.insert(0, "adamw")       # every ratio is relative to the plain `adamw` row
    t0 = time.time()
    results = run_all(names, args)
    print(f"{len(names)} optimizers x {args.steps} steps in {time.time() - t0:.0f} s", flush=True)
    add_comparisons(results)
    print_table(results, args)
    if args.json is not None:
        args.json.write_text(json.dumps({"config": vars(args) | {"json": str(args.json)},
                                         "results": results}, indent=1))
    return results


if __name__ == "__main__":
    main()
