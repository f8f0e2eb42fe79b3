"""Small layers and helpers shared by the prompt encoder and the mask decoder.

Layers: SAM's head MLP, and timm's LayerNorm2d re-exported (same `weight`/`bias` keys as SAM's).
Helpers: named-size resolution (timm-style registries) and reading checkpoints given as a state
dict or a path.
"""
from __future__ import annotations

import inspect
import os
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from timm.layers import LayerNorm2d  # noqa: F401  (channels-first LayerNorm, eps 1e-6 as SAM)
from torch import Tensor, nn


class MLP(nn.Module):
    """`num_layers` Linear layers with ReLU between them (MaskFormer/SAM's head MLP).

    Used for the hypernetworks that turn mask tokens into per-token conv weights and for the IoU head.
    """

    def __init__(
        self,
        input_dim: int,
        hidden_dim: int,
        output_dim: int,
        num_layers: int,
        sigmoid_output: bool = False,
    ) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"MLP num_layers must be >= 1, got {num_layers}")
        dims_in = [input_dim] + [hidden_dim] * (num_layers - 1)
        dims_out = [hidden_dim] * (num_layers - 1) + [output_dim]
        self.layers = nn.ModuleList(nn.Linear(i, o) for i, o in zip(dims_in, dims_out))
        self.sigmoid_output = sigmoid_output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers[:-1]:
            x = F.relu(layer(x))
        x = self.layers[-1](x)
        return torch.sigmoid(x) if self.sigmoid_output else x


def resolve_size(
    what: str, sizes: Mapping[str, Mapping[str, Any]], size: str, overrides: Mapping[str, Any], cls: type
) -> dict[str, Any]:
    """Constructor kwargs of named `size`, with `overrides` checked against `cls.__init__`'s parameters."""
    if size not in sizes:
        raise KeyError(f"{what}: unknown size {size!r}; choose one of {sorted(sizes)}")
    valid = set(inspect.signature(cls.__init__).parameters) - {"self"}
    unknown = sorted(set(overrides) - valid)
    if unknown:
        raise TypeError(f"{what}.from_size({size!r}): unknown override(s) {unknown}; valid keys: {sorted(valid)}")
    return {**sizes[size], **overrides}


def load_state_dict_like(state_dict_or_path: Mapping[str, Tensor] | str | os.PathLike, what: str) -> dict:
    """A state dict given directly or as a checkpoint path (`read_checkpoint`), unwrapping {"model": ...}."""
    if isinstance(state_dict_or_path, (str, os.PathLike)):
        path = os.fspath(state_dict_or_path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{what}: checkpoint {path!r} does not exist; pass the path of a local .pth file")
        from dociq.io.checkpoint import read_checkpoint

        state = read_checkpoint(path)
    else:
        state = state_dict_or_path
    if isinstance(state, Mapping) and isinstance(state.get("model"), Mapping):  # SAM 2 checkpoints
        state = state["model"]
    if not isinstance(state, Mapping):
        raise TypeError(f"{what}: expected a state dict (name -> tensor), got {type(state).__name__}")
    return dict(state)


def strip_prefix(state: dict, prefixes: tuple[str, ...]) -> dict:
    """Keep only the keys under the first prefix that occurs (a sub-module of a full checkpoint), unprefixed."""
    for prefix in prefixes:
        if any(k.startswith(prefix) for k in state):
            return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    return state
