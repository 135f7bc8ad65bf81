"""`fusedops.nn.Softmax` and `fusedops.nn.LogSoftmax`: drop-ins for torch.nn.Softmax / LogSoftmax.

They subclass the torch modules, so the constructor, `dim` attribute, `extra_repr`, (empty)
state_dict, pickling and `isinstance(m, torch.nn.Softmax)` are torch's; only `forward` changes,
to `fusedops.softmax` / `fusedops.log_softmax` (which run torch's op on CPU tensors unless
FUSEDOPS_INTERPRET=1). `dim=None` keeps torch's legacy rule: a deprecation warning, then dim 0 for
0-, 1- and 3-d inputs and dim 1 otherwise.
"""

from __future__ import annotations

import warnings

import torch

from fusedops import functional


def _legacy_dim(name: str, ndim: int) -> int:
    # torch.nn.functional._get_softmax_dim, which torch keeps private: same warning, same rule (not while
    # torch.compile traces: dynamo cannot trace warnings.warn, and a fullgraph compile would fail).
    if not torch.compiler.is_compiling():
        warnings.warn(f"Implicit dimension choice for {name} has been deprecated. "
                      "Change the call to include dim=X as an argument.", stacklevel=5)
    return 0 if ndim in (0, 1, 3) else 1


class Softmax(torch.nn.Softmax):
    """Softmax over `dim` (see torch.nn.Softmax), computed by `fusedops.softmax`."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        dim = self.dim if self.dim is not None else _legacy_dim("softmax", input.dim())
        return functional.softmax(input, dim)


class LogSoftmax(torch.nn.LogSoftmax):
    """Log-softmax over `dim` (see torch.nn.LogSoftmax), computed by `fusedops.log_softmax`."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        dim = self.dim if self.dim is not None else _legacy_dim("log_softmax", input.dim())
        return functional.log_softmax(input, dim)
