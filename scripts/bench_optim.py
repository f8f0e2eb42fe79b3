"""Benchmark SubspaceNGD against fused AdamW and GaLore, with ablations: per-optimizer lr sweep,
seeds, held-out loss, optimizer state, peak extra memory during a step, step time.

    python scripts/bench_optim.py                  # the table in docs/optim.md (~10-20 min on 2 shared cores)
    python scripts/bench_optim.py --device cuda    # the same on a GPU
    python scripts/bench_optim.py --json out.json  # also the per-row numbers and curves

Every optimizer trains the same model from the same initialisation on the same batches. Rows
(`--optimizers`): `adamw` (torch's fused AdamW: the baseline), `galore` (galore-torch GaLoreAdamW,
its recommended settings: update_proj_gap 200, scale 0.25; rank-matched), `natural_galore`
(GaLore with the inverse empirical Fisher of its last `--history` projected gradients), `sngd_random`,
`sngd_tucker` (both with the residual, the default), and the ablations in the random subspace:
`sngd_random_nores` (no residual: the update lives in the subspace only, the method before
issue 12's second pass), `sngd_random_nongd` (NGD off: damping -> inf, normalised momentum of
the projected gradient), `sngd_random_adam` (Adam's second moment in the same subspace),
`sngd_random_sqrt` (F^-1/2, the GGT-style power of the same empirical Fisher). A name may end
in `@<lr>` to skip its sweep.

Protocol: every optimizer runs at every lr of `--lrs` with the first seed of `--seeds` (the
sweep); its best lr (lowest held-out loss) is then run with the other seeds; the reported loss is
the mean over seeds at the best lr. Runs of one round (one lr, or one seed) are step-interleaved
(optimizer A step t, B step t, ...), so the load of a shared machine hits them alike.

Models (`--model`): `text` — a byte-level pre-norm causal transformer (default d=512, 1 layer,
MLP 4x: every projected matrix has both dims >= 256 >> rank 32) on the Python standard library's
source bytes (local, deterministic; held-out = the last 5%). `dociq-pretrain` — the dociq
`model=tiny` pretrain task on synthetic pages (EMA target left at its initial copy).

Memory: `state` = persistent optimizer state (what a checkpoint holds); `cache` = tensors the
optimizer keeps between steps outside its state (SubspaceNGD's cached random factors); `peak` =
the largest rise of the process RSS during one optimizer step after step 0 (/proc/self/status
VmHWM after resetting it through /proc/self/clear_refs, freed heap returned with malloc_trim
first), or of torch.cuda.max_memory_allocated with --device cuda, over the odd steps. Step
time: opt.step() alone (synchronised on CUDA) on the even steps, step 0 excluded (the CPU memory
probe slows the step it wraps, so no step is both probed and timed); ratios are to the fused
AdamW row.
"""
from __future__ import annotations

import argparse
import ctypes
import math
import json
import statistics
import sysconfig
import time
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from dociq.optim import factory


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


def build_text_lm(args, seed: int) -> tuple[nn.Module, Callable, Callable]:
    corpus = stdlib_bytes(4_000_000)
    split = int(0.95 * len(corpus))
    train, held_out = corpus[:split], corpus[split:]
    T = args.seq_len

    def batch(step: int, eval_set: bool = False) -> torch.Tensor:
        data = held_out if eval_set else train
        # Train batches depend on the seed (data order), held-out batches do not.
        gen = torch.Generator().manual_seed(10_000 + step if eval_set else 1_000_003 * seed + step)
        starts = torch.randint(0, len(data) - T - 1, (args.batch_size,), generator=gen)
        return torch.stack([data[s:s + T + 1] for s in starts.tolist()]).to(args.device)

    def loss_fn(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        logits = model(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))

    torch.manual_seed(seed)
    model = ByteLM(d_model=args.d_model, depth=args.depth, heads=args.heads, seq_len=T)
    return model.to(args.device), batch, loss_fn


class TrainableOnly(nn.Module):
    """A task seen through its trainable parameters only (the EMA target is not optimized)."""

    def __init__(self, task: nn.Module):
        super().__init__()
        self.task = task

    def named_parameters(self, *args, **kwargs):
        return iter(self.task.trainable_named_parameters())

    def parameters(self, *args, **kwargs):
        return (p for _, p in self.named_parameters())


def build_dociq_pretrain(args, seed: int) -> tuple[nn.Module, Callable, Callable]:
    from hydra.utils import instantiate

    from dociq.training.config import compose
    from dociq.data.collate import DocumentCollator
    from dociq.training.tasks.registry import resolve_stage

    cfg = compose(["stage=pretrain", f"seed={seed}", "data.num_workers=0"])
    data = instantiate(cfg.data, _convert_="all")
    torch.manual_seed(seed)
    task = resolve_stage("pretrain")(**instantiate(cfg.task, _convert_="all"))
    collator: DocumentCollator = data.train_collator
    cache: dict[tuple[int, bool], dict] = {}

    def batch(step: int, eval_set: bool = False) -> dict:
        # Identical pages and masks for every optimizer: made once per (step, split), then reused.
        key = (step, eval_set)
        if key not in cache:
            pages = data.val_set if eval_set else data.train_set
            collator.seed = 10_000 * int(eval_set) + step
            made = collator([pages[(step * args.batch_size + j) % len(pages)]
                             for j in range(args.batch_size)])
            cache[key] = {k: v.to(args.device) if torch.is_tensor(v) else v for k, v in made.items()}
        return cache[key]

    def loss_fn(model: nn.Module, b: dict) -> torch.Tensor:
        return model.task.compute_losses(b)["loss"]

    return TrainableOnly(task.to(args.device)), batch, loss_fn


MODELS = {"text": build_text_lm, "dociq-pretrain": build_dociq_pretrain}


# ---------------------------------------------------------------- optimizers
ABLATIONS = {"nongd": "none", "adam": "adam", "sqrt": "sqrt"}


def build_optimizer(name: str, named, args, lr: float):
    """`name` is adamw | galore | natural_galore | apollo_mini | sngd_<random|tucker|coordinates>[_<carry|reset>][_bf16][_nongd|_adam|_sqrt][_nores]."""
    if name == "adamw":
        fused = args.device in ("cpu", "cuda") or args.device.startswith("cuda")
        return factory.adamw(named, lr=lr, weight_decay=args.weight_decay, foreach=not fused,
                             fused=fused)
    if name == "galore":
        return factory.galore(named, rank=args.rank, update_proj_gap=args.galore_refresh,
                              scale=args.galore_scale, lr=lr, weight_decay=args.weight_decay)
    if name == "natural_galore":
        return factory.natural_galore(named, rank=args.rank, update_proj_gap=args.galore_refresh,
                                      scale=args.galore_scale, history=args.history, damping=args.damping,
                                      lr=lr, weight_decay=args.weight_decay)
    if name == "apollo_mini":
        return factory.apollo_mini(named, lr=lr, weight_decay=args.weight_decay)
    if name.startswith("sngd_"):
        parts = name[len("sngd_"):].split("_")
        if parts[0] not in ("random", "tucker", "coordinates"):
            raise ValueError(f"{name!r}: the projector after sngd_ is random, tucker or coordinates")
        dtype = "bfloat16" if "bf16" in parts else "float32"      # stored tucker factors
        policy = next((p for p in parts[1:] if p in ("carry", "reset")), args.refresh_policy)
        precond = next((ABLATIONS[p] for p in parts[1:] if p in ABLATIONS), "ngd")
        return factory.sngd(named, lr=lr, weight_decay=args.weight_decay,
                            rank=args.rank, history=args.history, damping=args.damping,
                            refresh_every=args.refresh_every, projector=parts[0],
                            refresh_policy=policy, projector_dtype=dtype, preconditioner=precond,
                            residual="nores" not in parts)
    raise ValueError(f"unknown optimizer {name!r}: use adamw, galore, natural_galore, apollo_mini, sngd_random, sngd_tucker, sngd_coordinates "
                     "(optionally with _carry/_reset, _bf16, _nongd/_adam/_sqrt, _nores)")


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


# ---------------------------------------------------------------- memory
class StepMemory:
    """Peak rise of memory during one call: RSS on the CPU, allocated bytes on CUDA."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")
        self.libc = None
        if not self.cuda:
            try:
                self.libc = ctypes.CDLL("libc.so.6")
            except OSError:
                self.libc = None
            self.available = Path("/proc/self/clear_refs").exists()
        else:
            self.available = True

    @staticmethod
    def _status(key: str) -> int:
        for line in open("/proc/self/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
        raise KeyError(key)

    def start(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        elif self.available:
            if self.libc is not None:
                self.libc.malloc_trim(0)          # freed heap back to the OS: a new allocation shows
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")                      # VmHWM := VmRSS
            self.base = self._status("VmRSS")

    def stop(self) -> int:
        if self.cuda:
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() - self.base
        if not self.available:
            return 0
        return max(0, self._status("VmHWM") - self.base)


# ---------------------------------------------------------------- run
class Run:
    """One (optimizer, lr, seed): model, optimizer and measurements."""

    def __init__(self, name: str, lr: float, seed: int, args):
        self.name, self.lr, self.seed = name, lr, seed
        self.model, self.batch, self.loss_fn = MODELS[args.model](args, seed)   # same seed, same init
        self.projected = projected_set(self.model, args)
        self.opt = build_optimizer(name, list(self.model.named_parameters()), args, lr)
        self.sched = factory.warmup_cosine(self.opt, warmup_steps=max(1, args.steps // 10),
                                           total_steps=args.steps)
        self.memory = StepMemory(args.device)
        self.cuda = args.device.startswith("cuda")
        self.losses, self.step_ms, self.wall, self.peak = [], [], [], []
        self.elapsed = 0.0

    def train_step(self, step: int) -> None:
        t_all = time.perf_counter()
        batch = self.batch(step)
        loss = self.loss_fn(self.model, batch)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        loss_value = loss.item()
        # Odd steps measure memory, even steps (after step 0) time: the CPU probe trims the heap
        # and resets the RSS high-water mark, which slows the step it wraps.
        probe = step % 2 == 1
        if probe:
            self.memory.start()
        t0 = time.perf_counter()
        self.opt.step()
        if self.cuda:
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        if probe:
            self.peak.append(self.memory.stop())
        elif step > 0:
            self.step_ms.append(1e3 * (t1 - t0))
        self.sched.step()
        self.losses.append(loss_value)
        # Wall-clock of forward + backward + step (the memory probe excluded).
        self.elapsed += (t0 - t_all) + (t1 - t0)
        self.wall.append(self.elapsed)

    def summary(self, args) -> dict:
        with torch.no_grad():
            final = statistics.fmean(self.loss_fn(self.model, self.batch(i, eval_set=True)).item()
                                     for i in range(args.eval_batches))
        per_param = state_bytes(self.opt)
        n_all = sum(p.numel() for p in self.model.parameters())
        n_proj = sum(p.numel() for p in self.projected)
        cache = self.opt.cache_bytes() if hasattr(self.opt, "cache_bytes") else 0
        return {
            "lr": self.lr, "seed": self.seed,
            "state_bytes_per_param": sum(per_param.values()) / n_all,
            "state_bytes_per_projected_param": sum(per_param.get(p, 0) for p in self.projected) / n_proj,
            "cache_bytes_per_param": cache / n_all,
            "peak_bytes_per_param": max(self.peak) / n_all,
            "step_ms_median": statistics.median(self.step_ms),
            "step_ms_max": max(self.step_ms),
            "final_loss": final if math.isfinite(final) else float("inf"),
            "train_loss_curve": self.losses,
            "wall_s": self.wall,
            "step_ms": self.step_ms,
            "params": n_all,
            "projected_params": n_proj,
            "skipped_steps": getattr(self.opt, "skipped_steps", 0),
            "fallback_steps": getattr(self.opt, "fallback_steps", 0),
        }


def run_round(specs: list[tuple[str, float, int]], args) -> list[dict]:
    """Train (name, lr, seed) runs step-interleaved; a run that raises (diverged) gets loss inf."""
    runs = [Run(name, lr, seed, args) for name, lr, seed in specs]
    dead: dict[int, str] = {}
    for step in range(args.steps):
        for i, run in enumerate(runs):
            if i in dead:
                continue
            try:
                run.train_step(step)
            except FloatingPointError as err:   # SubspaceNGD stops a diverged run
                dead[i] = str(err)
        if args.verbose and step % 20 == 0:
            print(f"step {step:4d} " + "  ".join(
                f"{r.name}@{r.lr:g} {r.losses[-1]:.3f}" for i, r in enumerate(runs) if i not in dead),
                flush=True)
    out = []
    for i, run in enumerate(runs):
        if i in dead or not run.step_ms or not run.peak:
            out.append({"lr": run.lr, "seed": run.seed, "final_loss": float("inf"), "diverged": dead.get(i)})
        else:
            row = run.summary(args)
            if not math.isfinite(row["final_loss"]) or not math.isfinite(run.losses[-1]):
                row["final_loss"] = float("inf")
            out.append(row)
    return out


def parse_names(text: str) -> list[tuple[str, Optional[float]]]:
    names = []
    for item in text.split(","):
        item = item.strip()
        if item:
            name, _, lr = item.partition("@")
            names.append((name, float(lr) if lr else None))
    if "adamw" not in [n for n, _ in names]:
        names.insert(0, ("adamw", None))       # every ratio is relative to fused AdamW
    return names


def run_all(names, args) -> dict:
    lrs, seeds = args.lrs, args.seeds
    sweep: dict[str, list[dict]] = {n: [] for n, _ in names}
    for lr in lrs:                                   # sweep rounds: every optimizer at this lr
        specs = [(n, fixed if fixed is not None else lr, seeds[0]) for n, fixed in names
                 if fixed is None or lr == lrs[0]]
        t0 = time.time()
        for (n, _, _), row in zip(specs, run_round(specs, args)):
            sweep[n].append(row)
        print(f"lr {lr:g}: " + "  ".join(f"{n} {sweep[n][-1]['final_loss']:.4f}" for n, _, _ in specs)
              + f"  ({time.time() - t0:.0f} s)", flush=True)
    best = {n: min(rows, key=lambda r: r["final_loss"]) for n, rows in sweep.items()}
    seeded: dict[str, list[dict]] = {n: [best[n]] for n in sweep}
    for seed in seeds[1:]:                           # other seeds at each optimizer's best lr
        specs = [(n, best[n]["lr"], seed) for n in sweep]
        t0 = time.time()
        for (n, _, _), row in zip(specs, run_round(specs, args)):
            seeded[n].append(row)
        print(f"seed {seed}: " + "  ".join(f"{n} {seeded[n][-1]['final_loss']:.4f}" for n in sweep)
              + f"  ({time.time() - t0:.0f} s)", flush=True)
    results = {}
    for n, rows in seeded.items():
        ok = [r for r in rows if "step_ms" in r]
        if not ok:
            results[n] = {"best_lr": best[n]["lr"], "final_loss": float("inf"), "seeds": seeds,
                          "sweep": {f"{r['lr']:g}": r["final_loss"] for r in sweep[n]}}
            continue
        first = ok[0]
        step_ms = [t for r in ok for t in r["step_ms"]]
        results[n] = {
            "best_lr": best[n]["lr"],
            "seeds": [r["seed"] for r in rows],
            "final_loss": statistics.fmean(r["final_loss"] for r in rows),
            "final_loss_per_seed": [r["final_loss"] for r in rows],
            "state_bytes_per_param": first["state_bytes_per_param"],
            "state_bytes_per_projected_param": first["state_bytes_per_projected_param"],
            "cache_bytes_per_param": first["cache_bytes_per_param"],
            "peak_bytes_per_param": max(r["peak_bytes_per_param"] for r in ok),
            "step_ms_median": statistics.median(step_ms),
            "step_ms_max": max(step_ms),
            "sweep": {f"{r['lr']:g}": r["final_loss"] for r in sweep[n]},
            "sweep_step_ms_median": statistics.median(
                t for r in sweep[n] if "step_ms" in r for t in r["step_ms"]),
            "train_loss_curve": first["train_loss_curve"],
            "wall_s": first["wall_s"],
            "params": first["params"], "projected_params": first["projected_params"],
            "skipped_steps": sum(r["skipped_steps"] for r in ok),
            "fallback_steps": sum(r["fallback_steps"] for r in ok),
        }
        if n == "adamw":
            results[n]["fused"] = args.device != "mps"
    return results


def trailing(xs: list, i: int, w: int = 10) -> float:
    return statistics.fmean(xs[max(0, i - w + 1):i + 1])


def add_comparisons(results: dict) -> None:
    base = results["adamw"]
    target = trailing(base["train_loss_curve"], len(base["train_loss_curve"]) - 1)
    for r in results.values():
        if "step_ms_median" not in r:
            continue
        # The sweep's median step is the load-robust figure (4x more steps, all interleaved).
        r["step_ms_median_vs_adamw"] = r["sweep_step_ms_median"] / base["sweep_step_ms_median"]
        r["step_ms_max_vs_median"] = r["step_ms_max"] / r["step_ms_median"]
        r["final_loss_vs_adamw"] = r["final_loss"] / base["final_loss"]
        curve = r["train_loss_curve"]
        r["steps_to_adamw_loss"] = next((i + 1 for i in range(len(curve))
                                         if trailing(curve, i) <= target), None)


def print_table(results: dict, args) -> None:
    head = ("optimizer", "best lr", "held-out loss", "/AdamW", "sweep (lr: loss)", "state B/param",
            "B/proj.param", "cache B/param", "peak extra B/param", "step ms med", "max", "med/AdamW",
            "steps→AdamW loss")
    rows = [head]
    for name, r in results.items():
        sweep = ", ".join(f"{lr}: {loss:.3f}" for lr, loss in r["sweep"].items())
        if "step_ms_median" not in r:
            rows.append((name, f"{r['best_lr']:g}", "diverged", "-", sweep) + ("-",) * 8)
            continue
        spread = max(r["final_loss_per_seed"]) - min(r["final_loss_per_seed"])
        rows.append((name + (" (fused)" if r.get("fused") else ""), f"{r['best_lr']:g}",
                     f"{r['final_loss']:.4f} ±{spread / 2:.4f}", f"{r['final_loss_vs_adamw']:.3f}", sweep,
                     f"{r['state_bytes_per_param']:.3f}", f"{r['state_bytes_per_projected_param']:.3f}",
                     f"{r['cache_bytes_per_param']:.3f}", f"{r['peak_bytes_per_param']:.3f}",
                     f"{r['sweep_step_ms_median']:.1f}", f"{r['step_ms_max']:.1f}",
                     f"{r['step_ms_median_vs_adamw']:.2f}",
                     str(r["steps_to_adamw_loss"] or f">{args.steps}")))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    print("\n".join(lines))


def plot(results: dict, args) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = []
    for axis, fname, label in (("steps", "optim_loss_vs_steps.png", "optimizer step"),
                               ("wall", "optim_loss_vs_time.png", "wall-clock s (forward + backward + step)")):
        fig, ax = plt.subplots(figsize=(7.5, 4.5))
        for name, r in results.items():
            if "train_loss_curve" not in r:
                continue
            curve = [trailing(r["train_loss_curve"], i) for i in range(len(r["train_loss_curve"]))]
            xs = range(1, len(curve) + 1) if axis == "steps" else r["wall_s"]
            ax.plot(list(xs), curve, label=f"{name} (lr {r['best_lr']:g})",
                    lw=2 if name in ("adamw", "sngd_random", "sngd_tucker") else 1)
        ax.set_xlabel(label)
        ax.set_ylabel("train loss (trailing 10 steps)")
        ax.set_title(f"{args.model}: d={args.d_model}, depth {args.depth}, rank {args.rank}, "
                     f"each at its best lr, seed {args.seeds[0]}")
        lo = min(min(r["train_loss_curve"]) for r in results.values() if "train_loss_curve" in r)
        ax.set_ylim(lo - 0.1, lo + 2.0)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        path = args.plots / fname
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        out.append(path)
    return out


DEFAULT_OPTIMIZERS = ("adamw,galore,sngd_random,sngd_tucker,sngd_random_nores,sngd_random_nongd,"
                      "sngd_random_adam,sngd_random_sqrt")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(MODELS), default="text",
                    help="text: byte-level transformer; dociq-pretrain: the model=tiny pretrain task")
    ap.add_argument("--optimizers", default=DEFAULT_OPTIMIZERS)
    ap.add_argument("--lrs", default="1e-4,3e-4,1e-3,3e-3,1e-2", help="the lr sweep (log grid)")
    ap.add_argument("--seeds", default="0,1,2", help="first: the sweep; the rest: at the best lr")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--depth", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--rank", type=int, default=32, help="SubspaceNGD rank; GaLore gets the same")
    ap.add_argument("--history", type=int, default=10)
    ap.add_argument("--damping", type=float, default=1.0)
    ap.add_argument("--refresh-every", type=int, default=50, help="SubspaceNGD's refresh period")
    ap.add_argument("--galore-refresh", type=int, default=200, help="GaLore's update_proj_gap (its recommended 200)")
    ap.add_argument("--refresh-policy", default="carry", choices=["carry", "reset"])
    ap.add_argument("--galore-scale", type=float, default=0.25)
    ap.add_argument("--eval-batches", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--json", type=Path, default=None, help="write the results here as JSON")
    ap.add_argument("--plots", type=Path, default=Path(__file__).resolve().parent.parent / "docs" / "img",
                    help="folder for optim_loss_vs_steps.png / optim_loss_vs_time.png")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    args.lrs = [float(x) for x in args.lrs.split(",") if x.strip()]
    args.seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    if not args.lrs or not args.seeds:
        ap.error("--lrs and --seeds need at least one value each")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device is visible")
    torch.set_num_threads(args.threads)
    names = parse_names(args.optimizers)
    t0 = time.time()
    results = run_all(names, args)
    print(f"{len(names)} optimizers x {len(args.lrs)} lrs + {len(args.seeds) - 1} seed(s) x "
          f"{args.steps} steps in {time.time() - t0:.0f} s", flush=True)
    add_comparisons(results)
    print_table(results, args)
    if not args.no_plots:
        for path in plot(results, args):
            print(f"wrote {path}")
    if args.json is not None:
        cfg = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        args.json.write_text(json.dumps({"config": cfg, "results": results}, indent=1))
    return results


if __name__ == "__main__":
    main()
