"""A thin layer over the CUDA driver API (`cuda.bindings.driver`): errors, per-device context and
properties, loading PTX/cubin, and prepared kernel launches.

Importing this module needs neither a GPU nor cuda-python: the driver bindings and torch are
imported on first use, and every function that needs a GPU raises `LaunchError` ("no CUDA GPU
...") when there is none.

Contexts: fusedops uses each device's *primary* context, the one torch's runtime-API calls use,
so device pointers from torch tensors are valid in our kernels. It is retained once per process
and device (`device_context`) and never released.

Launch cost (TOOLCHAIN.md, measured on the H200): passing `kernelParams` as the int address of a
pre-packed `void*` array is the cheapest form cuda-python takes (4.1 us per launch); see
`launcher_args`. Cached launches skip cuda-python through a native stub (`KernelLauncher.native_stub`,
native_launch.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import struct
from typing import Callable, Mapping, NamedTuple, Optional, Sequence, Union

from fusedops.dsl.errors import LaunchError
from fusedops.dsl.runtime.launcher_args import ArgumentPacker, ParamKind

DEFAULT_SHARED_MEMORY_LIMIT = 48 * 1024  # per CTA without the cuFuncSetAttribute opt-in
_JIT_LOG_BYTES = 16 * 1024
_MAX_GRID = (2**31 - 1, 65535, 65535)


@functools.cache
def _driver():
    try:
        from cuda.bindings import driver
    except ImportError as error:
        raise LaunchError("cuda-python is not installed (pip install cuda-python); it is needed to run "
                          "kernels on a GPU") from error
    return driver


def error_name(result_code) -> str:
    """'CUDA_ERROR_X: description' for a CUresult (its enum name when the driver cannot be asked)."""
    cu = _driver()
    name = getattr(result_code, "name", str(result_code))
    try:
        status, text = cu.cuGetErrorString(result_code)
        if status == cu.CUresult.CUDA_SUCCESS and text:
            return f"{name}: {text.decode(errors='replace')}"
    except Exception:  # no libcuda: keep the enum name
        pass
    return name


def check(result: tuple, what: str = "CUDA driver call"):
    """Unwrap a cuda-python result tuple `(CUresult, *outputs)`.

    Returns None, the single output, or the tuple of outputs.

    Raises:
        LaunchError: the CUresult is not CUDA_SUCCESS; the message has `what` and the error name.
    """
    code = result[0]
    if code != 0:
        raise LaunchError(f"{what} failed: {error_name(code)}")
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


def require_gpu(device_index: Optional[int]) -> int:
    """`device_index` (None: the current device) checked to be a CUDA device here. Raises LaunchError."""
    try:
        import torch
    except ImportError as error:
        raise LaunchError("no CUDA GPU: torch is not installed") from error
    if not torch.cuda.is_available():
        raise LaunchError("no CUDA GPU is available (torch.cuda.is_available() is False); set "
                          "FUSEDOPS_INTERPRET=1 to run kernels in the CPU interpreter")
    if device_index is None:
        device_index = torch.cuda.current_device()
    count = torch.cuda.device_count()
    if not 0 <= device_index < count:
        raise LaunchError(f"no CUDA device {device_index}; this machine has {count}")
    return device_index


@dataclasses.dataclass(frozen=True)
class DeviceProperties:
    """Properties of one GPU, queried once.

    max_shared_memory_optin: bytes of shared memory one CTA may use after the opt-in
        (static + dynamic; 232 448 on H100/H200).
    """

    index: int
    name: str
    compute_capability: tuple
    sm_count: int
    max_threads_per_block: int
    max_shared_memory_per_block: int
    max_shared_memory_optin: int


class DeviceContext:
    """The primary CUDA context of one device and that device's properties."""

    def __init__(self, device_index: int, device, context, properties: DeviceProperties):
        self.device_index = device_index
        self.device = device
        self.context = context
        self.properties = properties
        self._context_handle = int(context)

    def __repr__(self) -> str:
        major, minor = self.properties.compute_capability
        return f"DeviceContext({self.device_index}, {self.properties.name!r}, compute capability {major}.{minor})"

    def activate(self) -> None:
        """Make this context current on the calling thread (needed to launch on the NULL stream
        from a thread where torch has not used this device yet)."""
        cu = _driver()
        current = check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if int(current) != self._context_handle:
            check(cu.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    @contextlib.contextmanager
    def pushed(self):
        """Make this context current for the duration of a `with` block, then restore the old one."""
        cu = _driver()
        check(cu.cuCtxPushCurrent(self.context), "cuCtxPushCurrent")
        try:
            yield self
        finally:
            check(cu.cuCtxPopCurrent(), "cuCtxPopCurrent")


@functools.cache
def _device_context(device_index: int) -> DeviceContext:
    import torch

    cu = _driver()
    # Let torch initialize CUDA first, so the primary context we retain is the one it uses.
    torch.cuda.init()
    try:
        check(cu.cuInit(0), "cuInit")
    except RuntimeError as error:  # cuda.pathfinder's DynamicLibNotFoundError: no libcuda
        raise LaunchError(f"no CUDA GPU: the CUDA driver library cannot be loaded ({error})") from error
    device = check(cu.cuDeviceGet(device_index), "cuDeviceGet")
    context = check(cu.cuDevicePrimaryCtxRetain(device), "cuDevicePrimaryCtxRetain")
    attribute = cu.CUdevice_attribute

    def query(name: str) -> int:
        return int(check(cu.cuDeviceGetAttribute(getattr(attribute, name), device), f"cuDeviceGetAttribute({name})"))

    raw_name = check(cu.cuDeviceGetName(256, device), "cuDeviceGetName")
    properties = DeviceProperties(
        index=device_index,
        name=bytes(raw_name).split(b"\0", 1)[0].decode(errors="replace"),
        compute_capability=(query("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR"),
                            query("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR")),
        sm_count=query("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT"),
        max_threads_per_block=query("CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK"),
        max_shared_memory_per_block=query("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK"),
        max_shared_memory_optin=query("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"),
    )
    return DeviceContext(device_index, device, context, properties)


def device_context(device_index: Optional[int] = None) -> DeviceContext:
    """The DeviceContext of `device_index` (default: torch's current device), created on first use.

    Raises:
        LaunchError: no CUDA GPU, no such device, or a driver call failed.
    """
    return _device_context(require_gpu(device_index))


@functools.cache
@functools.cache
def raw_stream_getter() -> Callable[[int], int]:
    """The cheapest function `device_index -> current CUDA stream handle (int)` torch offers.

    `torch._C._cuda_getCurrentRawStream` (what torch's Inductor calls from its generated code)
    returns the handle without building a `torch.cuda.Stream`; the fallback
    `torch.cuda.current_stream(i).cuda_stream` is the public spelling of the same value.
    """
    import torch

    getter = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if getter is not None:
        return getter
    return lambda device_index: torch.cuda.current_stream(device_index).cuda_stream


def current_raw_stream(device_index: int) -> int:
    """The handle of torch's current stream on `device_index` (0 for the legacy default stream)."""
    return raw_stream_getter()(device_index)


@dataclasses.dataclass
class LoadedKernel:
    """A kernel function loaded into a device's primary context.

    num_registers, static_shared_bytes, local_bytes and max_threads_per_block are the driver's
    function attributes (max_threads_per_block accounts for registers and `.maxntid`).
    dynamic_shared_limit: the dynamic shared memory (bytes) launches may currently ask for.
    """

    name: str
    module: object
    function: object
    context: DeviceContext
    num_registers: int
    static_shared_bytes: int
    local_bytes: int
    max_threads_per_block: int
    dynamic_shared_limit: int

    def unload(self) -> None:
        """Unload the module; the kernel must not be launched afterwards."""
        with self.context.pushed():
            check(_driver().cuModuleUnload(self.module), "cuModuleUnload")


def load_module(image: Union[bytes, str], kernel_name: str, device_index: Optional[int] = None) -> LoadedKernel:
    """Load PTX (text) or a cubin (ELF bytes) into a device's primary context and get `kernel_name`.

    Raises:
        LaunchError: no GPU; the driver's JIT rejects the PTX (the message holds the JIT error
            log); or the module has no kernel called `kernel_name`.
    """
    context = device_context(device_index)
    cu = _driver()
    data = image.encode() if isinstance(image, str) else bytes(image)
    if not data.startswith(b"\x7fELF") and not data.endswith(b"\0"):
        data += b"\0"  # PTX must be NUL-terminated
    log = bytearray(_JIT_LOG_BYTES)
    options = [cu.CUjit_option.CU_JIT_ERROR_LOG_BUFFER, cu.CUjit_option.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES]
    with context.pushed():
        code, module = cu.cuModuleLoadDataEx(data, len(options), options, [log, len(log)])
        if code != 0:
            text = bytes(log).split(b"\0", 1)[0].decode(errors="replace").strip()
            raise LaunchError(f"the driver could not load the module for kernel {kernel_name!r} on "
                              f"{context!r}: {error_name(code)}" + (f"\nJIT log:\n{text}" if text else ""))
        code, function = cu.cuModuleGetFunction(module, kernel_name.encode())
        if code != 0:
            cu.cuModuleUnload(module)
            raise LaunchError(f"the loaded module has no kernel named {kernel_name!r}: {error_name(code)}")
        attribute = cu.CUfunction_attribute

        def query(name: str) -> int:
            return int(check(cu.cuFuncGetAttribute(getattr(attribute, name), function), f"cuFuncGetAttribute({name})"))

        static_shared = query("CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES")
        return LoadedKernel(
            name=kernel_name, module=module, function=function, context=context,
            num_registers=query("CU_FUNC_ATTRIBUTE_NUM_REGS"), static_shared_bytes=static_shared,
            local_bytes=query("CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES"),
            max_threads_per_block=query("CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK"),
            dynamic_shared_limit=query("CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES"),
        )


def set_dynamic_shared_memory(kernel: LoadedKernel, nbytes: int) -> None:
    """Allow launches of `kernel` with `nbytes` of dynamic shared memory.

    Above the default 48 KB (static + dynamic) this needs the opt-in
    `cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)`, once per function.

    Raises:
        LaunchError: static + dynamic shared memory exceed what the device allows a CTA.
    """
    if nbytes < 0:
        raise LaunchError(f"dynamic shared memory must be >= 0 bytes, got {nbytes}")
    if nbytes <= kernel.dynamic_shared_limit:
        return
    properties = kernel.context.properties
    total = nbytes + kernel.static_shared_bytes
    if total > properties.max_shared_memory_optin:
        raise LaunchError(f"kernel {kernel.name!r} needs {total} bytes of shared memory per CTA ({nbytes} dynamic "
                          f"+ {kernel.static_shared_bytes} static), but {properties.name} allows at most "
                          f"{properties.max_shared_memory_optin}; use smaller blocks or fewer pipeline stages")
    cu = _driver()
    attribute = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    check(cu.cuFuncSetAttribute(kernel.function, attribute, nbytes), "cuFuncSetAttribute(max dynamic shared)")
    kernel.dynamic_shared_limit = nbytes


def max_active_clusters(kernel: LoadedKernel, num_warps: int, shared_bytes: int, cluster_size: int) -> int:
    """The most clusters of `cluster_size` CTAs of `kernel` (num_warps * 32 threads and `shared_bytes` of
    dynamic shared memory each) that its device runs at once (`cuOccupancyMaxActiveClusters`, CUDA Driver
    API "Occupancy"): a persistent grid of more clusters than that runs its last ones after the others.
    With `cluster_size` 1, the CTAs of the kernel that fit on the device at once.

    Raises:
        LaunchError: the driver rejects the query (e.g. a cluster the device cannot run).
    """
    cu = _driver()
    set_dynamic_shared_memory(kernel, shared_bytes)
    config = cu.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = cluster_size, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = 32 * num_warps, 1, 1
    config.sharedMemBytes = shared_bytes
    # the cluster size, also where the kernel has one compiled in (it must then match) and for clusters of
    # one CTA: a kernel without a compiled-in size gets an error without it (the driver API's docs)
    attribute = cu.CUlaunchAttribute()
    attribute.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attribute.value.clusterDim.x, attribute.value.clusterDim.y, attribute.value.clusterDim.z = cluster_size, 1, 1
    config.attrs = [attribute]
    config.numAttrs = 1
    with kernel.context.pushed():
        return int(check(cu.cuOccupancyMaxActiveClusters(kernel.function, config), "cuOccupancyMaxActiveClusters"))


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

    def __init__(self, kernel: LoadedKernel, param_kinds: Sequence[ParamKind], num_warps: int,
                 shared_bytes: int = 0, param_names: Optional[Sequence[str]] = None):
        threads = 32 * num_warps
        if num_warps < 1 or threads > kernel.max_threads_per_block:
            raise LaunchError(f"num_warps={num_warps} gives {threads} threads per block, but kernel {kernel.name!r} "
                              f"allows at most {kernel.max_threads_per_block} (registers: {kernel.num_registers})")
        set_dynamic_shared_memory(kernel, shared_bytes)
        self.kernel = kernel
        self.packer = ArgumentPacker(param_kinds, param_names)
        self.num_warps = num_warps
        self.shared_bytes = shared_bytes
        self.stream_of = raw_stream_getter()    # device index -> torch's current stream handle
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
        return InlineLaunch(local, new_buffer, pack_into, values_offset, _driver().cuLaunchKernel,
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
                    error = _driver().CUresult(error)
            self._launch_failed(error, grid, stream, args)
            return
        if isinstance(error, (struct.error, OverflowError, TypeError)):
            self.packer.pack(args)      # raises LaunchError naming the bad argument, if one is
        raise LaunchError(f"cannot launch {self.kernel.name!r} on grid {grid!r}, stream {stream!r}: {error}") from None

    def _build_launch(self):
        # A closure over locals: each attribute lookup saved is ~40 ns on a ~5 us launch.
        cu_launch = _driver().cuLaunchKernel
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
        cu = _driver()
        if code == cu.CUresult.CUDA_ERROR_INVALID_CONTEXT:
            # A thread that never used this device has no current context (matters for stream 0).
            self.kernel.context.activate()
            (code,) = cu.cuLaunchKernel(self.kernel.function, grid[0], grid[1], grid[2], 32 * self.num_warps, 1, 1,
                                        self.shared_bytes, stream or None, self.packer.pack(args), 0)
            if code == 0:
                return
        hint = ""
        if any(not 1 <= g <= limit for g, limit in zip(grid, _MAX_GRID)):
            hint = f" (each grid dimension must be >= 1 and at most {_MAX_GRID})"
        raise LaunchError(f"launching {self.kernel.name!r} on grid {tuple(grid)} with {32 * self.num_warps} threads "
                          f"and {self.shared_bytes} bytes of dynamic shared memory failed: {error_name(code)}{hint}")


def _native_stub(function, kinds: Sequence[ParamKind], block_x: int, shared_bytes: int) -> Optional[Callable]:
    # KernelLauncher.native_stub's
    from fusedops.dsl.runtime import native_launch

    if not native_launch.enabled() or not native_launch.supports(kinds):
        return None
    cu = _driver()
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
    cu = _driver()
    version = check(cu.cuDriverGetVersion(), "cuDriverGetVersion")
    flags = cu.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_LEGACY_STREAM
    result = check(cu.cuGetProcAddress(b"cuLaunchKernel", version, flags), "cuGetProcAddress(cuLaunchKernel)")
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
