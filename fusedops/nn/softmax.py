"""`fusedops.nn.Softmax` and `fusedops.nn.LogSoftmax`: drop-ins for torch.nn.Softmax / LogSoftmax.

They subclass the torch modules, so the constructor, `dim` attribute, `extra_repr`, (empty)
state_dict, pickling and `isinstance(m, torch.nn.Softmax)` are torch's; only `forward` changes,
to `fusedops.softmax` / `fusedops.log_softmax` (which run torch's op on CPU tensors unless
FUSEDOPS_INTERPRET=1). `dim=None` keeps torch's legacy rule: a deprecation warning, then dim 0 for
0-, 1- and 3-d inputs and dim 1 otherwise. Under torch.jit.script the forward is torch's functional op.
A tensor input the op rejects (an integer, bool or complex dtype) raises RuntimeError, as torch's modules do (their
NotImplementedError is one; the functional ops raise TypeError, naming the argument); a `dim` that is not an int
raises TypeError and one out of range IndexError, as torch's.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from fusedops import functional
from fusedops.nn.normalization import _as_torch_error


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
    return _module_softmax(input, _legacy_dim(name, input.dim()), log)


def _module_softmax(input: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
    """fusedops.softmax (log_softmax) of `input` over `dim`, with the TypeError / ValueError it raises about a
    tensor `input` (an integer dtype, ...) raised as RuntimeError, as torch's modules raise them; a bad `dim` (the
    module's setting) keeps torch's TypeError / IndexError (checked only once the op has raised)."""
    op = functional.log_softmax if log else functional.softmax
    return _as_torch_error(input, lambda: op(input, dim),
                           lambda: functional.normalize_dim("log_softmax" if log else "softmax", dim, input.dim()))


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
        return _module_softmax(input, self.dim, False)


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
        return _module_softmax(input, self.dim, True)
