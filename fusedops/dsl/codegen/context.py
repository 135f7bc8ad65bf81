"""The state of lowering one kernel to LLVM IR, passed to every lowering rule.

A block value with layout L lowers to the list of LLVM scalars one thread holds, indexed by L's
register index; a scalar lowers to one LLVM value. `LoweringContext.values` maps IR values to these.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from llvmlite import ir

from ..errors import CompilationError
from ..ir import Value
from ..target import llvm_types as T
from . import layout_access


@dataclasses.dataclass
class LoweringContext:
    module: ir.Module
    function: ir.Function
    builder: ir.IRBuilder          # where the op being lowered goes
    prologue: ir.IRBuilder         # the entry block: per-thread constants computed once
    arch: str
    num_warps: int
    axis_info: Any                 # passes.pointer_analysis result (contiguity, divisibility, constancy)
    shared_memory: Optional[ir.Value] = None   # `ptr addrspace(3)` to the dynamic shared buffer
    shared_bytes: int = 0          # dynamic shared memory the kernel needs (buffers + the largest scratch use)
    scratch_offset: int = 0        # bytes of live shared buffers (pipelining) that scratch uses start after
    live_buffers: dict = dataclasses.field(default_factory=dict)     # id(local_alloc result) -> end byte
    values: dict = dataclasses.field(default_factory=dict)           # id(Value) -> LLVM value(s)
    _coordinate_cache: dict = dataclasses.field(default_factory=dict)
    thread_id: Optional[ir.Value] = None
    lane_id: Optional[ir.Value] = None
    warp_id: Optional[ir.Value] = None
    tensor_maps: dict = dataclasses.field(default_factory=dict)      # id(tma_copy op) -> (LLVM param, TensorMapParam)
    cache_policies: dict = dataclasses.field(default_factory=dict)   # eviction policy -> i64 L2 policy (cache_hints.py)
    cluster_sum: Optional[tuple] = None   # (cluster size, bytes per rank slot, call counter): cluster_sum.prepare
    wgmma_a_words: dict = dataclasses.field(default_factory=dict)    # id(deferred dot result) -> its A registers
    issuing_thread: int = 0        # the thread that issues copies and waits for their slots (a producer warp's lane 0)
    barrier_threads: int = 0       # threads of a CTA barrier: 0 = all, else the consumer warps' (after a producer_warp)
    fp_fusion: bool = False        # float add / sub / mul (and sum reductions) carry LLVM's `contract`: FMAs may form

    def arch_at_least(self, sm: int) -> bool:
        """Whether the target's compute capability (sm_90a -> 90) is at least `sm`."""
        return int(self.arch[3:5]) >= sm

    # -- values ------------------------------------------------------------------------------------
    def get(self, value: Value):
        try:
            return self.values[id(value)]
        except KeyError:
            raise CompilationError(f"internal error: {value!r} used before it was lowered") from None

    def set(self, value: Value, lowered) -> None:
        self.values[id(value)] = lowered

    # -- thread coordinates ------------------------------------------------------------------------
    def lane_warp_coordinates(self, layout) -> tuple:
        """Per output dim, the LLVM i32 coordinate that the lane and warp contribute (computed once
        in the prologue, XOR-combined from the layout's lane and warp bases)."""
        key = layout_access.cache_key(layout)
        cached = self._coordinate_cache.get(key)
        if cached is not None:
            return cached
        b = self.prologue
        rank = len(layout_access.shape(layout))
        coords = [ir.Constant(T.i32, 0)] * rank
        for source, bases in self.thread_bit_sources(False, layout_access.lane_bases(layout),
                                                     layout_access.warp_bases(layout)):
            for bit, basis in bases:
                if not any(basis):
                    continue
                flag = b.and_(b.lshr(source, ir.Constant(T.i32, bit)), ir.Constant(T.i32, 1))
                for dim, component in enumerate(basis):
                    if component:
                        term = b.mul(flag, ir.Constant(T.i32, component))
                        coords[dim] = b.xor(coords[dim], term)
        result = tuple(coords)
        self._coordinate_cache[key] = result
        return result

    def fresh_thread_id(self):
        """The thread id read at the builder's position by an asm LLVM cannot equate with the prologue's
        read (it would through CSE, and then reuse the prologue's values derived from it)."""
        return T.inline_asm(self.builder, "mov.u32 $0, %tid.x;", "=r", [], T.i32)

    def thread_bit_sources(self, here: bool, lane_bases, warp_bases):
        """[(source, [(bit, basis)])]: which bit of which value selects each lane and warp basis. In
        the prologue, bits of the lane and warp ids; `here`, bits of the thread id (lane bit k is
        thread bit k, warp bit k thread bit 5 + k), so that nothing is shared with the prologue's
        values (LLVM would sink a shared value to the first block using it, see codegen/tma_store.py)."""
        if here:
            return [(self.fresh_thread_id(), list(enumerate(lane_bases)) +
                     [(5 + bit, basis) for bit, basis in enumerate(warp_bases)])]
        return [(self.lane_id, list(enumerate(lane_bases))), (self.warp_id, list(enumerate(warp_bases)))]

    def element_coordinates(self, layout, register: int) -> tuple:
        """LLVM i32 coordinates of the element that `register` of this thread holds under `layout`."""
        constant = layout_access.register_coordinates(layout, register)
        runtime = self.lane_warp_coordinates(layout)
        out = []
        for dim, (c, r) in enumerate(zip(constant, runtime)):
            if c == 0:
                out.append(r)
            elif layout_access.register_bits_disjoint(layout, dim):
                out.append(self.builder.or_(r, ir.Constant(T.i32, c)))
            else:
                out.append(self.builder.xor(r, ir.Constant(T.i32, c)))
        return tuple(out)
