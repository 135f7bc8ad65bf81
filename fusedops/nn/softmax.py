"""`fusedops.nn.Softmax` and `fusedops.nn.LogSoftmax`: drop-ins for torch.nn.Softmax / LogSoftmax.

They subclass the torch modules, so the constructor, `dim` attribute, `extra_repr`, (empty)
state_dict, pickling and `isinstance(m, torch.nn.Softmax)` are torch's; only `forward` changes,
to `fusedops.softmax` / `fusedops.log_softmax` (which run torch's op on CPU tensors unless
FUSEDOPS_INTERPRET=1). `dim=None` keeps torch's legacy rule: a deprecation warning, then dim 0 for
0-, 1- and 3-d inputs and dim 1 otherwise. Under torch.jit.script the forward is torch's functional op.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from fusedops import functional


def _legacy_dim(name: str, ndim: int) -> int:
    # torch.nn.functional._get_softmax_dim, which torch keeps private: same warning, same rule (not while
    # torch.compile traces: dynamo cannot trace warnings.warn, and a fullgraph compile would fail).
    if not torch.compiler.is_compiling():
        warnings.warn(f"Implicit dimension choice for {name} has been deprecated. "
                      "Change the call to include dim=X as an argument.", stacklevel=7)
    return 0 if ndim in (0, 1, 3) else 1


@torch.fx.wrap      # a leaf of torch.fx.symbolic_trace: the legacy rule needs the input's rank, a Proxy has none
def _implicit_dim_softmax(input: torch.Tensor, log: bool) -> torch.Tensor:
    """fusedops.softmax (log_softmax) of `input` over the dim torch's legacy rule picks for dim=None."""
    name = "log_softmax" if log else "softmax"
    dim = _legacy_dim(name, input.dim())
    return functional.log_softmax(input, dim) if log else functional.softmax(input, dim)


class Softmax(torch.nn.Softmax):
    """Softmax over `dim` (see torch.nn.Softmax), computed by `fusedops.softmax`."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():     # torch.jit.script: torch's op (the kernels are called from Python)
            return F.softmax(input, self.dim)
        return self._fused_forward(input)

    @torch.jit.unused
    def _fused_forward(self, input: torch.Tensor) -> torch.Tensor:
        if self.dim is None:
            return _implicit_dim_softmax(input, False)
        return functional.softmax(input, self.dim)


class LogSoftmax(torch.nn.LogSoftmax):
    """Log-softmax over `dim` (see torch.nn.LogSoftmax), computed by `fusedops.log_softmax`."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():     # torch.jit.script: torch's op (the kernels are called from Python)
            return F.log_softmax(input, self.dim)
        return self._fused_forward(input)

    @torch.jit.unused
    def _fused_forward(self, input: torch.Tensor) -> torch.Tensor:
        if self.dim is None:
            return _implicit_dim_softmax(input, True)
        return functional.log_softmax(input, self.dim)
