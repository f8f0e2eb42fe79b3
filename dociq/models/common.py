"""Small layers and helpers shared by the prompt encoder and the mask decoder.

Layers: SAM's head MLP, and timm's LayerNorm2d re-exported (same `weight`/`bias` keys as SAM's).
Helpers: named-size resolution (the sizes live in dociq.models.sizes). Reading checkpoints
given as a state dict or a path is `dociq.io.checkpoint.load_state_dict_like`.
"""
from __future__ import annotations

import inspect
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from timm.layers import LayerNorm2d  # noqa: F401  (channels-first LayerNorm, eps 1e-6 as SAM)
from torch import nn

from dociq.models.sizes import part_config


def exporting() -> bool:
    """True while torch.export / torch.onnx trace the model: the few places whose Python control
    flow depends on tensor values or sizes then take a branch-free path with the same results."""
    return torch.compiler.is_exporting() or torch.onnx.is_in_onnx_export()


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


def resolve_size(what: str, part: str, size: str, overrides: Mapping[str, Any], cls: type) -> dict[str, Any]:
    """Constructor kwargs of `part` at named `size` (dociq.models.sizes), with `overrides` checked
    against `cls.__init__`'s parameters."""
    config = part_config(size, part)
    valid = set(inspect.signature(cls.__init__).parameters) - {"self"}
    unknown = sorted(set(overrides) - valid)
    if unknown:
        raise TypeError(f"{what}.from_size({size!r}): unknown override(s) {unknown}; valid keys: {sorted(valid)}")
    return {**config, **overrides}
