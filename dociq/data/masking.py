"""Masking as part of collation (I-JEPA style): which image units / text tokens a stage hides.

`MultiBlockMasking` samples I-JEPA's multi-block masks on the grid of Hiera mask units;
`MLMMasking` applies BERT's 15% / 80-10-10 corruption to WordPiece ids. Both draw every random
number from the `torch.Generator` they are given, so a seeded collator is reproducible.
The collator (`dociq.data.collate.DocumentCollator`) calls them; no model code lives here.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch



def _pair(grid: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(grid, int):
        return grid, grid
    grid = tuple(int(g) for g in grid)
    if len(grid) != 2:
        raise ValueError(f"grid must be an int or (height, width), got {grid}")
    return grid  # type: ignore[return-value]


class MultiBlockMasking:
    """I-JEPA multi-block masks on a (height, width) grid of mask units.

    Per batch, one target block size (from `target_scale` x `target_aspect`) and one context
    block size (from `context_scale`, aspect 1) are drawn; per sample, `num_targets` target blocks
    and one context block are placed at random, and the context loses every target unit
    (`allow_overlap=False`). The context is re-placed until it keeps more than `min_keep` units;
    if that fails `max_tries` times the sample's targets are redrawn (the reference instead lets
    the context overlap a target, which would break "the context never sees a target").
    Every sample keeps the same number of context units (the batch minimum; the lowest unit
    indices are kept, as in the reference collator) because Hiera's sparse forward needs equal
    counts.

    Follows facebookresearch/ijepa `src/masks/multiblock.py`, including its coupling of scale
    and aspect ratio through one random number. One deliberate difference, switchable:
    the reference draws a block's top-left corner with an exclusive upper bound and caps a block
    at grid-1 rows/columns, so no block ever touches the last row or column (on an 8x8 grid 15 of
    64 units are never in the context). `inclusive_edges=True` (default) lets blocks reach every
    unit; `inclusive_edges=False` reproduces the reference placement exactly.

    __call__(batch_size, generator) -> (ctx_idx long [B, Nc], tgt_idx long [B, M, Nt]); indices
    are row-major unit indices (r * width + c), ascending within a block.
    """

    def __init__(
        self,
        grid: int | Sequence[int],
        num_targets: int = 4,
        target_scale: Sequence[float] = (0.15, 0.2),
        target_aspect: Sequence[float] = (0.75, 1.5),
        context_scale: Sequence[float] = (0.85, 1.0),
        min_keep: int = 4,
        allow_overlap: bool = False,
        max_tries: int = 20,
        inclusive_edges: bool = True,
    ) -> None:
        self.height, self.width = _pair(grid)
        if self.height < 2 or self.width < 2:
            raise ValueError(f"MultiBlockMasking needs a grid of at least 2x2 units, got {self.height}x"
                             f"{self.width}: raise model.image_size or lower model.mask_unit_px")
        for name, rng in (("target_scale", target_scale), ("context_scale", context_scale),
                          ("target_aspect", target_aspect)):
            if len(rng) != 2 or not 0 < rng[0] <= rng[1] or (name.endswith("scale") and rng[1] > 1):
                raise ValueError(f"data.image_masking.{name} must be (low, high) with 0 < low <= high"
                                 f"{' <= 1' if name.endswith('scale') else ''}, got {tuple(rng)}")
        if num_targets < 1:
            raise ValueError(f"data.image_masking.num_targets must be >= 1, got {num_targets}")
        self.num_targets = num_targets
        self.target_scale = tuple(float(s) for s in target_scale)
        self.target_aspect = tuple(float(a) for a in target_aspect)
        self.context_scale = tuple(float(s) for s in context_scale)
        self.min_keep = min_keep
        self.allow_overlap = allow_overlap
        self.max_tries = max_tries
        self.inclusive_edges = inclusive_edges
        # A target block is never constrained, so a block size at or under min_keep could never
        # be accepted: reject such settings now instead of looping forever at collate time.
        smallest = min(h * w for h, w in (self.block_size(r, self.target_scale, self.target_aspect)
                                          for r in torch.linspace(0, 1, 101).tolist()))
        if smallest <= min_keep:
            raise ValueError(
                f"data.image_masking: on a {self.height}x{self.width} grid target_scale="
                f"{self.target_scale} gives target blocks of {smallest} units, not more than "
                f"min_keep={min_keep}; raise target_scale or the grid size, or lower min_keep")

    @property
    def grid(self) -> tuple[int, int]:
        return self.height, self.width

    def block_size(self, r: float, scale: Sequence[float], aspect: Sequence[float]) -> tuple[int, int]:
        """(rows, cols) of a block for the uniform draw r: one number sets both scale and aspect."""
        area = int(self.height * self.width * (scale[0] + r * (scale[1] - scale[0])))
        ratio = aspect[0] + r * (aspect[1] - aspect[0])
        h, w = int(round(math.sqrt(area * ratio))), int(round(math.sqrt(area / ratio)))
        cap = 0 if self.inclusive_edges else 1
        return max(1, min(h, self.height - cap)), max(1, min(w, self.width - cap))

    def _place(self, size: tuple[int, int], generator: torch.Generator) -> torch.Tensor:
        """A bool [H, W] block of `size` at a random top-left corner."""
        h, w = size
        extra = 1 if self.inclusive_edges else 0
        top = int(torch.randint(0, self.height - h + extra, (1,), generator=generator))
        left = int(torch.randint(0, self.width - w + extra, (1,), generator=generator))
        block = torch.zeros(self.height, self.width, dtype=torch.bool)
        block[top:top + h, left:left + w] = True
        return block

    def _sample_one(self, tgt_size, ctx_size, generator):
        for _ in range(self.max_tries):
            targets = [self._place(tgt_size, generator) for _ in range(self.num_targets)]
            allowed = torch.ones(self.height, self.width, dtype=torch.bool)
            if not self.allow_overlap:
                for t in targets:
                    allowed &= ~t
            for _ in range(self.max_tries):
                context = self._place(ctx_size, generator) & allowed
                if int(context.sum()) > self.min_keep:
                    return context, targets
        raise RuntimeError(
            f"MultiBlockMasking found no context of more than min_keep={self.min_keep} units outside "
            f"{self.num_targets} targets of {tgt_size} on a {self.height}x{self.width} grid in "
            f"{self.max_tries}x{self.max_tries} tries: lower num_targets/target_scale or min_keep")

    def __call__(self, batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        tgt_size = self.block_size(float(torch.rand(1, generator=generator)), self.target_scale,
                                   self.target_aspect)
        ctx_size = self.block_size(float(torch.rand(1, generator=generator)), self.context_scale,
                                   (1.0, 1.0))
        contexts, targets = [], []
        for _ in range(batch_size):
            context, blocks = self._sample_one(tgt_size, ctx_size, generator)
            contexts.append(context.flatten().nonzero().squeeze(1))
            targets.append(torch.stack([b.flatten().nonzero().squeeze(1) for b in blocks]))
        keep = min(len(c) for c in contexts)
        ctx_idx = torch.stack([c[:keep] for c in contexts])
        return ctx_idx, torch.stack(targets)

    def __repr__(self) -> str:
        return (f"MultiBlockMasking(grid={self.grid}, num_targets={self.num_targets}, "
                f"target_scale={self.target_scale}, target_aspect={self.target_aspect}, "
                f"context_scale={self.context_scale}, min_keep={self.min_keep}, "
                f"allow_overlap={self.allow_overlap}, inclusive_edges={self.inclusive_edges})")


class MLMMasking:
    """BERT masking: `prob` of the eligible tokens are chosen; of those 80% become
    `mask_token_id`, 10% a random id in [0, vocab_size), 10% stay. Labels hold the original id at
    chosen positions and -100 elsewhere (PyTorch's cross-entropy ignore index).

    Eligible = not `special_mask` (the caller marks [CLS]/[SEP]/padding there) and, when given,
    `allowed`. Every row with at least one eligible token gets at least one chosen token, so no
    page contributes an empty loss. `visible_only=True` declares that the caller must pass
    `allowed` (D-JEPA: only words inside visible image units); the collator reads the flag.
    """

    IGNORE_INDEX = -100

    def __init__(self, mask_token_id: int, vocab_size: int, prob: float = 0.15,
                 visible_only: bool = False) -> None:
        if not 0 < prob < 1:
            raise ValueError(f"data.text_masking.prob must be in (0, 1), got {prob}")
        if not 0 <= mask_token_id < vocab_size:
            raise ValueError(f"data.text_masking.mask_token_id={mask_token_id} is outside the vocabulary "
                             f"[0, {vocab_size}): set it to the tokenizer's [MASK] id")
        self.mask_token_id = mask_token_id
        self.vocab_size = vocab_size
        self.prob = prob
        self.visible_only = visible_only

    def __call__(self, ids: torch.Tensor, special_mask: torch.Tensor, generator: torch.Generator,
                 allowed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if ids.dim() != 2 or special_mask.shape != ids.shape:
            raise ValueError(f"MLMMasking needs ids [B,T] and special_mask of the same shape, got "
                             f"{tuple(ids.shape)} and {tuple(special_mask.shape)}")
        if allowed is None and self.visible_only:
            raise ValueError("MLMMasking(visible_only=True) needs `allowed` (tokens in visible units); "
                             "the collator computes it from ctx_idx when data.image_masking is set")
        eligible = ~special_mask.bool()
        if allowed is not None:
            if allowed.shape != ids.shape:
                raise ValueError(f"MLMMasking: allowed has shape {tuple(allowed.shape)}, ids {tuple(ids.shape)}")
            eligible &= allowed.bool()
        chosen = (torch.rand(ids.shape, generator=generator) < self.prob) & eligible
        # Rows where the draw chose nothing but something was eligible: choose one eligible token.
        empty = ~chosen.any(1) & eligible.any(1)
        if empty.any():
            score = torch.rand(ids.shape, generator=generator).masked_fill(~eligible, -1.0)
            pick = score.argmax(1)
            chosen[empty.nonzero().squeeze(1), pick[empty]] = True
        labels = torch.where(chosen, ids, torch.full_like(ids, self.IGNORE_INDEX))
        action = torch.rand(ids.shape, generator=generator)
        random_ids = torch.randint(0, self.vocab_size, ids.shape, generator=generator, dtype=ids.dtype)
        mlm_ids = torch.where(chosen & (action < 0.8), torch.full_like(ids, self.mask_token_id), ids)
        mlm_ids = torch.where(chosen & (action >= 0.8) & (action < 0.9), random_ids, mlm_ids)
        return mlm_ids, labels

    def __repr__(self) -> str:
        return (f"MLMMasking(mask_token_id={self.mask_token_id}, vocab_size={self.vocab_size}, "
                f"prob={self.prob}, visible_only={self.visible_only})")
