"""`fusedops.nn.LayerNorm` and `fusedops.nn.RMSNorm`: drop-ins for torch.nn.LayerNorm / RMSNorm.

They subclass the torch modules, so the constructor (normalized_shape, eps, elementwise_affine, bias
(LayerNorm), device, dtype), the `weight`/`bias` parameters and state_dict keys, reset_parameters,
extra_repr, pickling and `isinstance(m, torch.nn.LayerNorm)` are torch's; only `forward` changes (keeping
torch's parameter names: LayerNorm's `input`, RMSNorm's `x`), to `fusedops.layer_norm` / `fusedops.rms_norm`
(which run torch's op on CPU tensors unless FUSEDOPS_INTERPRET=1). A tensor input the op rejects (its trailing
dims not normalized_shape, a dtype other than the parameters') raises RuntimeError, as torch's modules do (the
functional ops raise ValueError / TypeError, naming the argument). Under torch.jit.script the forward is torch's
functional op (TorchScript cannot compile the calls into the kernels; the scripted module runs torch's op).
"""

from __future__ import annotations

import numbers

import torch
import torch.nn.functional as F

from fusedops import functional
from fusedops.autograd import norms as _norms


def _as_torch_error(input, call, check_settings=None):
    """call(), with the ValueError / TypeError it raises about a tensor `input` raised as RuntimeError, as
    torch's modules raise them. The module's own settings keep their errors: checked before (`_check_settings`),
    or by `check_settings()`, run only once call() has raised (off the hot path), which raises its own."""
    try:
        return call()
    except (ValueError, TypeError) as error:
        if not isinstance(input, torch.Tensor):
            raise
        if check_settings is not None:
            check_settings()
        raise RuntimeError(str(error)) from error


def _check_settings(name: str, normalized_shape, eps, eps_optional: bool) -> None:
    """TypeError, as torch's argument parser raises it, for an eps that is not a number (None where
    `eps_optional`) or a normalized_shape that is not a tuple of ints (settings of the module, not errors
    about its input, which torch raises as RuntimeError)."""
    # (as torch's parser: a 0-d real tensor is a float, a 0-d integer tensor or a NumPy integer a size)
    number = isinstance(eps, numbers.Real) or (isinstance(eps, torch.Tensor) and eps.dim() == 0
                                                and not eps.is_complex())
    if not (number or (eps is None and eps_optional)):
        raise TypeError(f"{name}(): argument 'eps' must be float, not {type(eps).__name__}")
    if not all(_norms.is_size(d) for d in normalized_shape):
        raise TypeError(f"{name}(): argument 'normalized_shape' must be tuple of ints, got {normalized_shape!r}")


class LayerNorm(torch.nn.LayerNorm):
    """Layer normalization over the trailing `normalized_shape` dims (see torch.nn.LayerNorm),
    computed by `fusedops.layer_norm`."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():     # torch.jit.script: torch's op (the kernels are called from Python)
            return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)
        return self._fused_forward(input)

    @torch.jit.unused
    def _fused_forward(self, input: torch.Tensor) -> torch.Tensor:
        _check_settings("layer_norm", self.normalized_shape, self.eps, False)
        return _as_torch_error(input, lambda: functional.layer_norm(input, self.normalized_shape, self.weight,
                                                                     self.bias, self.eps))


class RMSNorm(torch.nn.RMSNorm):
    """Root-mean-square normalization over the trailing `normalized_shape` dims (see torch.nn.RMSNorm),
    computed by `fusedops.rms_norm`; eps=None is torch's default (see fusedops.rms_norm)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (the parameter is `x`, as torch.nn.RMSNorm.forward names it: `norm(x=h)` and kwargs hooks see torch's name)
        if torch.jit.is_scripting():     # torch.jit.script: torch's op (the kernels are called from Python)
            return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)
        return self._fused_forward(x)

    @torch.jit.unused
    def _fused_forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_settings("rms_norm", self.normalized_shape, self.eps, True)
        if isinstance(x, torch.Tensor) and x.dim() < len(self.normalized_shape):
            # torch.nn.RMSNorm's ValueError (LayerNorm's is a RuntimeError, as _as_torch_error raises it)
            raise ValueError(f"Input tensor must have at least {len(self.normalized_shape)} dimensions, but got "
                             f"{x.dim()}")
        return _as_torch_error(x, lambda: functional.rms_norm(x, self.normalized_shape, self.weight, self.eps))
