"""Factories and configs/optim/*.yaml: parameter routing, schedules, Hydra instantiation."""
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from dociq.optim import factory
from dociq.optim.sngd import SubspaceNGD

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "optim"


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embed = torch.nn.Embedding(100, 64)
        self.proj = torch.nn.Linear(64, 64)
        self.norm = torch.nn.LayerNorm(64)
        self.head = torch.nn.Linear(64, 10)

    def forward(self, ids):
        return self.head(self.norm(torch.relu(self.proj(self.tok_embed(ids)))))


def _named(model):
    return list(model.named_parameters())


def test_sngd_routes_embeddings_and_vectors_to_the_fallback():
    model = Tiny()
    opt = factory.sngd(_named(model), lr=1e-3, rank=8, weight_decay=0.1, min_numel=256)
    projected = {p for g in opt.param_groups for p in g["params"] if opt.is_projected(p, g)}
    assert projected == {model.proj.weight, model.head.weight}
    decay = {p for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert decay == {model.tok_embed.weight, model.proj.weight, model.head.weight}
    ids = torch.randint(0, 100, (4, 7))
    model(ids).sum().backward()
    opt.step()
    assert "history" in opt.state[model.proj.weight]
    assert "exp_avg" in opt.state[model.tok_embed.weight] and "exp_avg" in opt.state[model.norm.weight]


def test_galore_projects_matrices_only():
    model = Tiny()
    opt = factory.galore(_named(model), rank=4, update_proj_gap=5, lr=1e-3)
    low = [g for g in opt.param_groups if "rank" in g]
    assert len(low) == 1 and set(low[0]["params"]) == {model.proj.weight, model.head.weight}
    model(torch.randint(0, 100, (4, 7))).sum().backward()
    opt.step()
    assert opt.state[model.proj.weight]["exp_avg"].shape == (64, 4)    # Adam state in rank 4


def test_apollo_mini_projects_matrices_to_rank_one():
    model = Tiny()
    opt = factory.apollo_mini(_named(model), lr=1e-3)
    low = [g for g in opt.param_groups if "rank" in g]
    assert len(low) == 1 and set(low[0]["params"]) == {model.proj.weight, model.head.weight}
    assert low[0]["rank"] == 1 and low[0]["scale_type"] == "tensor"
    before = model.proj.weight.detach().clone()
    model(torch.randint(0, 100, (4, 7))).sum().backward()
    opt.step()
    assert opt.state[model.proj.weight]["exp_avg"].numel() == 64        # Adam state of a rank-1 projection
    assert not torch.equal(model.proj.weight, before)


def test_adamw_decay_groups():
    model = Tiny()
    opt = factory.adamw(_named(model), lr=1e-3, weight_decay=0.05)
    wd = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    assert wd[id(model.proj.weight)] == 0.05 and wd[id(model.proj.bias)] == 0.0
    assert wd[id(model.norm.weight)] == 0.0


def test_adamw_lr_scales_give_parts_their_own_rate_under_the_schedule():
    model = Tiny()
    opt = factory.adamw(_named(model), lr=1e-3, weight_decay=0.05, lr_scales={r"^proj\.": 0.1})
    lr = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    wd = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    assert lr[id(model.proj.weight)] == pytest.approx(1e-4) and lr[id(model.proj.bias)] == pytest.approx(1e-4)
    assert lr[id(model.norm.weight)] == pytest.approx(1e-3)
    assert wd[id(model.proj.weight)] == 0.05 and wd[id(model.proj.bias)] == 0.0   # decay rules kept
    sched = factory.warmup_cosine(opt, warmup_steps=2, total_steps=10)
    opt.step()
    sched.step()
    lr = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    assert lr[id(model.proj.weight)] / lr[id(model.norm.weight)] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="'image_encoder' matches no trainable parameter"):
        factory.adamw(_named(model), lr_scales={"image_encoder": 0.1})


def test_warmup_cosine_shape_and_errors():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = factory.warmup_cosine(opt, warmup_steps=4, total_steps=20, min_lr_ratio=0.1)
    lrs = []
    for _ in range(25):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert lrs[12] == pytest.approx(0.1 + 0.9 * 0.5)          # half way through the decay
    assert lrs[20] == pytest.approx(0.1) and lrs[24] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:]))
    with pytest.raises(ValueError, match="trainer.max_steps"):
        factory.warmup_cosine(opt, warmup_steps=4, total_steps=-1)
    with pytest.raises(ValueError, match="warmup_steps"):
        factory.warmup_cosine(opt, warmup_steps=-1, total_steps=20)
    with pytest.warns(UserWarning, match="using 2 warm-up steps"):
        short = factory.warmup_cosine(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0),
                                      warmup_steps=10, total_steps=3)
    assert short.get_last_lr()[0] == pytest.approx(0.5)


def test_empty_parameter_list_is_a_clear_error():
    with pytest.raises(ValueError, match="no trainable parameters"):
        factory.sngd([])


@pytest.mark.parametrize("name,cls,strategy", [("adamw", torch.optim.AdamW, None),
                                               ("galore", None, None), ("natural_galore", None, None), ("apollo_mini", None, None),
                                               ("sngd", SubspaceNGD, "sngd")])
def test_optim_configs_instantiate(name, cls, strategy):
    cfg = OmegaConf.create({"trainer": {"max_steps": 50},
                            "optim": OmegaConf.load(CONFIGS / f"{name}.yaml")})
    OmegaConf.resolve(cfg)
    model = Tiny()
    opt = instantiate(cfg.optim.optimizer)(_named(model))
    sched = instantiate(cfg.optim.scheduler)(opt)
    if cls is not None:
        assert isinstance(opt, cls)
    assert type(opt).__name__ in ("AdamW", "NaturalGaLoreAdamW", "SubspaceNGD")
    assert isinstance(sched, torch.optim.lr_scheduler.LRScheduler)
    assert cfg.optim.strategy == strategy
    model(torch.randint(0, 100, (2, 5))).sum().backward()
    opt.step()
    sched.step()
