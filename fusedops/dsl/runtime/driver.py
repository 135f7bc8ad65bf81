"""A thin layer over the CUDA driver API (`cuda.bindings.driver`): errors, per-device context and
properties, streams, and loading PTX/cubin (launches: kernel_launcher.py).

Importing this module needs neither a GPU nor cuda-python: the driver bindings and torch are
imported on first use, and every function that needs a GPU raises `LaunchError` ("no CUDA GPU
...") when there is none.

Contexts: fusedops uses each device's *primary* context, the one torch's runtime-API calls use,
so device pointers from torch tensors are valid in our kernels. It is retained once per process
and device (`device_context`) and never released.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Callable, Optional, Union

from fusedops.dsl.errors import LaunchError

DEFAULT_SHARED_MEMORY_LIMIT = 48 * 1024  # per CTA without the cuFuncSetAttribute opt-in
_JIT_LOG_BYTES = 16 * 1024


@functools.cache
def cuda_driver():
    """cuda-python's driver module (cuda.bindings.driver), imported once; LaunchError when it is not installed."""
    try:
        from cuda.bindings import driver
    except ImportError as error:
        raise LaunchError("cuda-python is not installed (pip install cuda-python); it is needed to run "
                          "kernels on a GPU") from error
    return driver


def error_name(result_code) -> str:
    """'CUDA_ERROR_X: description' for a CUresult (its enum name when the driver cannot be asked)."""
    cu = cuda_driver()
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
        cu = cuda_driver()
        current = check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if int(current) != self._context_handle:
            check(cu.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    @contextlib.contextmanager
    def pushed(self):
        """Make this context current for the duration of a `with` block, then restore the old one."""
        cu = cuda_driver()
        check(cu.cuCtxPushCurrent(self.context), "cuCtxPushCurrent")
        try:
            yield self
        finally:
            check(cu.cuCtxPopCurrent(), "cuCtxPopCurrent")


@functools.cache
def _device_context(device_index: int) -> DeviceContext:
    import torch

    cu = cuda_driver()
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
            check(cuda_driver().cuModuleUnload(self.module), "cuModuleUnload")


def load_module(image: Union[bytes, str], kernel_name: str, device_index: Optional[int] = None) -> LoadedKernel:
    """Load PTX (text) or a cubin (ELF bytes) into a device's primary context and get `kernel_name`.

    Raises:
        LaunchError: no GPU; the driver's JIT rejects the PTX (the message holds the JIT error
            log); the module has no kernel called `kernel_name`; or the driver could not load that
            kernel's code (with lazy loading, e.g. CUDA_ERROR_OUT_OF_MEMORY appears here).
    """
    context = device_context(device_index)
    cu = cuda_driver()
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
            if code == cu.CUresult.CUDA_ERROR_NOT_FOUND:
                raise LaunchError(f"the loaded module has no kernel named {kernel_name!r}: {error_name(code)}")
            # With lazy loading the driver loads the kernel's code here: out of memory shows up here
            raise LaunchError(f"the driver could not load kernel {kernel_name!r} from its module on "
                              f"{context!r}: {error_name(code)}")
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
    cu = cuda_driver()
    attribute = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    with kernel.context.pushed():      # the calling thread may have no current context (a fresh thread)
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
    cu = cuda_driver()
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
