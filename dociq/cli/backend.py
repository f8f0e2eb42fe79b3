"""The model behind `dociq predict` and `dociq segment`: torch (a checkpoint or a model folder) or
onnxruntime (a model folder with ONNX graphs, `dociq export CKPT DIR --onnx`). The onnx backend
imports no torch: the torch modules are imported only when the torch backend is chosen."""
from __future__ import annotations

import argparse
from pathlib import Path

BACKENDS = ("torch", "onnx")


def add_backend_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=BACKENDS, default="torch",
                   help="onnx: the folder's ONNX graphs on onnxruntime, no torch (`dociq export CKPT DIR --onnx`)")
    p.add_argument("--device", default="cpu", help="torch device (--backend torch; default cpu)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads of torch or onnxruntime (default: the library's own)")


def load_backend(args: argparse.Namespace):
    """The Predictor (torch) or the OnnxPredictor (onnx) of `args.checkpoint`, as `args.backend` says."""
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads {args.threads}: give 1 or more")
    if args.backend == "torch":
        import torch

        # deferred: the onnx backend must run where torch is not installed
        from dociq.inference.predictor import load_predictor
        if args.threads:
            torch.set_num_threads(args.threads)
        return load_predictor(args.checkpoint, args.device)
    if not Path(args.checkpoint).is_dir():
        raise ValueError(f"--backend onnx reads a model folder, and {args.checkpoint} is not one: export it with "
                         "`dociq export CKPT DIR --onnx` and give DIR")
    # deferred: onnxruntime is imported only when the onnx backend is asked for
    from dociq.inference.onnx_predictor import OnnxPredictor
    return OnnxPredictor(args.checkpoint, threads=args.threads)
