"""Run a scalar kernel's compiled code on the host, without a GPU: the sm_90a LLVM IR, stripped of its
target and address spaces, JIT-compiled by llvmlite for this CPU and called once (one thread). Kernels
with thread ids, inline PTX or 16-bit floats (runtime calls on the host) are refused. Checks the
compiler's integer, cast and min/max lowering against the interpreter bit for bit."""

from __future__ import annotations

import ctypes
import re

_CTYPES = {"i8": ctypes.c_int8, "i16": ctypes.c_int16, "i32": ctypes.c_int32, "i64": ctypes.c_int64}
_LLVM_READY = []


def run_on_host(kernel, *args, **constexprs) -> None:
    """Compile `kernel` for sm_90a with `args` (tensors are passed by their data pointers) and run it once."""
    import llvmlite.binding as llvm
    if not _LLVM_READY:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        _LLVM_READY.append(True)
    llir = kernel.compile(*args, target="sm_90a", **constexprs).asm["llir"]
    text = re.sub(r"^target (datalayout|triple) = .*$", "", llir, flags=re.M)
    text = text.replace("ptx_kernel ", "").replace("addrspace(1) ", "")
    text = re.sub(r'"nvvm\.[a-z]+"="[^"]*"', "", text)
    assert "llvm.nvvm" not in text and "asm sideeffect" not in text, "not a host-runnable scalar kernel"
    assert " half" not in text and "bfloat" not in text, "16-bit floats need runtime calls on the host"
    module = llvm.parse_assembly(text)
    module.verify()
    engine = llvm.create_mcjit_compiler(module, llvm.Target.from_default_triple().create_target_machine())
    engine.finalize_object()
    match = re.search(r"define [^@]*@(\w+)\((.*)\)[^()]*\{", llir)
    name, params = match.group(1), match.group(2)
    pieces = [p.strip() for p in re.split(r",\s*(?=(?:ptr|i\d+))", params)] if params.strip() else []
    by_name = dict(zip([p if isinstance(p, str) else p.name for p in kernel.params], args))
    types, values = [], []
    for piece in pieces:
        kind, param = piece.split()[0], re.search(r"%(\w+)$", piece).group(1)
        value = by_name[param]
        if kind == "ptr":
            types.append(ctypes.c_void_p)
            values.append(value.data_ptr())
        else:
            types.append(_CTYPES[kind])
            values.append(value)
    ctypes.CFUNCTYPE(None, *types)(engine.get_function_address(name))(*values)
