"""Softmax configs: how a launch tiles its rows, chosen from a small table by row length and layout.

Configs (`choose_config`, a small table): BLOCK is the next power of two >= n; the forward reads
rows of up to MAX_ONE_PASS_BLOCK 2-byte elements in one pass, the backward (two tensors in
registers), fp32 rows and column tiles up to MAX_ONE_PASS_TILE; num_warps by block from
ROW_NUM_WARPS; longer 2-byte rows take the persistent row sweeps of ROW_SWEEPS, longer fp32 rows
the online path. The limits are what ptxas fits in registers without spilling
(tests/test_softmax.py::test_shipped_configs_assemble_without_spills checks every config);
`bench/softmax.py --sweep` and .scratch/sm_long_sweep.py time the alternatives on a GPU.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from fusedops.kernels.sizes import next_power_of_2
from fusedops.kernels.softmax_rows import RowLayout, plan_rows

# Longest row the forward reads in one pass (elements); longer rows take the row sweeps (ROW_SWEEPS).
# H200, M=8192 fp16, N=32768: one pass (32 warps, 1 CTA per SM) 0.335-0.345 ms (session 4), the row
# sweeps 0.274 ms (94% of a 0.258 ms copy of the same bytes; .scratch/sm_long_sweep.py, session 5).
MAX_ONE_PASS_BLOCK = 16384
# Largest one-pass tile of the backward (dy and y in registers) and of column tiles.
MAX_ONE_PASS_TILE = 16384
# Chunk of a row per step of the online path: 2048 columns at 4 warps (16 per thread) let 8 programs
# share an SM, which kept the most bytes in flight (H200, M=8192, N=50257 fp16: forward 0.87 ms against
# 1.38 ms with 8192-column chunks at 16 warps; N=65536: 0.86 ms against 0.88 ms).
ONLINE_BLOCK = 2048
# num_warps of a one-row tile by its block: 8 to 32 elements per thread, i.e. one to four 16-byte
# fp16 loads in flight, and at most 64 registers at 32 warps (what 1024 threads may use).
# 8192: 8 warps (48 registers, 5 CTAs per SM) read at 108.8% of the copy against 100.3% at 16 warps
# (H200, M=8192 fp16; the backward is at 100% either way).
ROW_NUM_WARPS = {1024: 4, 2048: 4, 4096: 8, 8192: 8, 16384: 16, 32768: 32}
# Rows shorter than MIN_ROW_BLOCK are packed several per program, ROW_TILE_ELEMENTS elements in all.
MIN_ROW_BLOCK = 1024
ROW_TILE_ELEMENTS = 2048
# Column tiles: neighbouring rows per tile (8: 16 bytes of fp16, 64 when there are that many), and
# the tile's size in the online path.
COLUMN_ROWS = (8, 64)
COLUMN_TILE_ELEMENTS = 4096
# Rows of 2-byte elements past the one-pass limit, by direction: None, the online path (one program
# per row, ONLINE_BLOCK); or ((largest row block, (block, num_warps, programs_per_sm, sweep_hints,
# reverse, min_blocks_per_sm)), ...) in increasing order (None: any longer row), the persistent row
# sweeps, whose rows in flight (resident programs x row bytes x tensors read) stay in L2 between the
# two sweeps: the first sweep's loads evict_last, the second's evict_first, and streaming (.cs) stores
# keep them there. programs_per_sm = 64 leaves the grid at one program per row for M <= 64 x SMs:
# residency then bounds the rows in flight, and min_blocks_per_sm (dsl.launch_bounds) holds ptxas to
# the registers of that residency. H200, M=8192 fp16, % of a device copy / vs torch
# (.scratch/sm_long_sweep.py, session 5; session 4's configs without hints in brackets):
#   forward  32768: (16384, 16, 64, lb 2) 94.2%, 1.65x [79.0%]; 50257: (16384, 16, 2, lb 2) 91.8%, 1.45x
#            [72.6%]; 65536: 89.5%, 1.67x [75.1%];
#   backward 32768: (16384, 32, 1) 100.7%, 2.21x [80.9%]; 50257: 1.76x [1.71x]; 65536: 94.8%, 2.16x [1.66x].
L2_HINTS = ("evict_last", "evict_first", ".cs")
ROW_SWEEPS = {
    "forward": ((32768, (16384, 16, 64, L2_HINTS, False, 2)), (None, (16384, 16, 2, L2_HINTS, False, 2))),
    "backward": ((None, (16384, 32, 1, L2_HINTS, False, 0)),),
}


@dataclasses.dataclass(frozen=True)
class Config:
    """How one launch tiles the rows: the kernels' TILE, ROWS, BLOCK, ONE_PASS, PERSISTENT and num_warps.

    programs_per_sm: 0, one program per tile; else a persistent grid of min(tiles, SMs x
    programs_per_sm) programs, each looping over tiles (PERSISTENT). A persistent online "rows"
    tile of one row takes the row sweeps of softmax_row_sweeps (forward_row_sweeps / backward_row_sweeps): with few
    programs in flight their rows stay in L2 between the two sweeps, so DRAM sees one read of each
    input (forward: 1 read + 1 write; backward: 2 reads + 1 write).
    """

    tile: str           # "rows" [rows, block] or "columns" [block, rows]
    rows: int           # rows per program (power of two)
    block: int          # columns per tile (power of two): the whole row when one_pass
    one_pass: bool
    num_warps: int
    programs_per_sm: int = 0
    # Row sweeps: (eviction_policy of the first sweep's loads, of the second's, cache_modifier of the
    # stores), or () for none.
    sweep_hints: tuple = ()
    reverse: bool = False       # row sweeps: the second sweep walks the row backwards
    min_blocks_per_sm: int = 0  # row sweeps: dsl.launch_bounds (registers capped for this many CTAs per SM)


def _column_warps(elements: int) -> int:
    # Not 8: at 8 warps ptxas caps the axis-0 reductions' cross-warp step at 64 registers and
    # spills (fp16 forward); 4 and 16 warps assemble without spills.
    return 4 if elements <= 2048 else 16


def uses_column_tiles(layout: RowLayout) -> bool:
    """True when the first tensor's reduced dim is strided but its rows are contiguous neighbours."""
    _, inner_stride, col_stride = layout.strides[0]
    return layout.inner > 1 and inner_stride == 1 and col_stride != 1


def choose_config(layout: RowLayout, *, backward: bool = False, element_bytes: int = 2,
                  max_one_pass_block: Optional[int] = None) -> Config:
    """The config for `layout` (see the module docstring).

    backward: the backward kernel holds two tensors per element, so its one-pass limit is lower.
    element_bytes: the input's element size; MAX_ONE_PASS_BLOCK is for 2-byte inputs (a 32768
        fp32 log_softmax row spills at 32 warps).
    max_one_pass_block: overrides every one-pass limit (a power of two; tests use it to reach the
        online path with small tensors).
    """
    block = next_power_of_2(layout.n_cols)
    tile_limit = MAX_ONE_PASS_TILE if max_one_pass_block is None else max_one_pass_block
    if uses_column_tiles(layout):
        rows = COLUMN_ROWS[-1] if layout.inner >= COLUMN_ROWS[-1] else COLUMN_ROWS[0]
        if rows * block > tile_limit and COLUMN_ROWS[0] * block <= tile_limit:
            rows = COLUMN_ROWS[0]
        if rows * block <= tile_limit:
            return Config("columns", rows, block, True, _column_warps(rows * block))
        block = max(1, min(COLUMN_TILE_ELEMENTS, tile_limit) // rows)
        return Config("columns", rows, block, False, _column_warps(rows * block))
    row_limit = tile_limit if backward or element_bytes > 2 or max_one_pass_block is not None else MAX_ONE_PASS_BLOCK
    if block > row_limit:
        sweeps = ROW_SWEEPS["backward" if backward else "forward"]
        if sweeps is not None and element_bytes == 2 and max_one_pass_block is None:
            chunk, *options = next(choice for largest, choice in sweeps if largest is None or block <= largest)
            return Config("rows", 1, chunk, False, *options)
        block = min(ONLINE_BLOCK, row_limit)
        return Config("rows", 1, block, False, ROW_NUM_WARPS.get(block, 4))
    if block < MIN_ROW_BLOCK:
        return Config("rows", ROW_TILE_ELEMENTS // block, block, True, ROW_NUM_WARPS[MIN_ROW_BLOCK])
    return Config("rows", 1, block, True, ROW_NUM_WARPS[block])


def shipped_configs() -> list:
    """Every Config the dispatcher picks with the default limits, over row lengths 1 ... 2^20 in
    row and column tiles: sorted (direction, config, element sizes) triples, direction being
    "forward" or "backward" and element sizes the input element sizes (2, 4) it is picked for.
    The ahead-of-time PTX check compiles this set."""
    picked: dict = {}
    for n_cols in [1 << k for k in range(21)]:
        for inner in (1, 2, 4, 8, 16, 32, 64, 128):
            layout = plan_rows((4, n_cols, inner), 1, ((n_cols * inner, inner, 1),))
            for backward in (False, True):
                for element_bytes in (2, 4):
                    config = choose_config(layout, backward=backward, element_bytes=element_bytes)
                    key = ("backward" if backward else "forward", config)
                    picked.setdefault(key, set()).add(element_bytes)
    return sorted(((direction, config, tuple(sorted(sizes))) for (direction, config), sizes in picked.items()),
                  key=lambda entry: (entry[0], dataclasses.astuple(entry[1])))
