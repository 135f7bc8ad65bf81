"""`fusedops.nn.Linear`: a drop-in for torch.nn.Linear with an optional fused activation.

    y = activation(x @ weight^T + bias)      weight: (out_features, in_features), bias: (out_features,)

It subclasses torch.nn.Linear, so the constructor arguments, parameter names and initialization,
state_dict, `extra_repr` and `isinstance(m, torch.nn.Linear)` are torch's; `activation` (None,
"relu", "gelu", "gelu_tanh", "silu") is the one addition. The forward is one `fusedops.matmul`:
the weight is read transposed in place (no copy), the bias add and the activation run in the
matmul's epilogue. CPU tensors run torch's ops (unless FUSEDOPS_INTERPRET=1), and so does the module under
torch.jit.script (F.linear and the activation).
"""

from __future__ import annotations

import math

from typing import Optional

import torch

from fusedops import functional
from fusedops.autograd.function_host import torch_modes_active
from fusedops.autograd.matmul_reference import ACTIVATIONS, apply_activation

_PLAIN = (torch.Tensor, torch.nn.Parameter)


class Linear(torch.nn.Linear):
    """torch.nn.Linear(in_features, out_features, bias, device, dtype) plus `activation` (keyword only)."""

    # the attribute's type for torch.jit.script (class annotations are strings under `from __future__ import
    # annotations`, which TorchScript does not resolve for module attributes)
    __annotations__ = {"activation": Optional[str]}

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None, *,
                 activation: Optional[str] = None):
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.activation = activation

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():     # torch.jit.script: torch's ops (the kernels are called from Python)
            return apply_activation(torch.nn.functional.linear(input, self.weight, self.bias), self.activation)
        return self._fused_forward(input)

    @torch.jit.unused
    def _fused_forward(self, input: torch.Tensor) -> torch.Tensor:
        return linear(input, self.weight, self.bias, self.activation)

    def extra_repr(self) -> str:
        text = super().extra_repr()
        return text + (f", activation={self.activation!r}" if self.activation is not None else "")


@torch.fx.wrap     # a leaf of torch.fx.symbolic_trace: one call_function node (the shape checks need sizes)
def linear(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
           activation: Optional[str] = None) -> torch.Tensor:
    """activation(input @ weight^T + bias), fusedops.nn.Linear's forward: one `fusedops.matmul`.

    Args:
        input: (..., in_features); weight: (out_features, in_features), input's dtype (outside autocast);
            bias: (out_features,) or None; activation: None, "relu", "gelu", "gelu_tanh" or "silu".
    Returns:
        (..., out_features).
    Raises:
        RuntimeError, as torch.nn.functional.linear: a 0-d input, an input whose last dim is not
            in_features, an input of another dtype than weight's. TypeError: input, weight or bias (but None)
            is not a tensor (torch.nn.functional.linear's error).

    Outside torch.compile, a tensor subclass among the arguments (e.g. a quantized or scaled weight that implements
    F.linear in its __torch_function__) and an active torch function or dispatch mode (but torch.device's) run
    torch.nn.functional.linear, as torch.nn.Linear calls it, so that the subclass or mode sees the `linear` call (not
    its parts). Nested and sparse tensors (no (rows, in_features) view), a weight that is not 2-D, an integer or
    complex weight (or complex input), a bias of another dtype than the weight's (torch raises there, outside
    autocast) and a bias of another shape than (out_features,) (torch broadcasts a (1,) or 0-d one onto the output,
    and raises where it does not broadcast) run torch.nn.functional.linear too. Under torch.jit.trace
    fusedops.matmul runs torch's ops (see functional.needs_torch), and the row count and the reshapes follow the
    input's sizes in the trace.
    """
    if (not isinstance(input, torch.Tensor) or not isinstance(weight, torch.Tensor)
            or not isinstance(bias, (torch.Tensor, type(None))) or subclass_or_mode(input, weight, bias)
            or input.is_nested or input.layout is not torch.strided
            or weight.layout is not torch.strided or weight.dim() != 2 or input.is_complex()
            or not weight.is_floating_point()
            or (bias is not None and (bias.dtype != weight.dtype or bias.shape != weight.shape[:1]))):
        return apply_activation(torch.nn.functional.linear(input, weight, bias), activation)
    in_features = weight.shape[-1]
    if input.shape[-1:] != (in_features,):
        got = "a 0-d tensor" if input.dim() == 0 else f"shape {tuple(input.shape)}"
        raise RuntimeError(f"fusedops.nn.Linear: expected 'input' of shape (..., {in_features}) (its last dim "
                           f"in_features), got {got}")
    # a view for contiguous (and most strided) inputs; the row count spelled out for in_features == 0
    rows = input.reshape(math.prod(input.shape[:-1]), in_features)
    try:
        out = functional.matmul(rows, weight.t(), bias, activation)
    except TypeError as error:      # fusedops.matmul's error; torch's F.linear raises RuntimeError
        if input.dtype != weight.dtype:
            raise RuntimeError(f"fusedops.nn.Linear: expected 'input' of the weight's dtype {weight.dtype}, got "
                               f"{input.dtype}") from error
        raise
    return out.reshape(*input.shape[:-1], weight.shape[0])


def subclass_or_mode(*tensors: Optional[torch.Tensor]) -> bool:
    """Whether a module runs torch's own calls for a tensor subclass among `tensors` (None skipped) or an active
    torch mode (see `linear`; not while torch.compile traces, where the fusedops ops are custom ops, as
    functional.needs_torch decides): type checks, then two C calls where no mode is active. needs_torch's other
    cases (forward-mode AD, jit.trace, ...) take the fusedops ops' own torch route."""
    if torch.compiler.is_compiling():
        return False
    return any(t is not None and type(t) not in _PLAIN for t in tensors) or torch_modes_active()
