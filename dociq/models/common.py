"""Small layers and helpers shared by the prompt encoder and the mask decoder.

Layers: SAM's head MLP, and timm's LayerNorm2d re-exported (same `weight`/`bias` keys as SAM's).
Helpers: `build_part`, a part built from its section of a model config (dociq.models.sizes).
Reading checkpoints given as a state dict or a path is `dociq.io.checkpoint.load_state_dict_like`.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

import torch
import torch.nn.functional as F
from timm.layers import LayerNorm2d  # noqa: F401  (channels-first LayerNorm, eps 1e-6 as SAM)
from torch import nn

from dociq.models.sizes import ModelConfigError


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


def build_part(build: Callable[..., Any], part: str, model: Mapping[str, Any], **derived: Any) -> Any:
    """`build(**model[part], **derived)`: a part from its section of a complete model config plus the
    arguments that follow from the rest of the model (widths of its neighbours, the page size). A
    derived argument written in the config, or a key `build` does not take, is a ModelConfigError
    naming it (a `build` that takes **kwargs checks its own keys)."""
    given = dict(model[part])
    clash = sorted(set(given) & set(derived))
    if clash:
        raise ModelConfigError(f"model.{part}.{clash[0]} is set, but it follows from the rest of the model "
                               "config", f"remove model.{part}.{clash[0]}")
    parameters = inspect.signature(build).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        valid = sorted(set(parameters) - {"self"} - set(derived))
        unknown = sorted(set(given) - set(valid))
        if unknown:
            raise ModelConfigError(f"unknown model.{part} key(s) {unknown}", f"use {', '.join(valid)}")
    return build(**given, **derived)
