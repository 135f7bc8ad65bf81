"""`fusedops.nn.Linear`: a drop-in for torch.nn.Linear with an optional fused activation.

    y = activation(x @ weight^T + bias)      weight: (out_features, in_features), bias: (out_features,)

It subclasses torch.nn.Linear, so the constructor arguments, parameter names and initialization,
state_dict, `extra_repr` and `isinstance(m, torch.nn.Linear)` are torch's; `activation` (None,
"relu", "gelu", "gelu_tanh", "silu") is the one addition. The forward is one `fusedops.matmul`:
the weight is read transposed in place (no copy), the bias add and the activation run in the
matmul's epilogue. CPU tensors run torch's ops (unless FUSEDOPS_INTERPRET=1).
"""

from __future__ import annotations

import math

from typing import Optional

import torch

from fusedops import functional
from fusedops.autograd.matmul import ACTIVATIONS, apply_activation


class Linear(torch.nn.Linear):
    """torch.nn.Linear(in_features, out_features, bias, device, dtype) plus `activation` (keyword only)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None, *,
                 activation: Optional[str] = None):
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.activation = activation

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if isinstance(input, torch.Tensor) and input.is_nested:      # no (rows, in_features) view: torch's ops
            return apply_activation(torch.nn.functional.linear(input, self.weight, self.bias), self.activation)
        if input.shape[-1:] != (self.in_features,):
            raise ValueError(f"Linear expects inputs whose last dim is {self.in_features}, got {tuple(input.shape)}")
        # a view for contiguous (and most strided) inputs; the row count spelled out for in_features == 0
        rows = input.reshape(math.prod(input.shape[:-1]), self.in_features)
        out = functional.matmul(rows, self.weight.t(), self.bias, self.activation)
        return out.reshape(*input.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        text = super().extra_repr()
        return text + (f", activation={self.activation!r}" if self.activation is not None else "")
