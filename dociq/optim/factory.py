"""Optimizer and scheduler factories selected by `configs/optim/*.yaml` (Hydra partials).

Every optimizer factory takes the task's trainable `(name, parameter)` pairs (see
`dociq/training/tasks/base.py`) and returns a `torch.optim.Optimizer`; the names route parameters to
param groups (no weight decay on norms/biases; GaLore/SubspaceNGD only on matrices).
"""
from __future__ import annotations

import math
import re
import warnings
from typing import Mapping, Sequence

import torch

from dociq.optim.sngd import SubspaceNGD

NamedParams = Sequence[tuple[str, torch.nn.Parameter]]

# Parameters that get no weight decay: 1-D tensors (norm scales, biases) and these names.
NO_DECAY_PATTERN = r"(^|\.)(bias|norm|ln|layernorm|pos_embed|position|cls_token|mask_token)"
# Matrices that SubspaceNGD/GaLore leave to the fallback: lookup tables, not linear maps.
EMBEDDING_PATTERN = r"(embed|embedding|tok_emb|wte|wpe|pos_embed|cls_token|mask_token)"


def _named(named_params: NamedParams) -> list[tuple[str, torch.nn.Parameter]]:
    named = [(n, p) for n, p in named_params if p.requires_grad]
    if not named:
        raise ValueError("optimizer factory got no trainable parameters: check that the task's "
                         "trainable_named_parameters() is not empty (is everything frozen?).")
    for item in named:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            raise TypeError("optimizer factories take (name, parameter) pairs, e.g. "
                            "model.named_parameters(); got " + type(item).__name__)
    return named


def _decays(name: str, p: torch.Tensor) -> bool:
    return p.dim() >= 2 and re.search(NO_DECAY_PATTERN, name, re.IGNORECASE) is None


def _is_embedding(name: str) -> bool:
    return re.search(EMBEDDING_PATTERN, name, re.IGNORECASE) is not None


def decay_groups(named_params: NamedParams, weight_decay: float) -> list[dict]:
    named = _named(named_params)
    decay = [p for n, p in named if _decays(n, p)]
    no_decay = [p for n, p in named if not _decays(n, p)]
    return [g for g in ({"params": decay, "weight_decay": weight_decay},
                        {"params": no_decay, "weight_decay": 0.0}) if g["params"]]


def scaled_groups(named_params: NamedParams, weight_decay: float, lr: float,
                  lr_scales: Mapping[str, float]) -> list[dict]:
    """`decay_groups`, split further by learning-rate multiplier: a parameter whose name matches the
    regex `pattern` (re.search; the first match in `lr_scales`' order wins) trains at lr x scale,
    e.g. {"image_encoder": 0.1} for a slower backbone. Each group carries its own `lr`, which
    LambdaLR schedulers (warmup_cosine) then multiply."""
    named = _named(named_params)
    patterns = list(lr_scales.items())
    for pattern, scale in patterns:
        if not any(re.search(pattern, n) for n, _ in named):
            raise ValueError(f"optim.optimizer.lr_scales: pattern {pattern!r} matches no trainable "
                             f"parameter; names look like {named[0][0]!r}")
        if not float(scale) >= 0:
            raise ValueError(f"optim.optimizer.lr_scales: {pattern!r} -> {scale!r}; give a number >= 0")

    def scale_of(name: str) -> float:
        return next((float(s) for pattern, s in patterns if re.search(pattern, name)), 1.0)

    by_scale: dict[float, list] = {}
    for n, p in named:
        by_scale.setdefault(scale_of(n), []).append((n, p))
    groups = []
    for scale, members in by_scale.items():
        for g in decay_groups(members, weight_decay):
            groups.append({**g, "lr": lr * scale})
    return groups


def adamw(named_params: NamedParams, lr: float = 1e-3, weight_decay: float = 0.01,
          betas: Sequence[float] = (0.9, 0.999), eps: float = 1e-8,
          foreach: bool | None = None, fused: bool | None = None,
          lr_scales: Mapping[str, float] | None = None) -> torch.optim.AdamW:
    """torch AdamW; decay only on matrices that are not norms/embedding tables; `lr_scales`
    (name regex -> multiplier) gives parts of the model their own learning rate."""
    groups = (scaled_groups(named_params, weight_decay, lr, lr_scales) if lr_scales
              else decay_groups(named_params, weight_decay))
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, foreach=foreach, fused=fused)


def galore(named_params: NamedParams, rank: int = 32, update_proj_gap: int = 200,
           scale: float = 0.25, proj_type: str = "std", lr: float = 1e-3,
           weight_decay: float = 0.01, betas: Sequence[float] = (0.9, 0.999),
           eps: float = 1e-6) -> torch.optim.Optimizer:
    """galore-torch GaLoreAdamW: 2-D non-embedding weights in the low-rank group (as in
    jiaweizzhao/GaLore's torchrun_main.py, which projects attention/MLP linears only)."""
    from galore_torch import GaLoreAdamW

    groups = low_rank_groups(named_params, weight_decay, rank=rank, update_proj_gap=update_proj_gap,
                             scale=scale, proj_type=proj_type)
    return GaLoreAdamW(groups, lr=lr, betas=tuple(betas), eps=eps, no_deprecation_warning=True)


def natural_galore(named_params: NamedParams, rank: int = 32, update_proj_gap: int = 200,
                   scale: float = 0.25, history: int = 10, damping: float = 1.0, lr: float = 1e-3,
                   weight_decay: float = 0.01, betas: Sequence[float] = (0.9, 0.999),
                   eps: float = 1e-6) -> torch.optim.Optimizer:
    """Natural GaLore (`dociq.optim.natural_galore`): GaLore's groups and settings, the projected
    gradient preconditioned by the inverse empirical Fisher of its last `history` values."""
    # deferred: it imports galore-torch, a training extra the other optimizers do not need
    from dociq.optim.natural_galore import NaturalGaLoreAdamW

    groups = low_rank_groups(named_params, weight_decay, rank=rank, update_proj_gap=update_proj_gap,
                             scale=scale, proj_type="std", history=history, damping=damping)
    return NaturalGaLoreAdamW(groups, lr=lr, betas=tuple(betas), eps=eps, no_deprecation_warning=True)


def low_rank_groups(named_params: NamedParams, weight_decay: float, **settings) -> list[dict]:
    """GaLore-family param groups: 2-D non-embedding weights in one group with the projection
    `settings` (as jiaweizzhao/GaLore's torchrun_main.py projects attention/MLP linears only),
    the rest in `decay_groups`."""
    named = _named(named_params)
    low_rank = [p for n, p in named if p.dim() == 2 and not _is_embedding(n)]
    low_ids = {id(p) for p in low_rank}
    rest = [(n, p) for n, p in named if id(p) not in low_ids]
    groups = [{"params": low_rank, **settings, "weight_decay": weight_decay}]
    groups += decay_groups(rest, weight_decay) if rest else []
    return [g for g in groups if g["params"]]


def apollo_mini(named_params: NamedParams, rank: int = 1, scale: float = 128.0,
                scale_type: str = "tensor", update_proj_gap: int = 200, lr: float = 1e-2,
                weight_decay: float = 0.01, betas: Sequence[float] = (0.9, 0.999),
                eps: float = 1e-6) -> torch.optim.Optimizer:
    """apollo-torch APOLLOAdamW with APOLLO-Mini's settings (its README: rank 1, random projection,
    tensor-wise scaling, scale 128, projection renewed every 200 steps): Adam's moments of a
    rank-1 random projection only set one scale per matrix for the raw gradient. 2-D
    non-embedding weights go to the projected group, as for GaLore."""
    try:
        from apollo_torch import APOLLOAdamW
    except ImportError as err:
        raise ImportError("optim=apollo_mini needs apollo-torch (and its bitsandbytes): "
                          "pip install -e '.[bench]'") from err

    groups = low_rank_groups(named_params, weight_decay, rank=rank, proj="random", scale_type=scale_type,
                             scale=scale, update_proj_gap=update_proj_gap, proj_type="std")
    return APOLLOAdamW(groups, lr=lr, betas=tuple(betas), eps=eps)


def sngd(named_params: NamedParams, weight_decay: float = 0.01, **kwargs):
    """SubspaceNGD; embeddings and norms/biases go to its fallback (project=False group)."""
    named = _named(named_params)
    groups = []
    for project in (True, False):
        for decay in (True, False):
            # (name, parameter) pairs: torch keeps the names (param_names), and SubspaceNGD keys
            # random subspaces, refresh offsets and load_state_dict by them.
            params = [(n, p) for n, p in named
                      if (not _is_embedding(n)) == project and _decays(n, p) == decay]
            if params:
                groups.append({"params": params, "project": project,
                               "weight_decay": weight_decay if decay else 0.0})
    return SubspaceNGD(groups, weight_decay=weight_decay, **kwargs)


def warmup_cosine(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int,
                  min_lr_ratio: float = 0.1) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up to the base lr over `warmup_steps`, then cosine decay to
    `min_lr_ratio` x base at `total_steps` (held there afterwards)."""
    if not (isinstance(total_steps, int) and total_steps > 0):
        raise ValueError(f"warmup_cosine: total_steps must be a positive int, got {total_steps!r}; "
                         "it is ${trainer.max_steps} in configs/optim/*.yaml — set "
                         "trainer.max_steps to a positive number of steps.")
    if warmup_steps < 0:
        raise ValueError(f"warmup_cosine: warmup_steps={warmup_steps} is negative; set "
                         "optim.scheduler.warmup_steps >= 0.")
    if warmup_steps >= total_steps:
        # Short smoke runs (trainer.max_steps=3) keep the config's warm-up: shorten it.
        warnings.warn(f"warmup_cosine: warmup_steps={warmup_steps} >= total_steps={total_steps}; "
                      f"using {total_steps - 1} warm-up steps.", stacklevel=2)
        warmup_steps = total_steps - 1

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
