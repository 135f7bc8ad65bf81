"""Native launch stubs: `cuLaunchKernel` called from machine code that llvmlite compiles at run time.

cuda-python's `cuLaunchKernel` costs ~4.5k instructions per call (callgrind, against a stand-in
libcuda whose cuLaunchKernel returns at once): converting its 11 arguments, wrapping the result in
a Python enum (a Python-level `__new__`), releasing the GIL. With the arguments packed by
`struct.pack_into` into a thread-local buffer that is ~6.6k of a cached launch's ~17k instructions
above the driver. A stub does the same work in ~1k: a builtin function (METH_FASTCALL, made with
`PyCFunction_NewEx`) compiled once per list of parameter kinds, which

  - converts each value with the C API function `struct` uses for its format (PyLong_AsLongLong,
    PyLong_AsUnsignedLongLong, PyFloat_AsDouble + PyFloat_Pack4/2), raising OverflowError for an
    int out of its parameter's range, as `struct` raises struct.error; an unsigned value (and a grid
    size) that is not an int is converted through `__index__` first, as `struct` does (numpy ints,
    0-d integer tensors), which PyLong_AsUnsignedLongLong alone rejects;
  - stores the values and the `void*` array that points at them on its own stack (so no buffer is
    shared between threads), and calls cuLaunchKernel with the GIL released, as cuda-python does;
  - returns the CUresult as an int (0 on success).

The per-kernel constants (the cuLaunchKernel address, the CUfunction, block size and dynamic shared
memory) are the bytes of the function's `self` object, read with PyBytes_AsString, so one compiled
stub serves every kernel with the same parameter kinds, and a stub keeps its constants alive.

`stub(grid_x, grid_y, grid_z, stream, *values) -> int`; `stream` is a raw handle (0: the legacy
default stream, passed as NULL); the grid sizes are those cuLaunchKernel takes (unsigned 32-bit).
"""

from __future__ import annotations

import ctypes
import functools
import os
import struct
import threading
from typing import Callable, Optional, Sequence

from fusedops.dsl.runtime.launcher_args import ParamKind

_METH_FASTCALL = 0x0080   # Include/methodobject.h

# The kinds a stub converts, with (the C API converter, the stored LLVM type's bits, its error value).
_CONVERTERS = {
    ParamKind.POINTER: "PyLong_AsUnsignedLongLong", ParamKind.UINT64: "PyLong_AsUnsignedLongLong",
    ParamKind.INT64: "PyLong_AsLongLong", ParamKind.INT32: "PyLong_AsLongLong",
    ParamKind.UINT32: "PyLong_AsUnsignedLongLong", ParamKind.FLOAT64: "PyFloat_AsDouble",
    ParamKind.FLOAT32: "PyFloat_AsDouble", ParamKind.FLOAT16: "PyFloat_AsDouble",
}
_CONSTANTS = struct.Struct("<QQII")     # cuLaunchKernel address, CUfunction, block_x, shared bytes


class _MethodDef(ctypes.Structure):
    _fields_ = [("ml_name", ctypes.c_char_p), ("ml_meth", ctypes.c_void_p), ("ml_flags", ctypes.c_int),
                ("ml_doc", ctypes.c_char_p)]


def enabled() -> bool:
    """Stubs are used unless FUSEDOPS_NATIVE_LAUNCH is false (knobs.py), or cuda-python is told to launch
    on the per-thread default stream (cuda-python's own variable; the stub calls the legacy-stream
    cuLaunchKernel).

    Raises:
        ValueError: FUSEDOPS_NATIVE_LAUNCH is not a boolean.
    """
    from fusedops.dsl.runtime.knobs import native_launch_enabled

    if not native_launch_enabled():
        return False
    return os.environ.get("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", "0") in ("", "0")


def supports(kinds: Sequence[ParamKind]) -> bool:
    return bool(kinds) and all(kind in _CONVERTERS for kind in kinds)


def make_stub(kinds: Sequence[ParamKind], cu_launch_address: int, function: int, block_x: int,
              shared_bytes: int) -> Optional[Callable]:
    """The stub launching the kernel `function` (a CUfunction handle as an int) with parameters of
    `kinds` through the cuLaunchKernel at `cu_launch_address`, or None when a kind is not supported
    (see `_CONVERTERS`) or the stub cannot be compiled here."""
    if not supports(kinds):
        return None
    with _compile_lock:     # see _compiled
        code = _compiled(tuple(kinds))
    if code is None:
        return None
    # `self` of the builtin: the constants (PyCFunction_NewEx holds it, so they live as long as the
    # stub); the compiled code and its PyMethodDef live in `_compiled`'s cache, never freed.
    constants = _CONSTANTS.pack(cu_launch_address, function, block_x, shared_bytes)
    return _new_builtin()(ctypes.addressof(code[0]), constants, None)


@functools.lru_cache(maxsize=None)
def _new_builtin() -> Callable:
    """CPython's PyCFunction_NewEx(PyMethodDef *, self, module) -> the builtin, typed once, without setting
    argtypes on the process-wide `ctypes.pythonapi` attribute."""
    prototype = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.py_object, ctypes.c_void_p)
    return prototype(("PyCFunction_NewEx", ctypes.pythonapi))


def _api_address(name: str) -> int:
    return ctypes.cast(getattr(ctypes.pythonapi, name), ctypes.c_void_p).value


# Held around `_compiled`: lru_cache does not hold a lock while it computes, so two threads missing
# at once would both compile, and the second result would replace the first in the cache, freeing
# the code and PyMethodDef that the first thread's stub points at (llvmlite releases the GIL while
# it compiles, so this happens when threads first launch kernels of one signature together).
_compile_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def _compiled(kinds: tuple) -> Optional[tuple]:
    """(the PyMethodDef of the compiled stub for `kinds`, what must stay alive with it), or None when
    llvmlite cannot compile for this machine. Call with `_compile_lock` held."""
    try:
        import llvmlite.binding as llvm

        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        module = llvm.parse_assembly(_stub_ir(kinds))
        module.verify()
        machine = llvm.Target.from_default_triple().create_target_machine(opt=2)
        engine = llvm.create_mcjit_compiler(module, machine)
        engine.finalize_object()
        address = engine.get_function_address("launch")
    except Exception:   # no native target, an unknown C API symbol, ...: launch through cuda-python
        return None
    name = b"launch"
    method = _MethodDef(name, address, _METH_FASTCALL, None)
    return method, (engine, machine, module, method, name)


def _stub_ir(kinds: tuple) -> str:
    """The LLVM IR of `PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)`."""
    import llvmlite.ir as ir

    i8, i16, i32, i64, f64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.DoubleType()
    pointer = i8.as_pointer()
    module = ir.Module("fusedops_launch_stub")
    function = ir.Function(module, ir.FunctionType(pointer, [pointer, pointer.as_pointer(), i64]), "launch")
    self, args, nargs = function.args
    builder = ir.IRBuilder(function.append_basic_block("entry"))
    fail = function.append_basic_block("fail")

    def api(name: str, result, parameters):
        kind = ir.FunctionType(result, parameters)
        return builder.inttoptr(ir.Constant(i64, _api_address(name)), kind.as_pointer())

    def exception(name: str):
        return builder.inttoptr(ir.Constant(i64, ctypes.c_void_p.in_dll(ctypes.pythonapi, name).value), pointer)

    error_occurred = api("PyErr_Occurred", pointer, [])
    set_string = api("PyErr_SetString", ir.VoidType(), [pointer, pointer])

    def message(text: str):
        data = bytearray(text.encode() + b"\0")
        constant = ir.GlobalVariable(module, ir.ArrayType(i8, len(data)), name=f"message{len(module.globals)}")
        constant.initializer = ir.Constant(ir.ArrayType(i8, len(data)), data)
        constant.global_constant = True
        return builder.bitcast(constant, pointer)

    def fail_if(condition, exception_name: Optional[str] = None, text: str = ""):
        # to `fail` when `condition` holds: with a new exception, or with the converter's set
        resume = function.append_basic_block()
        if exception_name is None:
            check = function.append_basic_block()
            builder.cbranch(condition, check, resume)
            builder.position_at_end(check)
            raised = builder.icmp_unsigned("!=", builder.ptrtoint(builder.call(error_occurred, []), i64),
                                           ir.Constant(i64, 0))
            builder.cbranch(raised, fail, resume)
        else:
            raise_block = function.append_basic_block()
            builder.cbranch(condition, raise_block, resume)
            builder.position_at_end(raise_block)
            builder.call(set_string, [exception(exception_name), message(text)])
            builder.branch(fail)
        builder.position_at_end(resume)

    count = len(kinds)
    fail_if(builder.icmp_signed("!=", nargs, ir.Constant(i64, 4 + count)), "PyExc_TypeError",
            f"the launch stub takes {4 + count} arguments (grid x, y, z, stream and {count} values)")

    def argument(index: int):
        return builder.load(builder.gep(args, [ir.Constant(i64, index)]))

    as_unsigned = api("PyLong_AsUnsignedLongLong", i64, [pointer])
    as_signed = api("PyLong_AsLongLong", i64, [pointer])
    as_double = api("PyFloat_AsDouble", f64, [pointer])
    minus_one = ir.Constant(i64, -1)

    number_index = api("PyNumber_Index", pointer, [pointer])
    clear_error = api("PyErr_Clear", ir.VoidType(), [])
    decref = api("Py_DecRef", ir.VoidType(), [pointer])

    def unsigned(index: int, limit: int, what: str):
        # PyLong_AsUnsignedLongLong takes ints only; struct takes any object with __index__: on an
        # error, convert what __index__ gives (an int's own error, e.g. a negative one, recurs)
        item = argument(index)
        value = builder.call(as_unsigned, [item])
        first = builder.block
        check, retry, done = (function.append_basic_block() for _ in range(3))
        builder.cbranch(builder.icmp_signed("==", value, minus_one), check, done)
        builder.position_at_end(check)
        raised = builder.icmp_unsigned("!=", builder.ptrtoint(builder.call(error_occurred, []), i64),
                                       ir.Constant(i64, 0))
        builder.cbranch(raised, retry, done)
        builder.position_at_end(retry)
        builder.call(clear_error, [])
        converted = builder.call(number_index, [item])
        fail_if(builder.icmp_unsigned("==", builder.ptrtoint(converted, i64), ir.Constant(i64, 0)), None)
        retried = builder.call(as_unsigned, [converted])
        builder.call(decref, [converted])
        fail_if(builder.icmp_signed("==", retried, minus_one))
        retried_block = builder.block
        builder.branch(done)
        builder.position_at_end(done)
        merged = builder.phi(i64)
        merged.add_incoming(value, first)
        merged.add_incoming(value, check)
        merged.add_incoming(retried, retried_block)
        value = merged
        if limit < 2**64 - 1:
            fail_if(builder.icmp_unsigned(">", value, ir.Constant(i64, limit)), "PyExc_OverflowError", what)
        return value

    grid = [builder.trunc(unsigned(axis, 0xFFFFFFFF, "a grid size exceeds 2**32 - 1"), i32) for axis in range(3)]
    stream = builder.call(api("PyLong_AsVoidPtr", pointer, [pointer]), [argument(3)])
    fail_if(builder.icmp_unsigned("==", builder.ptrtoint(stream, i64), ir.Constant(i64, 0)))

    params = builder.alloca(pointer, count)
    for index, kind in enumerate(kinds):
        position = 4 + index
        if kind in (ParamKind.POINTER, ParamKind.UINT64):
            slot = builder.alloca(i64)
            builder.store(unsigned(position, 2**64 - 1, ""), slot)
        elif kind is ParamKind.UINT32:
            slot = builder.alloca(i32)
            builder.store(builder.trunc(unsigned(position, 0xFFFFFFFF, f"value {index} exceeds uint32"), i32), slot)
        elif kind in (ParamKind.INT64, ParamKind.INT32):
            value = builder.call(as_signed, [argument(position)])
            fail_if(builder.icmp_signed("==", value, minus_one))
            if kind is ParamKind.INT64:
                slot = builder.alloca(i64)
                builder.store(value, slot)
            else:
                outside = builder.or_(builder.icmp_signed("<", value, ir.Constant(i64, -2**31)),
                                      builder.icmp_signed(">", value, ir.Constant(i64, 2**31 - 1)))
                fail_if(outside, "PyExc_OverflowError", f"value {index} is outside int32")
                slot = builder.alloca(i32)
                builder.store(builder.trunc(value, i32), slot)
        else:   # floats: struct's conversions (PyFloat_Pack4/2 raise OverflowError as struct does)
            value = builder.call(as_double, [argument(position)])
            fail_if(builder.fcmp_ordered("==", value, ir.Constant(f64, -1.0)))
            if kind is ParamKind.FLOAT64:
                slot = builder.alloca(f64)
                builder.store(value, slot)
            else:
                size, name = (4, "PyFloat_Pack4") if kind is ParamKind.FLOAT32 else (2, "PyFloat_Pack2")
                slot = builder.alloca(i32 if size == 4 else i16)
                pack = api(name, ir.IntType(32), [f64, pointer, ir.IntType(32)])
                status = builder.call(pack, [value, builder.bitcast(slot, pointer), ir.Constant(i32, 1)])
                fail_if(builder.icmp_signed("!=", status, ir.Constant(i32, 0)))
        builder.store(builder.bitcast(slot, pointer), builder.gep(params, [ir.Constant(i64, index)]))

    constants = builder.call(api("PyBytes_AsString", pointer, [pointer]), [self])
    fields = builder.bitcast(constants, i64.as_pointer())
    launch_address = builder.load(fields)
    kernel = builder.inttoptr(builder.load(builder.gep(fields, [ir.Constant(i64, 1)])), pointer)
    sizes = builder.bitcast(builder.gep(fields, [ir.Constant(i64, 2)]), i32.as_pointer())
    block_x = builder.load(sizes)
    shared_bytes = builder.load(builder.gep(sizes, [ir.Constant(i64, 1)]))
    launch_type = ir.FunctionType(i32, [pointer, i32, i32, i32, i32, i32, i32, i32, pointer, pointer.as_pointer(),
                                        pointer.as_pointer()])
    launch = builder.inttoptr(launch_address, launch_type.as_pointer())
    # the GIL is released around the driver call, as cuda-python does
    state = builder.call(api("PyEval_SaveThread", pointer, []), [])
    one = ir.Constant(i32, 1)
    result = builder.call(launch, [kernel, *grid, block_x, one, one, shared_bytes, stream, params,
                                   ir.Constant(pointer.as_pointer(), None)])
    builder.call(api("PyEval_RestoreThread", ir.VoidType(), [pointer]), [state])
    builder.ret(builder.call(api("PyLong_FromLong", pointer, [i64]), [builder.sext(result, i64)]))
    builder.position_at_end(fail)
    builder.ret(ir.Constant(pointer, None))
    return str(module)
