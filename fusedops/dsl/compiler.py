"""The compiler pipeline: block IR -> passes -> LLVM IR -> PTX, and the compiled kernel object.

    compile_function(function, CompileOptions(arch="sm_90a", num_warps=4)) -> CompiledKernel

The pipeline, top to bottom: target-independent simplification (passes/pipeline.py), layout
assignment (tensor-core layouts for fp16/bf16 dots on sm_80+), software pipelining of the loads
feeding those dots (num_stages), pointer analysis, lowering to LLVM IR (codegen/), LLVM -O3 and
NVPTX (target/). A `CompiledKernel` needs no GPU until `launch`; its `asm` holds "ir", "llir" and
"ptx".
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Optional, Sequence

from .ir import Function, OpCode, print_function, verify
from .target import Target, compile_to_ptx

SUPPORTED_NUM_WARPS = (1, 2, 4, 8, 16, 32)


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    """arch: "sm_80", "sm_90" or "sm_90a"; num_warps: threads per program / 32; num_stages: software
    pipelining depth of loops feeding `dot` (used by the tensor-core path); fp_fusion: floating-point adds,
    subtracts and multiplies may be contracted into FMAs (`@dsl.jit(enable_fp_fusion=True)`)."""

    arch: str = "sm_90a"
    num_warps: int = 4
    num_stages: int = 3
    fp_fusion: bool = False

    def __post_init__(self):
        if self.num_warps not in SUPPORTED_NUM_WARPS:
            raise ValueError(f"num_warps must be one of {SUPPORTED_NUM_WARPS}, got {self.num_warps!r}")
        Target(self.arch)   # validates the arch name


class CompiledKernel:
    """A kernel compiled for one specialization and target.

    asm: {"ir": block IR after the passes, "llir": optimized LLVM IR, "ptx": PTX}.
    parameter_types: the dsl type of each runtime parameter, in order.
    Launching needs a CUDA GPU; modules are loaded once per device.
    """

    def __init__(self, name: str, asm: dict, shared_bytes: int, options: CompileOptions,
                 parameter_types: tuple, parameter_names: tuple, tensor_maps: tuple = (), cluster_size: int = 1,
                 producer_warps: int = 0):
        self.tensor_maps = tensor_maps      # runtime.tensor_map.TensorMapParam per extra TMA parameter
        self.cluster_size = cluster_size    # dsl.cluster_dims: grids must be multiples of it along axis 0
        self.name = name
        self.asm = asm
        self.shared_bytes = shared_bytes
        self.options = options
        self.num_warps = options.num_warps
        self.launch_warps = options.num_warps + producer_warps   # the CTA's warps: num_warps and any producer warp
        self.parameter_types = parameter_types
        self.parameter_names = parameter_names
        self._launchers: dict = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"CompiledKernel({self.name!r}, {self.options.arch}, num_warps={self.num_warps})"

    def launcher(self, device_index: int):
        launcher = self._launchers.get(device_index)
        if launcher is None:
            from .runtime import driver, kernel_launcher
            from .runtime.launcher_args import param_kind
            with self._lock:
                launcher = self._launchers.get(device_index)
                if launcher is None:
                    kernel = driver.load_module(self.asm["ptx"], self.name, device_index)
                    kinds = [param_kind(t) for t in self.parameter_types]
                    names = list(self.parameter_names)
                    if self.tensor_maps:      # appended by a TensorMapLauncher from the launch's values
                        from .runtime.launcher_args import ParamKind
                        kinds += [ParamKind.TENSOR_MAP] * len(self.tensor_maps)
                        names += [f"tensor_map{i}" for i in range(len(self.tensor_maps))]
                    launcher = kernel_launcher.KernelLauncher(kernel, kinds, self.launch_warps, self.shared_bytes, names)
                    if self.tensor_maps:
                        from .runtime.tensor_map import TensorMapLauncher
                        launcher = TensorMapLauncher(launcher, self.tensor_maps)
                    if self.cluster_size > 1:
                        from .runtime.launcher import ClusterLauncher
                        launcher = ClusterLauncher(launcher, self.cluster_size, self.name)
                    self._launchers[device_index] = launcher
        return launcher

    def launch(self, grid: Sequence[int], args: Sequence, stream: Optional[int] = None,
               device_index: int = 0) -> None:
        """Launch over `grid` (1-3 ints) with `args` (device addresses for pointers, Python scalars)."""
        if len(grid) != 3:
            grid = tuple(grid) + (1,) * (3 - len(grid))
        launcher = self._launchers.get(device_index) or self.launcher(device_index)
        if stream is None:
            stream = launcher.stream_of(device_index)
        launcher.launch(grid, stream, args)


class _Asm(dict):
    """The compiled kernel's dumps; "sass" is produced on first access when ptxas and cuobjdump exist."""

    def __init__(self, values: dict, arch: str):
        super().__init__(values)
        self._arch = arch

    def __missing__(self, key):
        if key != "sass":
            raise KeyError(key)
        from .target import assemble, sass
        text = sass(assemble(self["ptx"], self._arch).cubin)
        if text is None:
            raise KeyError("sass (needs ptxas and cuobjdump or nvdisasm on the PATH)")
        self["sass"] = text
        return text


def _code_inputs_beside_the_ir(function: Function, arch: str) -> str:
    """What the generated code depends on that the printed IR does not show, as comment lines for the
    cache key: the source location of each device_assert (its file, line and function are compiled into
    the assertion's message), the libdevice the compiler links (FUSEDOPS_LIBDEVICE_PATH, with the file's
    size and modification time) and, on sm_90a, the knobs that change the lowering (FUSEDOPS_DISABLE_WGMMA,
    FUSEDOPS_TMA, FUSEDOPS_WS)."""
    from .runtime import knobs

    settings = knobs.current()
    lines = [f"// assert at {op.loc.file}:{op.loc.line} in {op.loc.function}"
             for op in function.walk() if op.opcode == OpCode.ASSERT]
    path = settings.libdevice_path
    if path is not None:
        from .target.libdevice import LIBDEVICE_FILENAME

        try:
            stat = os.stat(os.path.join(path, LIBDEVICE_FILENAME) if os.path.isdir(path) else path)
            lines.append(f"// FUSEDOPS_LIBDEVICE_PATH={path} {stat.st_size} {stat.st_mtime_ns}")
        except OSError:
            lines.append(f"// FUSEDOPS_LIBDEVICE_PATH={path}")
    else:       # the libdevice the search finds (a CUDA upgrade replaces it: kernels calling it compile again)
        from .errors import BackendError
        from .target.libdevice import find_libdevice

        try:
            found = find_libdevice()
            stat = os.stat(found)
            lines.append(f"// libdevice {found} {stat.st_size} {stat.st_mtime_ns}")
        except (BackendError, OSError):
            lines.append("// libdevice not found")
    if arch == "sm_90a" and settings.disable_wgmma:
        lines.append("// FUSEDOPS_DISABLE_WGMMA")
    if arch == "sm_90a" and settings.tma:
        lines.append("// FUSEDOPS_TMA")
        if settings.ws:
            lines.append(f"// FUSEDOPS_WS={settings.ws}")
    return "".join(line + "\n" for line in lines)


def compile_function(function: Function, options: CompileOptions) -> CompiledKernel:
    """Compile a frontend-produced IR function (the passes modify it in place).

    The result is cached on disk (runtime/cache.py) under a hash of the frontend IR and the options.
    """
    from .codegen.kernel import lower_to_llvm
    from .passes.manager import run_pipeline
    from .passes.pipeline import default_pipeline
    from .runtime import cache, knobs

    verify(function)
    parameter_types = tuple(a.type for a in function.args)
    parameter_names = tuple(function.arg_names)
    ir_text = print_function(function) + _code_inputs_beside_the_ir(function, options.arch)
    key = cache.cache_key(ir_text, function.arg_hints, options)
    # FUSEDOPS_DUMP_IR asks for the passes' dumps: compile afresh (the entry is rewritten)
    entry = None if knobs.current().dump_ir else cache.load(key)
    if entry is not None:
        asm = _Asm({"ir": entry["ir"], "llir": entry["llir"], "ptx": entry["ptx"]}, options.arch)
        from .runtime.tensor_map import TensorMapParam
        return CompiledKernel(entry["name"], asm, int(entry["shared_bytes"]), options, parameter_types,
                              parameter_names, tuple(TensorMapParam.from_json(m) for m in entry.get("tensor_maps", ())),
                              int(entry.get("cluster_size", 1)), int(entry.get("producer_warps", 0)))
    dump_dir = knobs.current().dump_dir
    report = run_pipeline(function, default_pipeline(options.num_warps, options.arch, options.num_stages),
                          dump=knobs.current().dump_ir, dump_dir=None if dump_dir is None else str(dump_dir))
    axis_info = report.analyses["analyze_pointers"]
    lowered = lower_to_llvm(function, arch=options.arch, num_warps=options.num_warps, axis_info=axis_info,
                            fp_fusion=options.fp_fusion)
    compiled = compile_to_ptx(lowered.llvm_ir, Target(options.arch))
    asm = _Asm({"ir": print_function(function), "llir": compiled.llir, "ptx": compiled.ptx}, options.arch)
    cache.store(key, {"name": lowered.name, "shared_bytes": lowered.shared_bytes, **asm,
                      "tensor_maps": [m.to_json() for m in lowered.tensor_maps], "cluster_size": lowered.cluster_size,
                      "producer_warps": lowered.producer_warps})
    return CompiledKernel(lowered.name, asm, lowered.shared_bytes, options, parameter_types, parameter_names,
                          lowered.tensor_maps, lowered.cluster_size, lowered.producer_warps)
