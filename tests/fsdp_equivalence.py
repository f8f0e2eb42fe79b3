"""Train one small model for N steps in one process on a global batch, and sharded with FSDP2
(dociq's `shard_task`) over `--world` gloo processes on loopback, each rank taking its share of
the same global batch. Writes JSON: the losses of both runs per optimizer, the optimizer state
bytes (one process; per rank under FSDP), and the final weights' largest difference.

    python tests/fsdp_equivalence.py --out result.json [--steps 20] [--world 2]
"""
from __future__ import annotations

import argparse
import json
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from dociq.optim.factory import adamw, sngd
from dociq.training.fsdp import shard_task

VOCAB, WIDTH, HIDDEN, BATCH, LENGTH = 61, 48, 97, 8, 12
# Small ranks and a short refresh period, so the steps cover uneven shards of k and of the
# rows, refresh carries, and both the projected and the fallback (embedding, norms) paths.
SNGD = dict(lr=3e-3, rank=7, history=4, refresh_every=5, weight_decay=0.01)
OPTIMIZERS = {"adamw": None, "sngd": "random", "sngd_coordinates": "coordinates"}   # name -> SubspaceNGD projector


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, HIDDEN)
        self.down = nn.Linear(HIDDEN, WIDTH)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        logits = self.head(x[:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def make_optimizer(name: str, model: nn.Module):
    named = list(model.named_parameters())
    if OPTIMIZERS[name] is None:
        return adamw(named, lr=3e-3, fused=True)
    return sngd(named, **SNGD, projector=OPTIMIZERS[name])


def batches(steps: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (steps, BATCH, LENGTH), generator=torch.Generator().manual_seed(1))


def train(model: nn.Module, optimizer, data: torch.Tensor, reduce=None) -> list[float]:
    losses = []
    for tokens in data:
        loss = model(tokens)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        value = loss.detach().clone()
        if reduce is not None:
            value = reduce(value)
        losses.append(float(value))
    return losses


def state_bytes(optimizer) -> int:
    if hasattr(optimizer, "state_bytes"):
        return optimizer.state_bytes()
    return sum((v.to_local() if hasattr(v, "to_local") else v).numel() * v.element_size()
               for st in optimizer.state.values() for v in st.values() if torch.is_tensor(v))


def full_weights(model: nn.Module) -> dict:
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in model.named_parameters()}


def sharded_run(rank: int, world: int, port: int, steps: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (world,))
        data = batches(steps)
        share = BATCH // world
        local = data[:, rank * share:(rank + 1) * share]
        result = {}
        for name in OPTIMIZERS:
            torch.manual_seed(0)
            model = TinyLM()
            shard_task(model, mesh)
            optimizer = make_optimizer(name, model)

            def mean(t):
                dist.all_reduce(t)
                return t / world
            losses = train(model, optimizer, local, reduce=mean)
            weights = full_weights(model)
            sizes = [None] * world
            dist.all_gather_object(sizes, state_bytes(optimizer))
            result[name] = dict(losses=losses, state_bytes=sizes,
                                weights={n: w.tolist() for n, w in weights.items()})
        if rank == 0:
            out.update(result)
        # Neither rank tears its connections down while the other still finishes the last
        # collective: a gloo peer closed mid-receive aborts the process (seen once on CI).
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _worker(rank, world, port, steps, path):
    out = {}
    sharded_run(rank, world, port, steps, out)
    if rank == 0:
        with open(path, "w") as f:
            json.dump(out, f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--world", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    single = {}
    data = batches(args.steps)
    for name in OPTIMIZERS:
        torch.manual_seed(0)
        model = TinyLM()
        optimizer = make_optimizer(name, model)
        losses = train(model, optimizer, data)
        single[name] = dict(losses=losses, state_bytes=state_bytes(optimizer), weights=full_weights(model))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    shard_path = args.out + ".sharded"
    mp.spawn(_worker, args=(args.world, port, args.steps, shard_path), nprocs=args.world)
    with open(shard_path) as f:
        sharded = json.load(f)
    os.remove(shard_path)
    report = {}
    for name in single:
        diff = max(float((single[name]["weights"][n] - torch.tensor(w)).abs().max())
                   for n, w in sharded[name]["weights"].items())
        report[name] = dict(single_losses=single[name]["losses"], sharded_losses=sharded[name]["losses"],
                            single_state_bytes=single[name]["state_bytes"],
                            sharded_state_bytes=sharded[name]["state_bytes"], max_weight_diff=diff)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
