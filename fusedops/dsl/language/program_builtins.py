"""The builtins about the program and its launch: its place in the grid, launch directives, clusters, the
barrier, printing and assertions (the builtin machinery: core.py).
"""

from __future__ import annotations

from .core import builtin, constexpr


# -- the program's place in the grid -------------------------------------------------------------------
@builtin
def program_id(axis, *, _semantic=None):
    """The index of this program instance along grid `axis` (0, 1 or 2): an int32 scalar."""
    return _semantic.program_id(axis)


@builtin
def num_programs(axis, *, _semantic=None):
    """The number of program instances along grid `axis` (0, 1 or 2): an int32 scalar."""
    return _semantic.num_programs(axis)


# -- debugging ----------------------------------------------------------------------------------------
@builtin
def device_print(prefix, *args, hex=False, _semantic=None):
    """Print `prefix` and the values of `args` from every program instance (and thread)."""
    return _semantic.device_print(prefix, *args, hex=hex)


@builtin
def launch_bounds(min_blocks_per_sm, *, _semantic=None):
    """Ask ptxas to fit `min_blocks_per_sm` programs (CTAs) of this kernel on one SM at once: it caps
    the registers per thread at what that many CTAs of num_warps * 32 threads leave (65536 registers
    per SM on sm_80/sm_90), spilling if it must (PTX ISA, "Performance-Tuning Directives":
    `.minnctapersm` with `.maxntid`; CUDA's __launch_bounds__). A constexpr int from 1 to 32, for the
    whole kernel wherever it is called; calls with different values, and CTAs that cannot fit on one
    SM together (min_blocks_per_sm * num_warps * 32 > 2048 threads, which ptxas would ignore), raise
    CompilationError when compiling. The interpreter ignores it.
    """
    if isinstance(min_blocks_per_sm, constexpr):
        min_blocks_per_sm = min_blocks_per_sm.value
    return _semantic.launch_bounds(min_blocks_per_sm)


@builtin
def cluster_dims(size, *, _semantic=None):
    """Launch this kernel's programs in clusters of `size` consecutive program ids along grid axis 0
    (a thread block cluster, sm_90: PTX `.reqnctapercluster size, 1, 1`, CUDA's __cluster_dims__): the
    programs of a cluster run at the same time on one GPC, and the copy engine can deliver one load to
    all of them (`desc.load(offsets, multicast=True)`). The rank of a program in its cluster is
    `program_id(0) % size`. A constexpr int from 1 to 8, for the whole kernel wherever it is called.

    Launches whose grid's axis 0 is not a multiple of `size` raise LaunchError (everywhere, the
    interpreter and GPUs without clusters included, where the directive has no other effect); calls
    with different sizes raise CompilationError when compiling.
    """
    if isinstance(size, constexpr):
        size = size.value
    return _semantic.cluster_dims(size)


@builtin
def cluster_sum(*values, _semantic=None):
    """The sum of each of `values` over the programs of this program's cluster (`dsl.cluster_dims`), the
    same in every program of the cluster: the programs' values are added in rank order (rank =
    program_id(0) % size), so the result is deterministic. `values`: blocks or scalars of numbers,
    each summed in its own shape; 16-bit floats and small ints are summed in float32 / int32 as by
    `dsl.sum`. One value returns its sum, several a tuple of sums, exchanged together.

    On sm_90 each program writes its values into a slot in the shared memory of every program of the
    cluster (distributed shared memory: `mapa` + `st.shared::cluster`), then the cluster's threads
    meet at a cluster barrier (`barrier.cluster.arrive.release` / `wait.acquire`, PTX ISA "barrier.cluster";
    CUDA Programming Guide, "Distributed Shared Memory"), then each program adds the slots in its own
    shared memory. Slots alternate between two buffers, so a call costs one cluster barrier (the kernel
    starts with one more: no program writes into another before it runs). A kernel without clusters
    (size 1) gets the values themselves.

    Every program of a cluster must make the same cluster_sum calls, in the same order: on the GPU a
    program that makes fewer leaves the others waiting for ever (the interpreter, which runs a
    cluster's programs side by side, raises InterpreterError instead). Compiling a kernel with
    clusters of more than one program and cluster_sum for a GPU before sm_90 raises CompilationError.
    """
    results = _semantic.cluster_sum(values)
    return results[0] if len(results) == 1 else results


@builtin
def barrier(*, _semantic=None):
    """Wait until every thread of this program (CTA) reaches this point; the program's global and
    shared memory writes before it are visible to all its threads after it (PTX `bar.sync`, CUDA's
    __syncthreads). For a block one thread stored and another loads, e.g. a tile written to global
    memory and read back in another layout. Reach it from every thread or none: under a condition
    that is the same for the whole program (the DSL's scalar conditions are). The interpreter runs a
    program's elements together: nothing to wait for there."""
    return _semantic.barrier()


@builtin
def static_assert(cond, msg="", *, _semantic=None):
    """Fail the compilation with `msg` (CompilationError) where the compile-time `cond` is false (Triton's
    `tl.static_assert`; for runtime conditions use device_assert).

    Raises:
        CompilationError: `cond` is false, or a runtime value.
    """
    return _semantic.static_assert(cond, msg)


@builtin
def device_assert(cond, msg="", *, _semantic=None):
    """Fail the launch with `msg` where `cond` is false (checked by the interpreter; on the GPU a trap)."""
    return _semantic.device_assert(cond, msg)


__all__ = [
    "program_id", "num_programs", "device_print", "launch_bounds", "cluster_dims", "cluster_sum", "barrier",
    "static_assert", "device_assert",
]
