"""Layouts: which thread holds which element of a block, as linear maps over GF(2).

See DESIGN.md "Layouts". Every layout is a `LinearLayout` from input dims ("register", "lane",
"warp" for a distributed layout, "offset" for a shared-memory one) to the block's coordinates
("dim0", "dim1", ...). Pure Python; no torch, no LLVM.
"""

from .banks import (BANK_BYTES, NUM_BANKS, SharedAccessCost, bank_conflicts, shared_access_cost,
                    shared_vector_width)
from .blocked import BlockedParams, blocked, default_blocked, default_blocked_params, scalar_layout
from .convert import LaneShufflePlan, lane_shuffle_plan, needs_shared_memory, register_permutation
from .linear import (LANE, OFFSET, REGISTER, WARP, WARP_SIZE, LinearLayout, dim_names, distributed,
                     distributed_table)
from .mma import (mma_accumulator, mma_operand_a, mma_operand_b, mma_warps_per_cta, wgmma_accumulator,
                  wgmma_operand_a, wgmma_warpgroups_per_cta)
from .reduction import ReductionPlan, reduction_plan
from .shape_ops import broadcast, broadcast_to, expand_dims, reshape, slice_layout, transpose
from .shared import SWIZZLE_MODES, nvmma_shared, shared_offsets, swizzled_shared
from .swizzle import SwizzleChoice, choose_swizzle, contiguous_dim
from .vectorize import element_bytes, vector_width

__all__ = [
    "BANK_BYTES", "NUM_BANKS", "SharedAccessCost", "bank_conflicts", "shared_access_cost",
    "shared_vector_width",
    "BlockedParams", "blocked", "default_blocked", "default_blocked_params", "scalar_layout",
    "LaneShufflePlan", "lane_shuffle_plan", "needs_shared_memory", "register_permutation",
    "LANE", "OFFSET", "REGISTER", "WARP", "WARP_SIZE", "LinearLayout", "dim_names", "distributed",
    "distributed_table",
    "mma_accumulator", "mma_operand_a", "mma_operand_b", "mma_warps_per_cta", "wgmma_accumulator",
    "wgmma_operand_a", "wgmma_warpgroups_per_cta",
    "ReductionPlan", "reduction_plan",
    "broadcast", "broadcast_to", "expand_dims", "reshape", "slice_layout", "transpose",
    "SWIZZLE_MODES", "nvmma_shared", "shared_offsets", "swizzled_shared",
    "SwizzleChoice", "choose_swizzle", "contiguous_dim",
    "element_bytes", "vector_width",
]
