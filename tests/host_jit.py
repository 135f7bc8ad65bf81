"""Run a scalar kernel's compiled code on the host, without a GPU: the sm_90a LLVM IR, stripped of its
target and address spaces, JIT-compiled by llvmlite for this CPU and called once (one thread). Kernels
with thread ids, inline PTX or 16-bit floats (runtime calls on the host) are refused by run_on_host. Checks the
compiler's integer, cast and min/max lowering against the interpreter bit for bit. host_text and host_function
are its steps, for harnesses that also stand in for thread ids and barriers (tests/test_review_session31.py)."""

from __future__ import annotations

import ctypes
import re

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


def host_function(text: str, llir: str, kernel, args) -> tuple:
    """(the kernel JIT-compiled from the host IR `text`, as a ctypes function, its arguments, the engine that
    holds it): `args` in `kernel`'s parameter order as the compiled `llir` declares them (tensors by their
    data pointers, scalars as i8..i64, float or double). The engine must outlive the calls."""
    llvm = llvm_binding()
    module = llvm.parse_assembly(text)
    module.verify()
    engine = llvm.create_mcjit_compiler(module, llvm.Target.from_default_triple().create_target_machine())
    engine.finalize_object()
    name, params = re.search(r"define [^@]*@(\w+)\((.*)\)[^()]*\{", llir).groups()
    pieces = [p.strip() for p in re.split(r",\s*(?=(?:ptr|i\d+|float|double))", params)] if params.strip() else []
    by_name = dict(zip([p if isinstance(p, str) else p.name for p in kernel.params], args))
    types, values = [], []
    for piece in pieces:
        kind, param = piece.split()[0], re.search(r"%(\w+)$", piece).group(1)
        value = by_name[param]
        types.append(ctypes.c_void_p if kind == "ptr" else _CTYPES[kind])
        values.append(value.data_ptr() if kind == "ptr" else value)
    return ctypes.CFUNCTYPE(None, *types)(engine.get_function_address(name)), values, engine


def run_on_host(kernel, *args, **constexprs) -> None:
    """Compile `kernel` for sm_90a with `args` (tensors are passed by their data pointers) and run it once."""
    llir = kernel.compile(*args, target="sm_90a", **constexprs).asm["llir"]
    text = host_text(llir)
    assert "llvm.nvvm" not in text and "asm sideeffect" not in text, "not a host-runnable scalar kernel"
    assert " half" not in text and "bfloat" not in text, "16-bit floats need runtime calls on the host"
    function, values, engine = host_function(text, llir, kernel, args)
    function(*values)
