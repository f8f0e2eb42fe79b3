"""MultiBlockMasking (I-JEPA multi-block masks) and MLMMasking (BERT 15% / 80-10-10)."""
import math
from collections import Counter

import pytest
import torch

from dociq.data.masking import MLMMasking, MultiBlockMasking


# ---- I-JEPA multi-block masks ------------------------------------------------------------------

def reference_multiblock(height, width, batch_size, generator, npred=4, pred_scale=(0.15, 0.2),
                         aspect=(0.75, 1.5), enc_scale=(0.85, 1.0), min_keep=4, timeout=20):
    """facebookresearch/ijepa src/masks/multiblock.py MaskCollator.__call__ (nenc=1,
    allow_overlap=False), restated: one rand drives a block's scale and aspect; block sides are
    capped at grid-1; corners come from randint(0, grid - side) (exclusive); a context that stays
    too small for `timeout` tries drops the last remaining target constraint; contexts are cut to
    the batch minimum. Returns (ctx list, targets list, overlaps) before stacking."""
    def block_size(scale, ar_range):
        r = torch.rand(1, generator=generator).item()
        keep = int(height * width * (scale[0] + r * (scale[1] - scale[0])))
        ar = ar_range[0] + r * (ar_range[1] - ar_range[0])
        h, w = int(round(math.sqrt(keep * ar))), int(round(math.sqrt(keep / ar)))
        return min(h, height - 1), min(w, width - 1)

    def block(size, regions=None):
        h, w = size
        tries, left_tries = 0, timeout
        while True:
            top = int(torch.randint(0, height - h, (1,), generator=generator))
            left = int(torch.randint(0, width - w, (1,), generator=generator))
            m = torch.zeros(height, width, dtype=torch.bool)
            m[top:top + h, left:left + w] = True
            full = m.clone()
            for region in (regions or [])[:max(len(regions or []) - tries, 0)]:
                m &= region
            if int(m.sum()) > min_keep:
                return m, ~full
            left_tries -= 1
            if left_tries == 0:
                tries, left_tries = tries + 1, timeout

    p_size = block_size(pred_scale, aspect)
    e_size = block_size(enc_scale, (1.0, 1.0))
    contexts, targets, overlaps = [], [], 0
    for _ in range(batch_size):
        blocks = [block(p_size) for _ in range(npred)]
        ctx, _ = block(e_size, [c for _, c in blocks])
        overlaps += int(any((ctx & t).any() for t, _ in blocks))
        contexts.append(ctx.flatten().nonzero().squeeze(1))
        targets.append([t.flatten().nonzero().squeeze(1) for t, _ in blocks])
    return contexts, targets, overlaps


def _stats(sampler, batches, batch_size):
    sizes, ctx_counts, ctx_untruncated = Counter(), [], []
    for _ in range(batches):
        ctx, tgt = sampler(batch_size)
        sizes[tgt.shape[-1]] += 1
        ctx_counts.append(ctx.shape[1])
    return sizes, torch.tensor(ctx_counts, dtype=torch.float)


@pytest.mark.parametrize("grid", [8, 14])
def test_context_never_contains_targets_and_shapes_are_uniform(grid):
    masking = MultiBlockMasking(grid)
    g = torch.Generator().manual_seed(0)
    for _ in range(30):
        ctx, tgt = masking(6, g)
        assert ctx.dtype == tgt.dtype == torch.long
        assert ctx.dim() == 2 and ctx.shape[0] == 6 and tgt.shape[:2] == (6, 4)
        assert ctx.shape[1] > 4 and 0 <= int(ctx.min()) and int(ctx.max()) < grid * grid
        for b in range(6):
            assert len(set(ctx[b].tolist())) == ctx.shape[1]                      # distinct units
            assert not set(ctx[b].tolist()) & set(tgt[b].flatten().tolist())     # no target in context
            for block in tgt[b]:                                                  # a target is a rectangle
                rows, cols = block // grid, block % grid
                assert (rows.max() - rows.min() + 1) * (cols.max() - cols.min() + 1) == len(block)


def test_same_generator_seed_gives_same_masks():
    masking = MultiBlockMasking(8)
    a = masking(4, torch.Generator().manual_seed(3))
    b = masking(4, torch.Generator().manual_seed(3))
    c = masking(4, torch.Generator().manual_seed(4))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, c))


@pytest.mark.parametrize("grid", [8, 14])
def test_matches_reference_collator_statistics(grid):
    """With the reference placement (inclusive_edges=False) our masks follow the reference
    collator's distributions on the same grid: the same target block sizes with the same
    frequencies, the same batch context sizes, and no context/target overlap in either (the
    reference's fallback that drops a constraint never fires on these grids)."""
    batches, batch_size = 200, 8
    ours = MultiBlockMasking(grid, inclusive_edges=False)
    g_ours, g_ref = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
    our_sizes, our_ctx = _stats(lambda b: ours(b, g_ours), batches, batch_size)

    ref_sizes, ref_ctx, ref_overlaps = Counter(), [], 0
    for _ in range(batches):
        contexts, targets, overlaps = reference_multiblock(grid, grid, batch_size, g_ref)
        ref_sizes[len(targets[0][0])] += 1
        ref_ctx.append(min(len(c) for c in contexts))
        ref_overlaps += overlaps
    ref_ctx = torch.tensor(ref_ctx, dtype=torch.float)
    assert ref_overlaps == 0

    assert set(our_sizes) == set(ref_sizes)
    for size in ref_sizes:  # frequencies of each block size agree (binomial 4-sigma band)
        p = ref_sizes[size] / batches
        assert abs(our_sizes[size] / batches - p) < 4 * math.sqrt(p * (1 - p) / batches) + 0.02
    sem = math.sqrt(our_ctx.var() / batches + ref_ctx.var() / batches)
    assert abs(our_ctx.mean() - ref_ctx.mean()) < 4 * sem + 0.5
    assert abs(our_ctx.std() - ref_ctx.std()) < 0.25 * ref_ctx.std() + 0.5
    # the reference never reaches the last row/column; neither does our reference mode
    last = [grid * grid - 1 - i for i in range(grid)] + [r * grid + grid - 1 for r in range(grid)]
    ctx, tgt = ours(64, g_ours)
    assert not set(last) & (set(ctx.flatten().tolist()) | set(tgt.flatten().tolist()))


def test_inclusive_edges_reach_every_unit():
    masking = MultiBlockMasking(8)  # default
    g = torch.Generator().manual_seed(0)
    seen_ctx, seen_tgt = set(), set()
    for _ in range(40):
        ctx, tgt = masking(8, g)
        seen_ctx |= set(ctx.flatten().tolist())
        seen_tgt |= set(tgt.flatten().tolist())
    assert seen_ctx == set(range(64)) and seen_tgt == set(range(64))


def test_impossible_settings_fail_early_with_the_key():
    with pytest.raises(ValueError, match="min_keep"):
        MultiBlockMasking(4)            # 4x4 grid: target blocks of 2-3 units <= min_keep=4
    with pytest.raises(ValueError, match="target_scale"):
        MultiBlockMasking(8, target_scale=(0.3, 0.2))
    MultiBlockMasking(4, num_targets=2, target_scale=(0.2, 0.3), min_keep=2)  # fine when consistent


# ---- MLM ------------------------------------------------------------------------------------------

def _text_batch(b=64, t=512, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 30000, (b, t), generator=g)
    special = torch.zeros(b, t, dtype=torch.bool)
    special[:, 0] = special[:, -1] = True                  # [CLS] ... [SEP]
    lengths = torch.randint(t // 2, t, (b,), generator=g)
    special |= torch.arange(t)[None, :] >= lengths[:, None]  # padding
    return ids, special


def test_mlm_statistics_on_a_large_batch():
    ids, special = _text_batch()
    masking = MLMMasking(mask_token_id=103, vocab_size=30522)
    mlm_ids, labels = masking(ids, special, torch.Generator().manual_seed(1))
    chosen = labels != -100
    eligible = ~special
    assert not (chosen & special).any()                           # never special/padding
    assert torch.equal(labels[chosen], ids[chosen])                # labels hold the originals
    assert torch.equal(mlm_ids[~chosen], ids[~chosen])             # nothing else changes
    rate = chosen.sum() / eligible.sum()
    assert abs(rate - 0.15) < 0.01
    n = chosen.sum().item()
    masked = (mlm_ids[chosen] == 103).sum().item() / n
    kept = (mlm_ids[chosen] == ids[chosen]).sum().item() / n
    random = 1 - masked - kept
    assert abs(masked - 0.8) < 0.02 and abs(kept - 0.1) < 0.02 and abs(random - 0.1) < 0.02
    assert (mlm_ids >= 0).all() and (mlm_ids < 30522).all()


def test_mlm_respects_allowed_and_masks_at_least_one_per_row():
    ids, special = _text_batch(b=32, t=64, seed=2)
    allowed = torch.zeros_like(special)
    allowed[:16, 5] = True                       # rows 0-15: exactly one allowed, eligible token
    allowed[16:24, 10:40] = True                 # rows 16-23: a band
    # rows 24-31: nothing allowed -> nothing masked
    masking = MLMMasking(103, 30522, visible_only=True)
    _, labels = masking(ids, special, torch.Generator().manual_seed(0), allowed=allowed)
    chosen = labels != -100
    assert not (chosen & ~allowed).any()
    assert chosen[:24].any(1).all()
    assert chosen[:16, 5].all()
    assert not chosen[24:].any()
    with pytest.raises(ValueError, match="allowed"):
        masking(ids, special, torch.Generator())


def test_mlm_is_deterministic_for_a_seed():
    ids, special = _text_batch(b=4, t=32)
    masking = MLMMasking(103, 30522)
    a = masking(ids, special, torch.Generator().manual_seed(5))
    b = masking(ids, special, torch.Generator().manual_seed(5))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
