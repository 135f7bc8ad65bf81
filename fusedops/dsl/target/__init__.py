"""Target: LLVM IR -> PTX (llvmlite.binding, NVPTX), libdevice, ptxas and SASS dumps."""

from fusedops.dsl.target.ptx import SUPPORTED_ARCHS, CompiledPTX, Target, compile_to_ptx
from fusedops.dsl.target.ptxas import AssembleResult, assemble, ptxas_available, sass

__all__ = ["SUPPORTED_ARCHS", "CompiledPTX", "Target", "compile_to_ptx", "AssembleResult", "assemble",
           "ptxas_available", "sass"]
