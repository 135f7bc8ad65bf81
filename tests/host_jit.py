"""Run a scalar kernel's compiled code on the host, without a GPU: the sm_90a LLVM IR, stripped of its
target and address spaces, JIT-compiled by llvmlite for this CPU and called once (one thread). Kernels
with thread ids, inline PTX or 16-bit floats (runtime calls on the host) are refused by run_on_host. Checks the
compiler's integer, cast and min/max lowering against the interpreter bit for bit. host_text and host_function
are its steps; run_threads_on_host also stands in for thread ids, barriers and shuffles (one OS thread per GPU
thread: tests/test_review_session31.py, tests/test_review_session35_dsl.py, and with tensor-core stand-ins
tests/test_review_session38_dsl_blocks.py)."""

from __future__ import annotations

import _thread
import ctypes
import re
import threading

_CTYPES = {"i8": ctypes.c_int8, "i16": ctypes.c_int16, "i32": ctypes.c_int32, "i64": ctypes.c_int64,
           "float": ctypes.c_float, "double": ctypes.c_double}
_LLVM_READY = []


def llvm_binding():
    """llvmlite.binding with the native target initialized (once)."""
    import llvmlite.binding as llvm
    if not _LLVM_READY:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        _LLVM_READY.append(True)
    return llvm


def host_text(llir: str) -> str:
    """The kernel's LLVM IR without its NVPTX target, kernel calling convention, global address space and
    NVVM attributes (what the host JIT can take; other address spaces and intrinsics left to the caller)."""
    text = re.sub(r"^target (datalayout|triple) = .*$", "", llir, flags=re.M)
    text = text.replace("ptx_kernel ", "").replace("addrspace(1) ", "")
    return re.sub(r'"nvvm\.[a-z]+"="[^"]*"', "", text)


def host_function_arguments(llir: str, kernel, args) -> list:
    """`args` in `kernel`'s parameter order as the compiled `llir` declares them (tensors by their data pointers)."""
    return host_signature(llir, kernel, args)[2]


def host_signature(llir: str, kernel, args) -> tuple:
    """(the kernel's symbol name, its ctypes parameter types, `args` as those values)."""
    name, params = re.search(r"define [^@]*@(\w+)\((.*)\)[^()]*\{", llir).groups()
    pieces = [p.strip() for p in re.split(r",\s*(?=(?:ptr|i\d+|float|double))", params)] if params.strip() else []
    by_name = dict(zip([p if isinstance(p, str) else p.name for p in kernel.params], args))
    types, values = [], []
    for piece in pieces:
        kind, param = piece.split()[0], re.search(r"%(\w+)$", piece).group(1)
        value = by_name[param]
        types.append(ctypes.c_void_p if kind == "ptr" else _CTYPES[kind])
        values.append(value.data_ptr() if kind == "ptr" else value)
    return name, types, values


def host_function(text: str, llir: str, kernel, args) -> tuple:
    """(the kernel JIT-compiled from the host IR `text`, as a ctypes function, its arguments, the engine that
    holds it): `args` in `kernel`'s parameter order as the compiled `llir` declares them (tensors by their
    data pointers, scalars as i8..i64, float or double). The engine must outlive the calls."""
    llvm = llvm_binding()
    module = llvm.parse_assembly(text)
    module.verify()
    engine = llvm.create_mcjit_compiler(module, llvm.Target.from_default_triple().create_target_machine())
    engine.finalize_object()
    name, types, values = host_signature(llir, kernel, args)
    return ctypes.CFUNCTYPE(None, *types)(engine.get_function_address(name)), values, engine


def run_on_host(kernel, *args, **constexprs) -> None:
    """Compile `kernel` for sm_90a with `args` (tensors are passed by their data pointers) and run it once."""
    llir = kernel.compile(*args, target="sm_90a", **constexprs).asm["llir"]
    text = host_text(llir)
    assert "llvm.nvvm" not in text and "asm sideeffect" not in text, "not a host-runnable scalar kernel"
    assert " half" not in text and "bfloat" not in text, "16-bit floats need runtime calls on the host"
    function, values, engine = host_function(text, llir, kernel, args)
    function(*values)


_ALIVE = []         # callbacks and engines the JIT-compiled code calls into / lives in
_ENGINES = {}       # host IR text -> (function, engine) of run_threads_on_host's reusable engines
_LAUNCH = {}        # the current launch's callbacks, by symbol name (see _dispatch)
_DISPATCHERS = {}   # symbol name -> the ctypes callback bound to it for good


def _dispatch(name: str, prototype) -> None:
    """Bind `name`, once, to a callback that calls the current launch's _LAUNCH[name]."""
    if name not in _DISPATCHERS:
        callback = prototype(lambda *a: _LAUNCH[name](*a))
        _DISPATCHERS[name] = callback
        llvm_binding().add_symbol(name, ctypes.cast(callback, ctypes.c_void_p).value)
_SHARED = "@fusedops_shared = global [262144 x i8] zeroinitializer, align 1024"


def warp_exchange(num_warps: int):
    """-> exchanged(tid, value): every lane's `value` of thread `tid`'s warp, a warp-wide collective (all 32 lanes
    of the warp call it together) for callbacks that stand in for warp-wide instructions (shuffles, mma, ldmatrix)."""
    barriers = [threading.Barrier(32) for _ in range(num_warps)]
    slots = [[None] * 32 for _ in range(num_warps)]

    def exchanged(tid, value):
        warp = tid // 32
        slots[warp][tid % 32] = value
        barriers[warp].wait()
        seen = list(slots[warp])
        barriers[warp].wait()
        return seen
    return exchanged


def run_threads_on_host(kernel, args, *, grid: int = 1, num_warps: int = 4, target: str = "sm_90a",
                        num_stages: int | None = None, rewrite=None, symbols=(), allow_16bit_floats: bool = False,
                        **constexprs):
    """Compile `kernel` for `target` (and `num_stages` where given) and run its LLVM IR on the host over `grid` CTAs
    (one after another) of 32 * num_warps OS threads (tensors: their data pointers). Special registers, bar.sync
    and shfl.sync go through Python callbacks; shared memory is one host buffer. `rewrite(text) -> text` rewrites
    the host IR first (a harness's stand-ins for inline PTX); `symbols`: more (name, ctypes prototype, function)
    callbacks it declares. Kernels with other inline PTX are refused (AssertionError), and so are 16-bit floats
    unless `allow_16bit_floats` (the caller's `symbols` then provide the conversions x86 LLVM calls a library
    for). -> the compiled kernel."""
    llvm = llvm_binding()
    stages = {} if num_stages is None else {"num_stages": num_stages}
    compiled = kernel.compile(*args, target=target, num_warps=num_warps, **stages, **constexprs)
    llir = compiled.asm["llir"]
    text = host_text(llir).replace("addrspace(3) ", "")
    if rewrite is not None:
        text = rewrite(text)
    registers, shuffles = set(), set()

    def special(match):
        registers.add(match.group(1))
        return f"call i32 @__sreg_{match.group(1).replace('.', '_')}()"

    def shuffle(match):
        shuffles.add((match.group(1), match.group(2)))
        return f"call {'i32' if match.group(2) == 'i32' else 'float'} @__shfl_{match.group(1)}_{match.group(2)}("

    text = re.sub(r"(?:tail )?call (?:range\([^)]*\) )?i32 @llvm\.nvvm\.read\.ptx\.sreg\.([a-z.]+)\(\)", special, text)
    text = re.sub(r"(?:tail )?call void @llvm\.nvvm\.barrier\.cta\.sync\.aligned\.all\(i32 0\)",
                  "call void @__barrier()", text)
    text = re.sub(r"(?:tail )?call (?:i32|float) @llvm\.nvvm\.shfl\.sync\.(bfly|idx)\.(i32|f32)\(", shuffle, text)
    text = re.sub(r"^declare .*@llvm\.nvvm\.(read\.ptx\.sreg|barrier\.cta|shfl\.sync).*$", "", text, flags=re.M)
    text = re.sub(r"^@fusedops_shared = external [^\n]*$", _SHARED, text, flags=re.M)
    text += "\ndeclare void @__barrier()\n"
    text += "".join(f"declare i32 @__sreg_{r.replace('.', '_')}()\n" for r in registers)
    for k, t in shuffles:
        value = "i32" if t == "i32" else "float"
        text += f"declare {value} @__shfl_{k}_{t}(i32, {value}, i32, i32)\n"
    leftovers = [line for line in text.splitlines() if "llvm.nvvm" in line or " asm " in line]
    assert not leftovers, f"not host-runnable: {leftovers[:2]}"
    assert allow_16bit_floats or (" half" not in text and "bfloat" not in text), \
        "16-bit floats need runtime calls on the host"

    threads = 32 * num_warps
    local = threading.local()
    cta_barrier = threading.Barrier(threads)
    exchanged = warp_exchange(num_warps)
    values = {"tid.x": lambda: local.tid, "ctaid.x": lambda: local.pid, "ctaid.y": lambda: 0, "ctaid.z": lambda: 0,
              "nctaid.x": lambda: grid, "nctaid.y": lambda: 1, "nctaid.z": lambda: 1, "ntid.x": lambda: threads,
              "laneid": lambda: local.tid % 32, "warpid": lambda: local.tid // 32}

    def shuffled(kind):
        def exchange(mask, value, operand, clamp):
            lane = local.tid % 32
            return exchanged(local.tid, value)[lane ^ operand if kind == "bfly" else operand & 31]
        return exchange

    # The harness's own callbacks (barrier, special registers, shuffles) are bound once, for good, to
    # dispatchers that call this launch's: an engine compiled from the same host IR by an earlier launch
    # (_ENGINES) then calls this launch's callbacks too.
    _LAUNCH["__barrier"] = lambda: cta_barrier.wait()
    for r in registers:
        _LAUNCH[f"__sreg_{r.replace('.', '_')}"] = values[r]
    for k, t in shuffles:
        _LAUNCH[f"__shfl_{k}_{t}"] = shuffled(k)
    _dispatch("__barrier", ctypes.CFUNCTYPE(None))
    for r in registers:
        _dispatch(f"__sreg_{r.replace('.', '_')}", ctypes.CFUNCTYPE(ctypes.c_int32))
    for k, t in shuffles:
        c = ctypes.c_int32 if t == "i32" else ctypes.c_float
        _dispatch(f"__shfl_{k}_{t}", ctypes.CFUNCTYPE(c, ctypes.c_int32, c, ctypes.c_int32, ctypes.c_int32))

    def bind(name, prototype, function):
        callback = prototype(function)
        _ALIVE.append(callback)
        llvm.add_symbol(name, ctypes.cast(callback, ctypes.c_void_p).value)

    for name, prototype, function in symbols:
        bind(name, prototype, function)
    # An engine is reused only where nothing in it can differ between launches: no callbacks of the caller's
    # (bound per launch) and no mutable global but the shared memory, which is zeroed as a fresh engine's is.
    reusable = not symbols and not [line for line in text.splitlines()
                                    if re.match(r"@\S+ = .*\bglobal\b", line)
                                    and not line.startswith("@fusedops_shared = ")]
    cached = _ENGINES.get(text) if reusable else None
    if cached is None:
        function, arguments, engine = host_function(text, llir, kernel, args)
        _ALIVE.append(engine)
        if reusable:
            _ENGINES[text] = (function, engine)
    else:
        function, engine = cached
        arguments = host_function_arguments(llir, kernel, args)
        if "@fusedops_shared = " in text:
            ctypes.memset(engine.get_global_value_address("fusedops_shared"), 0, 262144)
    errors = []
    finished = threading.Semaphore(0)

    def thread(pid, tid):
        local.pid, local.tid = pid, tid
        try:
            function(*arguments)
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)
        finally:
            finished.release()

    # one OS thread per GPU thread, all of a CTA running at once (started without waiting for each to start)
    for pid in range(grid):
        for t in range(threads):
            _thread.start_new_thread(thread, (pid, t))
        for _ in range(threads):
            finished.acquire()
    assert not errors, errors
    return compiled
