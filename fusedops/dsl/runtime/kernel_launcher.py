"""KernelLauncher: a prepared launch of one loaded kernel, and the statements that inline it.

Launch cost (TOOLCHAIN.md, measured on the H200): passing `kernelParams` as the int address of a
pre-packed `void*` array is the cheapest form cuda-python takes (4.1 us per launch); see
`launcher_args`. Cached launches skip cuda-python through a native stub (`KernelLauncher.native_stub`,
native_launch.py).

The driver is reached through the `driver` module's attributes at call time (`driver.cuda_driver()`,
`driver.raw_stream_getter()`), so that a test's patch of the driver module reaches launchers too.
"""

from __future__ import annotations

import contextlib
import functools
import struct
from typing import Callable, Mapping, NamedTuple, Optional, Sequence

from fusedops.dsl.errors import LaunchError
from fusedops.dsl.runtime import driver
from fusedops.dsl.runtime.launcher_args import ArgumentPacker, ParamKind

_MAX_GRID = (2**31 - 1, 65535, 65535)


class KernelLauncher:
    """A prepared launch of one kernel: argument packing plan, block size and dynamic shared memory.

    param_kinds: the ParamKind of each kernel parameter (see launcher_args.param_kind).
    num_warps: the block has 32 * num_warps threads (1-D blocks).
    shared_bytes: dynamic shared memory per CTA, opted in here when above 48 KB.

    `launch(grid, stream, args)` (an attribute built once by `_build_launch`) launches on
    grid = (gx, gy, gz) program instances on the raw `stream` handle with the argument values
    `args` (device pointers as ints, scalars as Python numbers).

    The legacy default stream, handle 0 (torch's current stream unless another was set), is passed
    to cuLaunchKernel as None: cuda-python takes None as is but makes a CUstream of an int first
    (~0.9k instructions of the ~5.4k its call costs).

    Raises:
        LaunchError: the block is larger than the kernel allows, or the shared memory does not fit.
    """

    def __init__(self, kernel: driver.LoadedKernel, param_kinds: Sequence[ParamKind], num_warps: int,
                 shared_bytes: int = 0, param_names: Optional[Sequence[str]] = None):
        threads = 32 * num_warps
        if num_warps < 1 or threads > kernel.max_threads_per_block:
            raise LaunchError(f"num_warps={num_warps} gives {threads} threads per block, but kernel {kernel.name!r} "
                              f"allows at most {kernel.max_threads_per_block} (registers: {kernel.num_registers})")
        driver.set_dynamic_shared_memory(kernel, shared_bytes)
        self.kernel = kernel
        self.packer = ArgumentPacker(param_kinds, param_names)
        self.num_warps = num_warps
        self.shared_bytes = shared_bytes
        self.stream_of = driver.raw_stream_getter()    # device index -> torch's current stream handle
        self.launch = self._build_launch()
        self._native = False    # native_stub(): not made yet

    def inline(self, fixed: Optional[Mapping[int, object]] = None) -> Optional["InlineLaunch"]:
        """What code that inlines `launch` reads (see `inline_launch_statements`), or None when it
        cannot: the kernel has no parameters, or bfloat16 ones (their values are converted first).

        fixed: {parameter index: value} of arguments that every launch of this code passes: they
        are packed once per thread (launcher_args.ArgumentPacker), and the code packs the others.
        With a native stub (`InlineLaunch.native`, see native_launch.py) the code passes every value
        to the stub, the fixed ones included; they are still checked here.

        Raises:
            LaunchError: a fixed value the parameter cannot take (naming it).
        """
        if not self.packer.kinds:
            return None
        failed = self._failed
        packer = self.packer
        if fixed:
            packer = ArgumentPacker(packer.kinds, packer.names, fixed)
            native = self.native_stub()
            if native is not None:
                return InlineLaunch(None, None, None, 0, None, None, 0, 0, failed, native)
            failed = functools.partial(self._failed_with, packer.variable, fixed)
        native = self.native_stub()
        writer = packer.writer()
        if writer is None and native is None:
            return None
        local, new_buffer, pack_into, values_offset = writer or (None, None, None, 0)
        return InlineLaunch(local, new_buffer, pack_into, values_offset, driver.cuda_driver().cuLaunchKernel,
                            self.kernel.function, 32 * self.num_warps, self.shared_bytes, failed, native)

    def native_stub(self) -> Optional[Callable]:
        """The native_launch stub of this kernel, made on first use; None when cuda-python is not the
        driver in use (tests mock it), stubs are disabled or cannot be made here (then launches go
        through cuda-python's cuLaunchKernel)."""
        if self._native is False:
            self._native = _native_stub(self.kernel.function, self.packer.kinds, 32 * self.num_warps,
                                        self.shared_bytes)
        return self._native

    def _failed_with(self, variable: tuple, fixed: Mapping[int, object], error, grid: tuple, stream: int,
                     values: Sequence) -> None:
        # `_failed` of a launch that passed the values of the parameters at `variable` and `fixed`
        args = [None] * len(self.packer.kinds)
        for index, value in zip(variable, values):
            args[index] = value
        for index, value in fixed.items():
            args[index] = value
        self._failed(error, grid, stream, args)

    def _failed(self, error, grid: tuple, stream: int, args: Sequence) -> None:
        """Raise the LaunchError of a launch that raised `error` (an exception) or returned `error` (a
        CUresult, or a native stub's int); returns when a retry in this thread's context succeeded
        (see `_launch_failed`)."""
        if not isinstance(error, BaseException):
            if type(error) is int:      # a native stub's result
                with contextlib.suppress(Exception):
                    error = driver.cuda_driver().CUresult(error)
            self._launch_failed(error, grid, stream, args)
            return
        if isinstance(error, (struct.error, OverflowError, TypeError)):
            self.packer.pack(args)      # raises LaunchError naming the bad argument, if one is
        raise LaunchError(f"cannot launch {self.kernel.name!r} on grid {grid!r}, stream {stream!r}: {error}") from None

    def _build_launch(self):
        # A closure over locals: each attribute lookup saved is ~40 ns on a ~5 us launch.
        cu_launch = driver.cuda_driver().cuLaunchKernel
        function = self.kernel.function
        block_x = 32 * self.num_warps
        shared_bytes = self.shared_bytes
        pack = self.packer.pack
        launch_failed = self._launch_failed
        name = self.kernel.name
        failed_call = self._failed
        writer = self.packer.writer() if self.packer.kinds else None

        if writer is None:
            def launch(grid: tuple, stream: int, args: Sequence) -> None:
                """Launch on `grid` = (gx, gy, gz) program instances on `stream` (a raw handle) with `args`.

                Raises:
                    LaunchError: bad arguments (naming the parameter), a bad grid, or a driver error.
                """
                try:
                    grid_x, grid_y, grid_z = grid
                    (code,) = cu_launch(function, grid_x, grid_y, grid_z, block_x, 1, 1, shared_bytes,
                                        stream or None, pack(args), 0)
                except (OverflowError, TypeError, ValueError) as error:
                    raise LaunchError(f"cannot launch {name!r} on grid {grid!r}, stream {stream!r}: "
                                      f"{error}") from None
                if code:
                    launch_failed(code, grid, stream, args)

            return launch

        local, new_buffer, pack_into, values_offset = writer

        def launch(grid: tuple, stream: int, args: Sequence) -> None:
            """Launch on `grid` = (gx, gy, gz) program instances on `stream` (a raw handle) with `args`
            (packed here, into this thread's buffer: see launcher_args.ArgumentPacker).

            Raises:
                LaunchError: bad arguments (naming the parameter), a bad grid, or a driver error.
            """
            try:
                buffer, address = local.slot
            except AttributeError:
                buffer, address = new_buffer()
            try:
                pack_into(buffer, values_offset, *args)
                grid_x, grid_y, grid_z = grid
                (code,) = cu_launch(function, grid_x, grid_y, grid_z, block_x, 1, 1, shared_bytes, stream or None,
                                    address, 0)
            except (struct.error, OverflowError, TypeError, ValueError) as error:
                failed_call(error, grid, stream, args)
            if code:
                launch_failed(code, grid, stream, args)

        return launch

    def _launch_failed(self, code, grid: tuple, stream: int, args: Sequence) -> None:
        cu = driver.cuda_driver()
        if code == cu.CUresult.CUDA_ERROR_INVALID_CONTEXT:
            # A thread that never used CUDA has no current context (matters for stream 0).
            with made_current(self.kernel.context):
                (code,) = cu.cuLaunchKernel(self.kernel.function, grid[0], grid[1], grid[2], 32 * self.num_warps,
                                            1, 1, self.shared_bytes, stream or None, self.packer.pack(args), 0)
            if code == 0:
                return
        hint = ""
        if any(not 1 <= g <= limit for g, limit in zip(grid, _MAX_GRID)):
            hint = f" (each grid dimension must be >= 1 and at most {_MAX_GRID})"
        raise LaunchError(f"launching {self.kernel.name!r} on grid {tuple(grid)} with {32 * self.num_warps} threads "
                          f"and {self.shared_bytes} bytes of dynamic shared memory failed: "
                          f"{driver.error_name(code)}{hint}")


def made_current(context):
    """A context manager under which `context` (a driver.DeviceContext) is current, for a driver call
    that failed with CUDA_ERROR_INVALID_CONTEXT: the calling thread never used CUDA (a fresh thread,
    autograd's backward thread). The context stays current where its device is torch's current device
    in this thread (as torch's own first use there would leave it); another device's context is pushed
    for the block alone, so that work on cuda:1 does not move torch.empty(device="cuda") there."""
    if context.device_index == _torch_current_device():
        context.activate()
        return contextlib.nullcontext()
    return context.pushed()


def _torch_current_device() -> int:
    """torch's current CUDA device index in the calling thread."""
    import torch

    return torch.cuda.current_device()


def _native_stub(function, kinds: Sequence[ParamKind], block_x: int, shared_bytes: int) -> Optional[Callable]:
    # KernelLauncher.native_stub's
    from fusedops.dsl.runtime import native_launch

    if not native_launch.enabled() or not native_launch.supports(kinds):
        return None
    cu = driver.cuda_driver()
    if getattr(cu, "__name__", None) != "cuda.bindings.driver":
        return None
    try:
        handle = int(function)
        address = _legacy_stream_launch_address()
    except Exception:
        return None
    if not handle or not address:
        return None
    return native_launch.make_stub(kinds, address, handle, block_x, shared_bytes)


@functools.cache
def _legacy_stream_launch_address() -> int:
    """The address of the driver's cuLaunchKernel for the legacy default stream: the function
    cuda-python's cuLaunchKernel calls (unless CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM is set)."""
    cu = driver.cuda_driver()
    version = driver.check(cu.cuDriverGetVersion(), "cuDriverGetVersion")
    flags = cu.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_LEGACY_STREAM
    result = driver.check(cu.cuGetProcAddress(b"cuLaunchKernel", version, flags), "cuGetProcAddress(cuLaunchKernel)")
    address, status = result if isinstance(result, tuple) else (result, 0)
    return int(address) if int(status) == 0 else 0


class InlineLaunch(NamedTuple):
    """The parts of a `KernelLauncher.launch` that code inlining it reads, by these names (see
    `inline_launch_statements`)."""

    local: object               # threading.local whose `slot` is this thread's (buffer, pointer array address)
    new_buffer: Callable        # () -> a new slot for this thread
    pack_into: Callable         # (buffer, values_offset, *values): writes the values, raises on a bad one
    values_offset: int
    cu_launch: Callable         # the driver's cuLaunchKernel
    function: object            # the CUfunction
    block_x: int                # threads per block
    shared_bytes: int           # dynamic shared memory per block
    failed: Callable            # (exception or CUresult, grid, stream, values): raises the LaunchError
    native: Optional[Callable] = None   # native_launch stub: (gx, gy, gz, stream, *values) -> CUresult int


def inline_launch_statements(values: Sequence[str], grid: str, stream: str, native: bool = False) -> list:
    """The statements of `KernelLauncher.launch`, for code generated to launch without calling it
    (fast_path's plans and prepared launches), which saves a call, the values tuple and the
    unpacking of `*values` (~0.3 us).

    values: the source of each argument value (at least one); grid: the source of the three grid
    sizes, comma-separated; stream: the source of the stream handle (evaluated more than once: a
    name). The statements read the names of `InlineLaunch` and the module `struct`, and assign
    `buffer`, `address`, `code` and `error`. native: call the stub `native` instead (every parameter's
    value in `values`), which converts, packs and launches in one builtin call (~5k instructions
    fewer than the rest, see native_launch.py).
    """
    packed = ", ".join(values)
    if native:
        return [
            "try:",
            f"    code = native({grid}, {stream}, {packed})",
            "except (OverflowError, TypeError, ValueError) as error:",
            f"    failed(error, ({grid}), {stream}, ({packed},))",
            "else:",
            "    if code:",
            f"        failed(code, ({grid}), {stream}, ({packed},))",
        ]
    return [
        "try:",
        "    buffer, address = local.slot",
        "except AttributeError:",
        "    buffer, address = new_buffer()",
        "try:",
        f"    pack_into(buffer, values_offset, {packed})",
        f"    (code,) = cu_launch(function, {grid}, block_x, 1, 1, shared_bytes, {stream} or None, address, 0)",
        "except (struct.error, OverflowError, TypeError, ValueError) as error:",
        f"    failed(error, ({grid}), {stream}, ({packed},))",
        "else:",
        "    if code:",
        f"        failed(code, ({grid}), {stream}, ({packed},))",
    ]
