"""`fusedops.nn.LayerNorm` and `fusedops.nn.RMSNorm`: drop-ins for torch.nn.LayerNorm / RMSNorm.

They subclass the torch modules, so the constructor (normalized_shape, eps, elementwise_affine, bias
(LayerNorm), device, dtype), the `weight`/`bias` parameters and state_dict keys, reset_parameters,
extra_repr, pickling and `isinstance(m, torch.nn.LayerNorm)` are torch's; only `forward` changes, to
`fusedops.layer_norm` / `fusedops.rms_norm` (which run torch's op on CPU tensors unless
FUSEDOPS_INTERPRET=1). A tensor input the op rejects (its trailing dims not normalized_shape, a dtype
other than the parameters') raises RuntimeError, as torch's modules do (the functional ops raise
ValueError / TypeError, naming the argument).
"""

from __future__ import annotations

import torch

from fusedops import functional


def _as_torch_error(input, call):
    """call(), with the ValueError / TypeError it raises for a tensor `input` raised as RuntimeError."""
    try:
        return call()
    except (ValueError, TypeError) as error:
        if not isinstance(input, torch.Tensor):
            raise
        raise RuntimeError(str(error)) from error


class LayerNorm(torch.nn.LayerNorm):
    """Layer normalization over the trailing `normalized_shape` dims (see torch.nn.LayerNorm),
    computed by `fusedops.layer_norm`."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return _as_torch_error(input, lambda: functional.layer_norm(input, self.normalized_shape, self.weight,
                                                                     self.bias, self.eps))


class RMSNorm(torch.nn.RMSNorm):
    """Root-mean-square normalization over the trailing `normalized_shape` dims (see torch.nn.RMSNorm),
    computed by `fusedops.rms_norm`; eps=None is torch's default (see fusedops.rms_norm)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return _as_torch_error(input, lambda: functional.rms_norm(input, self.normalized_shape, self.weight,
                                                                   self.eps))
