"""Measured gradient + optimizer memory of one model under each optimizer, in one process and
under FSDP2 over 2 processes (gloo, this machine's CPU).

    python scripts/bench_optim_memory.py                          # model=base, the table in docs/optim.md
    python scripts/bench_optim_memory.py --model dociq-tiny --world 1
    python scripts/bench_optim_memory.py --device cuda --world 1      # on a GPU: allocated bytes


Each (optimizer, world size) runs in fresh processes, so one row's freed memory cannot hide
another's. Per process: build the model (fp32 weights), fill every trainable parameter's gradient
with Gaussian noise (the memory of a backward pass without its activations, which do not depend
on the optimizer), then take `--steps` optimizer steps. Measured with the process's RSS
(/proc/self/status; freed heap returned with malloc_trim before each reading):

- `grads`: the RSS rise when the gradients are allocated;
- `state`: the optimizer's persistent tensors, counted (what a checkpoint holds; SubspaceNGD's
  cached factors are added to it: memory held between steps);
- `held`: the RSS rise from before the first step to after the last (persistent state as the
  allocator sees it);
- `peak opt`: the highest RSS during any step (VmHWM, reset before each step) minus the RSS with
  weights and gradients only: state and every temporary of a step;
- `peak grad+opt`: the same peak minus the RSS with the weights only;
- `step ms`: the median time of one `opt.step()` after the first (which creates the state),
  synchronised on CUDA. On the CPU the timer starts after the memory probe's reset, but each step
  still runs on the pages that reset just returned to the system (they fault in afresh), alike for
  every optimizer. Give `--steps` > 2 for a median of several.

Under FSDP2 (`--world 2`) every block list is `fully_shard`ed as `trainer=fsdp_cpu` does and the
numbers are rank 0's (ranks hold equal shards). An optimizer that cannot step sharded parameters
gets its error in the table.

With `--device cuda` (one process: FSDP over one GPU has nothing to shard) the same quantities are
the CUDA caching allocator's allocated bytes (`torch.cuda.memory_allocated`, and
`max_memory_allocated` reset before each step for the peaks): exact, with no heap to trim.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_optim import StepMemory  # noqa: E402  (the same VmHWM probe as the step benchmark)

GB = 1e9
DEFAULT_OPTIMIZERS = "adamw,sngd_random,sngd_coordinates,galore,apollo_mini"


def rss(device: str = "cpu") -> int:
    """Bytes in use now: the process's RSS, or the CUDA allocator's allocated bytes."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    return StepMemory._status("VmRSS")


def build_optimizer(name: str, named: list):
    from dociq.optim import factory

    if name == "adamw":
        return factory.adamw(named, lr=1e-4, fused=True)
    if name == "galore":
        return factory.galore(named, rank=32, lr=1e-4)
    if name == "apollo_mini":
        return factory.apollo_mini(named, lr=1e-4)
    if name.startswith("sngd_"):
        return factory.sngd(named, lr=1e-4, rank=32, projector=name[len("sngd_"):])
    raise ValueError(f"unknown optimizer {name!r}: use {DEFAULT_OPTIMIZERS}")


def state_bytes(opt) -> int:
    """Persistent optimizer tensors on this process (its shards), plus SubspaceNGD's factor cache."""
    total = 0
    for st in opt.state.values():
        for value in st.values():
            if isinstance(value, torch.distributed.tensor.DTensor):
                value = value.to_local()
            if torch.is_tensor(value):
                total += value.numel() * value.element_size()
            elif getattr(value, "ortho_matrix", None) is not None:   # GaLore's / APOLLO's projector
                mats = value.ortho_matrix if isinstance(value.ortho_matrix, (list, tuple)) else [value.ortho_matrix]
                total += sum(m.numel() * m.element_size() for m in mats)
    return total + (opt.cache_bytes() if hasattr(opt, "cache_bytes") else 0)


def measure(model_name: str, optimizer: str, steps: int, mesh=None, device: str = "cpu") -> dict:
    import dociq

    torch.manual_seed(0)
    # random text-encoder weights: the same shapes as MiniLM's, without reading its files
    model = dociq.build_model(model_name, text_encoder={"pretrained": False}).to(device)
    if mesh is not None:
        from dociq.training.fsdp import shard_task
        shard_task(model, mesh)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    local = [p.to_local() if hasattr(p, "to_local") else p for _, p in named]
    params = sum(p.numel() for _, p in named)
    base = rss(device)
    for _, p in named:
        p.grad = torch.zeros_like(p)
        (p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad).normal_()
    with_grads = rss(device)
    opt = build_optimizer(optimizer, named)
    probe = StepMemory(device)
    peak, times = 0, []
    for _ in range(steps):
        probe.start()
        start = time.perf_counter()
        opt.step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        peak = max(peak, probe.base + probe.stop())
    after = rss(device)
    return {"optimizer": optimizer, "device": device, "params": params, "local_params": sum(p.numel() for p in local),
            "grads": with_grads - base, "state": state_bytes(opt), "held": after - with_grads,
            "peak_opt": peak - with_grads, "peak_grad_opt": peak - base,
            "step_s": statistics.median(times[1:]) if len(times) > 1 else None}


def _rank_main(rank: int, world: int, port: int, args, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        result = measure(args.model, args.optimizer, args.steps, init_device_mesh("cpu", (world,)))
    except Exception as err:   # an optimizer that cannot step DTensors: its error is the row
        result = {"optimizer": args.optimizer, "error": f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"}
    if rank == 0:
        Path(out).write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def worker(args) -> None:
    """One (optimizer, world) measurement; prints its JSON on the last line."""
    if args.world == 1:
        torch.set_num_threads(args.threads)
        try:
            result = measure(args.model, args.optimizer, args.steps, device=args.device)
        except Exception as err:
            result = {"optimizer": args.optimizer, "error": f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"}
    else:
        import torch.multiprocessing as mp

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "rank0.json")
            mp.spawn(_rank_main, args=(args.world, port, args, out), nprocs=args.world, join=True)
            result = json.loads(Path(out).read_text())
    result["world"] = args.world
    print(json.dumps(result))


def table(rows: list[dict]) -> str:
    lines = ["| optimizer | processes | params per process | grads GB | state GB (counted) | held GB | "
             "peak opt GB | peak grad+opt GB | peak opt / AdamW's | step ms | step / AdamW's |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    adamw = {r["world"]: r for r in rows if r["optimizer"] == "adamw" and "error" not in r}
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['optimizer']} | {r['world']} | | | | | | | fails: {r['error']} | | |")
            continue
        base = adamw.get(r["world"])
        ratio = r["peak_opt"] / base["peak_opt"] if base else float("nan")
        step = f"{1000 * r['step_s']:.1f}" if r.get("step_s") else "-"
        step_ratio = f"{r['step_s'] / base['step_s']:.2f}x" if base and r.get("step_s") and base.get("step_s") else "-"
        lines.append(f"| {r['optimizer']} | {r['world']} | {r['local_params'] / 1e6:.1f} M | {r['grads'] / GB:.2f} | "
                     f"{r['state'] / GB:.3f} | {r['held'] / GB:.3f} | {r['peak_opt'] / GB:.3f} | "
                     f"{r['peak_grad_opt'] / GB:.2f} | {ratio:.2f}x | {step} | {step_ratio} |")
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="dociq-base", help="a registered model name (dociq.list_models())")
    ap.add_argument("--optimizers", default=DEFAULT_OPTIMIZERS)
    ap.add_argument("--world", type=int, nargs="+", default=[1, 2], help="process counts; >1 is FSDP2 over gloo")
    ap.add_argument("--steps", type=int, default=2, help="optimizer steps per run (the first creates the state)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (one process: --world 1)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--optimizer", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.device != "cpu" and args.world != [1]:
        ap.error(f"--device {args.device} measures one process: pass --world 1 (FSDP here is gloo over CPU processes)")
    if args.worker:
        args.world = args.world[0]
        worker(args)
        return []
    rows = []
    for world in args.world:
        for name in args.optimizers.split(","):
            cmd = [sys.executable, __file__, "--worker", "--optimizer", name, "--world", str(world),
                   "--model", args.model, "--steps", str(args.steps), "--threads", str(args.threads),
                   "--device", args.device]
            done = subprocess.run(cmd, capture_output=True, text=True)
            last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
            try:
                row = json.loads(last)
            except json.JSONDecodeError:
                row = {"optimizer": name, "world": world,
                       "error": (done.stderr.strip().splitlines() or ["no output"])[-1][:160]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
