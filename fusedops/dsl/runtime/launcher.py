"""Checks and conversions of a launch: the grid, num_warps, devices, the target architecture."""

from __future__ import annotations

import operator
import re

from ..errors import LaunchError

_GRID_LIMITS = (2**31 - 1, 65535, 65535)
_ARCH = re.compile(r"sm_[0-9]{2,3}a?")


def normalize_grid(grid, kernel: str) -> tuple:
    """`grid` (1 to 3 non-negative ints) as a 3-tuple.

    Raises:
        LaunchError: not a tuple of 1-3 ints, a negative entry, or an entry over the CUDA limit
            (2**31 - 1 along x, 65535 along y and z).
    """
    if type(grid) is tuple:     # the common cases, checked quickly (launches call this every time)
        size = len(grid)
        if size == 1:
            x = grid[0]
            if type(x) is int and 0 <= x <= 0x7FFFFFFF:
                return (x, 1, 1)
        elif size == 2:
            x, y = grid
            if type(x) is int and type(y) is int and 0 <= x <= 0x7FFFFFFF and 0 <= y <= 65535:
                return (x, y, 1)
        elif size == 3:
            x, y, z = grid
            if type(x) is int and type(y) is int and type(z) is int and 0 <= x <= 0x7FFFFFFF \
                    and 0 <= y <= 65535 and 0 <= z <= 65535:
                return grid
    if not isinstance(grid, (tuple, list)):
        if isinstance(grid, bool) or not hasattr(grid, "__index__"):
            raise LaunchError(f"the grid of `{kernel}` must be a tuple of 1 to 3 ints (or a callable returning "
                              f"one), got {type(grid).__name__}")
        grid = (grid,)
    if not 1 <= len(grid) <= 3:
        raise LaunchError(f"the grid of `{kernel}` must have 1 to 3 dimensions, got {len(grid)}: {tuple(grid)}")
    sizes = []
    for axis, size in enumerate(grid):
        if isinstance(size, bool):
            raise LaunchError(f"grid entry {axis} of `{kernel}` is a bool; pass an int")
        try:
            size = operator.index(size)
        except TypeError:
            raise LaunchError(f"grid entry {axis} of `{kernel}` must be an int, got {type(size).__name__} "
                              f"{size!r}") from None
        if size < 0 or size > _GRID_LIMITS[axis]:
            raise LaunchError(f"grid entry {axis} of `{kernel}` is {size}; it must be in [0, {_GRID_LIMITS[axis]}]")
        sizes.append(size)
    return tuple(sizes) + (1,) * (3 - len(sizes))


def warps_and_stages_problem(num_warps, num_stages) -> tuple:
    """(argument, what it must be) for a bad num_warps / num_stages, or None: num_warps must be a power of two
    in 1..32 and num_stages an int >= 1 (launches and dsl.Config check the same)."""
    if isinstance(num_warps, bool) or not isinstance(num_warps, int) or num_warps not in (1, 2, 4, 8, 16, 32):
        return "num_warps", f"must be a power of two from 1 to 32, got {num_warps!r}"
    if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1:
        return "num_stages", f"must be a positive int, got {num_stages!r}"
    return None


DEFAULT_NUM_WARPS, DEFAULT_NUM_STAGES = 4, 3


def check_num_warps(num_warps, num_stages, kernel: str) -> tuple:
    """(num_warps, num_stages) of a launch, None taken as the default (4, 3), as Triton takes it.

    Raises:
        LaunchError: unless num_warps is a power of two in 1..32 and num_stages an int >= 1.
    """
    num_warps = DEFAULT_NUM_WARPS if num_warps is None else num_warps
    num_stages = DEFAULT_NUM_STAGES if num_stages is None else num_stages
    problem = warps_and_stages_problem(num_warps, num_stages)
    if problem is not None:
        raise LaunchError(f"{problem[0]} of `{kernel}` {problem[1]}")
    return num_warps, num_stages


def check_interpret(interpret, kernel: str) -> None:
    """Raises LaunchError for an `interpret` given as text (True, False or None, FUSEDOPS_INTERPRET then
    deciding, are meant): a string such as "no" would otherwise read as true."""
    if isinstance(interpret, (str, bytes)):
        raise LaunchError(f"interpret of `{kernel}` must be True, False or None, got {interpret!r}")


def check_arch(arch: str) -> str:
    if not isinstance(arch, str) or not _ARCH.fullmatch(arch):
        raise ValueError(f"target must name a GPU architecture like sm_80, sm_90 or sm_90a, got {arch!r}")
    return arch


def cuda_device(kernel: str, params, values):
    """The one CUDA device of the tensor arguments (None when there are none).

    Raises:
        ValueError: a CPU (or other non-CUDA) tensor, naming the argument, or tensors on two devices.
    """
    import torch

    device = None
    for param, value in zip(params, values):
        if not isinstance(value, torch.Tensor):
            continue
        if value.device.type != "cuda":
            raise ValueError(f"argument `{param.name}` of kernel `{kernel}` is a {value.device.type} tensor; "
                             "compiled kernels need CUDA tensors. Move it with .cuda(), or run the kernel in the "
                             "interpreter (FUSEDOPS_INTERPRET=1 or interpret=True), which also takes CPU tensors")
        if device is None:
            device = value.device
        elif value.device != device:
            raise ValueError(f"argument `{param.name}` of kernel `{kernel}` is on {value.device} but an earlier "
                             f"tensor argument is on {device}; all tensors of a launch must be on one device")
    return device


def device_arch(device) -> str:
    """The target architecture of a CUDA device: "sm_90a" for compute capability 9.0, else sm_<major><minor>."""
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}" + ("a" if (major, minor) == (9, 0) else "")


def check_cluster_grid(grid, cluster_size: int, kernel: str) -> None:
    """Raises LaunchError unless grid axis 0 (an int or the first entry of a grid tuple) is a multiple of
    `cluster_size` (`dsl.cluster_dims`)."""
    x = grid[0] if isinstance(grid, (tuple, list)) else grid
    if x % cluster_size:
        raise LaunchError(f"`{kernel}` runs in clusters of {cluster_size} programs (dsl.cluster_dims({cluster_size})): "
                          f"its grid's axis 0 must be a multiple of {cluster_size}, got {x}")


class ClusterLauncher:
    """A kernel launcher (kernel_launcher.KernelLauncher's `launch`/`stream_of`, or a wrapper of it) for a kernel
    launched in clusters: `launch(grid, stream, values)` checks the grid first (`check_cluster_grid`).
    Every launch path goes through it (wrappers are never inlined, runtime/launch_plans.py)."""

    def __init__(self, launcher, cluster_size: int, kernel: str):
        self.launcher = launcher
        self.stream_of = launcher.stream_of
        inner = launcher.launch

        def launch(grid, stream, values) -> None:
            if grid[0] % cluster_size:
                check_cluster_grid(grid, cluster_size, kernel)
            inner(grid, stream, values)

        self.launch = launch

    def __getattr__(self, name):
        return getattr(self.launcher, name)
