"""Binds a launch's arguments: tensors become pointer values into memory regions, scalars are cast.

A tensor argument registers its whole untyped storage as a region, once per storage (several arguments
may view one storage). CPU storages are used in place, at their real addresses. A storage on another
device (CUDA) is copied to a CPU buffer before the launch and copied back after it (`finish`), and the
pointer handed to the kernel is the CPU buffer's address plus the view's byte offset, so the
addresses a kernel computes stay consistent with the regions.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from ..errors import LaunchError
from ..language.numerics import conversions
from ..language.dtypes import PointerType, float16, float32
from .memory import Memory, Region


@dataclasses.dataclass
class BoundArguments:
    """The value of each function argument (0-d NumPy arrays; pointers are int64 addresses), the
    memory they point into, and the device storages to refresh when the launch ends."""

    values: list
    memory: Memory
    pointer_names: dict          # id(function argument Value) -> argument name, for pointer args
    copy_backs: list             # (device byte tensor, CPU byte tensor) pairs

    def finish(self) -> None:
        """Copy CPU buffers back into the device storages they mirror."""
        for device_bytes, host_bytes in self.copy_backs:
            device_bytes.copy_(host_bytes)


def _byte_tensor(storage):
    import torch
    nbytes = storage.nbytes()
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage, 0, (nbytes,), (1,))


def bind_arguments(function, args: Sequence, names: Sequence[str]) -> BoundArguments:
    """Map `args` (one per `function.args`) to values and build the launch's memory.

    Raises TypeError when the count is wrong, when a pointer argument is not a torch.Tensor (or None,
    a null pointer), or when a scalar argument is not a Python/NumPy scalar.
    """
    import torch

    params = function.args
    if len(args) != len(params):
        raise TypeError(f"kernel {function.name} takes {len(params)} runtime arguments "
                        f"({', '.join(names)}), got {len(args)}")
    values, regions, copy_backs, pointer_names = [], {}, [], {}
    for param, name, arg in zip(params, names, args):
        if isinstance(param.type, PointerType):
            pointer_names[id(param)] = name
            if arg is None:
                values.append(np.asarray(0, dtype=np.int64))
                continue
            if not isinstance(arg, torch.Tensor):
                raise TypeError(f"argument {name!r} of kernel {function.name} is a pointer "
                                f"({param.type}); pass a torch.Tensor, got {type(arg).__name__}")
            if arg.device.type == "meta":
                raise ValueError(f"argument `{name}` of kernel {function.name} is a meta tensor, which has no "
                                 "data to run on")
            storage = arg.untyped_storage()
            view_offset = arg.data_ptr() - storage.data_ptr()
            key = (str(storage.device), storage.data_ptr(), storage.nbytes())     # (Memory merges overlaps)
            region = regions.get(key)
            if region is None:
                region = regions[key] = _register(storage, copy_backs)
            region.names.append(name)
            values.append(np.asarray(region.base + view_offset, dtype=np.int64))
        else:
            if isinstance(arg, np.ndarray) and arg.ndim == 0:
                arg = arg[()]
            if not isinstance(arg, (bool, int, float, np.generic)):
                raise TypeError(f"argument {name!r} of kernel {function.name} is a {param.type} "
                                f"scalar; pass a Python or NumPy scalar, got {type(arg).__name__}")
            try:
                value = conversions.from_python(arg, param.type)
            except OverflowError as error:
                if not param.type.is_floating:
                    raise ValueError(f"argument {name!r} of kernel {function.name}: {error}") from None
                value = None        # an int past float64's range
            if value is None or (param.type in (float16, float32) and np.isinf(value) and np.isfinite(float(arg))):
                # as a GPU launch packs it (launcher_args.ParamKind): a finite number past the type's range
                raise LaunchError(f"argument `{name}` of kernel {function.name}: expected a float within "
                                  f"{param.type}'s range, got {arg!r}")
            values.append(value)
    memory = Memory([r for r in regions.values() if r.nbytes > 0])
    return BoundArguments(values, memory, pointer_names, copy_backs)


def _register(storage, copy_backs: list) -> Region:
    device_bytes = _byte_tensor(storage)
    if storage.device.type == "cpu":
        host_bytes = device_bytes
    else:
        host_bytes = device_bytes.cpu()
        copy_backs.append((device_bytes, host_bytes))
    return Region(base=host_bytes.data_ptr(), nbytes=storage.nbytes(), data=host_bytes.numpy(), names=[])
