"""The compiler's pass pipeline, in order: read it top to bottom.

Run it with `manager.run_pipeline(function, default_pipeline(num_warps))`. An analysis in the list
(such as `analyze_pointers`) changes nothing; its result is kept in `PipelineReport.analyses` under
its name, where code generation picks it up.
"""

from __future__ import annotations

import functools

from .descriptors import expand_descriptor_loads
from .dot_accumulation import combine_dot_accumulation
from .induction_variables import substitute_induction_variables
from .invariant_operands import stage_invariant_operands
from .layout_assignment import assign_layouts
from .pipelining import pipeline_loops
from .pointer_analysis import analyze_pointers
from .sibling_reductions import group_sibling_reductions
from .wgmma_waits import defer_wgmma_waits
from .simplify import simplify


def default_pipeline(num_warps: int, arch=None, num_stages: int = 1) -> list:
    """The passes every kernel goes through, in order, for a CTA of `num_warps` warps on `arch`
    ("sm_80", "sm_90a", ...; None: no target, so `dot` stays on the FMA path)."""
    layouts = functools.partial(assign_layouts, num_warps=num_warps, arch=arch)
    layouts.__name__ = "assign_layouts"
    pipelining = functools.partial(pipeline_loops, num_stages=num_stages, num_warps=num_warps)
    pipelining.__name__ = "pipeline_loops"
    descriptors = functools.partial(expand_descriptor_loads, arch=arch)
    descriptors.__name__ = "expand_descriptor_loads"
    return [
        combine_dot_accumulation,   # c + dot(a, b) -> dot(a, b, c) (`acc += dsl.dot(a, b)`: one accumulator)
        substitute_induction_variables,  # `p += step` carries -> p0 + trip * step (pipelinable addresses)
        simplify,            # constant folding, CSE, DCE, to a fixed point
        descriptors,         # desc.load -> masked load (marked for TMA on sm_90a with FUSEDOPS_TMA=1)
        layouts,             # a distributed layout for every block value; convert_layout where needed
        stage_invariant_operands,   # loop-invariant wgmma operands: copied to shared memory once
        pipelining,          # loads feeding tensor-core dots in loops -> cp.async ring, num_stages deep
        group_sibling_reductions,   # independent reductions of one layout and axis: one cross-warp exchange
        defer_wgmma_waits,   # a wgmma's wait moves down to the first read of its result
        analyze_pointers,    # contiguity / divisibility / constancy, for vectorized memory access
    ]
