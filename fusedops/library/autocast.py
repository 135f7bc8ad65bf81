"""torch's autocast policy for the fusedops operators, and its registration for direct callers.

`autocast_dtype(op, device_type)` states torch's autocast policy for each op (softmax, log_softmax,
layer_norm: float32 on CUDA; rms_norm: float32 on CUDA where the installed torch casts it (2.12 on), else
not cast; matmul and scaled_dot_product_attention: the autocast dtype on CUDA and CPU); fusedops.functional
applies it in eager mode and under tracing, and `register_autocast()` registers the same policy with
`torch.library.register_autocast` for callers of `torch.ops.fusedops.*` (fusedops.functional casts before
calling).
"""

from __future__ import annotations

from typing import Optional

import torch

from fusedops.library.common import NAMESPACE

# op -> {device type: "float32" | "lower"}, as torch's autocast lists (aten/src/ATen/autocast_mode.cpp):
# on CUDA softmax/log_softmax/layer_norm run in float32 and matmul/linear and scaled_dot_product_attention
# in the autocast dtype; on the CPU only matmul/linear and scaled_dot_product_attention are autocast.
# rms_norm joined the CUDA float32 list in torch 2.12 (pytorch#188955); before, torch ran it in the input's
# dtype (seen on the H200 with torch 2.11: an fp16 input under fp16 autocast gives an fp16 output). Which one
# the installed torch does shows as an AutocastCUDA kernel of aten::rms_norm.
_TORCH_CASTS_RMS_NORM = torch._C._dispatch_has_kernel_for_dispatch_key("aten::rms_norm", "AutocastCUDA")
AUTOCAST_POLICY = {
    "softmax": {"cuda": "float32"},
    "log_softmax": {"cuda": "float32"},
    "layer_norm": {"cuda": "float32"},
    **({"rms_norm": {"cuda": "float32"}} if _TORCH_CASTS_RMS_NORM else {}),
    "matmul": {"cuda": "lower", "cpu": "lower"},
    "scaled_dot_product_attention": {"cuda": "lower", "cpu": "lower"},
}


def autocast_dtype(op: str, device_type: str) -> Optional[torch.dtype]:
    """The dtype torch's autocast would run `op` in on `device_type` right now, or None when autocast
    is off there or leaves the op alone. Only float16/bfloat16/float32 tensors are cast (float64 is
    not eligible, as in torch)."""
    policy = AUTOCAST_POLICY.get(op, {}).get(device_type)
    if policy is None or not torch.is_autocast_enabled(device_type):
        return None
    return torch.float32 if policy == "float32" else torch.get_autocast_dtype(device_type)


def autocast_cast(tensor: Optional[torch.Tensor], dtype: Optional[torch.dtype]) -> Optional[torch.Tensor]:
    """`tensor` cast to `dtype` if autocast would cast it (a floating tensor other than float64)."""
    if (dtype is None or not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point()
            or tensor.dtype in (dtype, torch.float64)):
        return tensor
    return tensor.to(dtype)


# A torch.library.Library deregisters its kernels when garbage-collected: the ones registered here
# live as long as this module.
_LIBRARIES: list = []


def register_autocast() -> None:
    """Register AUTOCAST_POLICY for the operators `torch.ops.fusedops.*` (which must exist by now).
    Called once, by fusedops.library's __init__, after every operator module has been imported."""
    if not hasattr(torch.library, "register_autocast"):    # torch < 2.5: only the functional path casts
        return
    for op, devices in AUTOCAST_POLICY.items():
        for device_type, policy in devices.items():
            if policy == "float32":
                torch.library.register_autocast(f"{NAMESPACE}::{op}", device_type, torch.float32)
            else:
                # Cast to whatever dtype autocast runs in (float16 or bfloat16), read at call time.
                _register_lower_precision_autocast(f"{NAMESPACE}::{op}", device_type)


def _register_lower_precision_autocast(name: str, device_type: str) -> None:
    key = {"cuda": "AutocastCUDA", "cpu": "AutocastCPU"}[device_type]
    library = torch.library.Library(NAMESPACE, "IMPL")
    _LIBRARIES.append(library)
    op = getattr(torch.ops.fusedops, name.partition("::")[2]).default

    def kernel(*args, **kwargs):
        dtype = torch.get_autocast_dtype(device_type)
        args = [autocast_cast(t, dtype) if isinstance(t, torch.Tensor) else t for t in args]
        with torch.autocast(device_type, enabled=False):
            return op(*args, **kwargs)

    library.impl(name.partition("::")[2], kernel, key)
