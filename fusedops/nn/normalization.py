"""`fusedops.nn.LayerNorm` and `fusedops.nn.RMSNorm`: drop-ins for torch.nn.LayerNorm / RMSNorm.

They subclass the torch modules, so the constructor (normalized_shape, eps, elementwise_affine, bias
(LayerNorm), device, dtype), the `weight`/`bias` parameters and state_dict keys, reset_parameters,
extra_repr, pickling and `isinstance(m, torch.nn.LayerNorm)` are torch's; only `forward` changes, to
`fusedops.layer_norm` / `fusedops.rms_norm` (which run torch's op on CPU tensors unless
FUSEDOPS_INTERPRET=1).
"""

from __future__ import annotations

import torch

from fusedops import functional


class LayerNorm(torch.nn.LayerNorm):
    """Layer normalization over the trailing `normalized_shape` dims (see torch.nn.LayerNorm),
    computed by `fusedops.layer_norm`."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return functional.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)


class RMSNorm(torch.nn.RMSNorm):
    """Root-mean-square normalization over the trailing `normalized_shape` dims (see torch.nn.RMSNorm),
    computed by `fusedops.rms_norm`; eps=None is torch's default (see fusedops.rms_norm)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return functional.rms_norm(input, self.normalized_shape, self.weight, self.eps)
