"""What the interpreter checks of a kernel launched in clusters (`dsl.cluster_dims`): the grid, and that
the programs of a cluster make the same `desc.load(..., multicast=True)` calls.

On the GPU the programs of a cluster share the copies of a multicast load: a program whose box differs
from its cluster's gets a mix of the boxes, and one that makes fewer such calls leaves the others
waiting for ever. Neither can be detected there. In the interpreter rank 0 of a cluster runs first:
before the other ranks (programs run one after another), or, in a kernel that calls `dsl.cluster_sum`
(its programs run side by side: cooperative.py), first between two cluster_sum calls. So the
interpreter records rank 0's calls and compares each other rank's with them, and also how many
cluster_sum calls each program made before each of its multicast loads (on the GPU a load on the other
side of a cluster_sum than rank 0's leaves the cluster waiting too).
"""

from __future__ import annotations

from ..ir.ops import OpCode, cluster_size
from ..runtime.launcher import check_cluster_grid


class ClusterLog:
    """The multicast loads of one launch, per cluster: (cluster, y, z) -> {id(op): [(offsets, cluster_sum
    calls before it) per call]}."""

    def __init__(self, function, grid: tuple, kernel: str):
        self.size = cluster_size(function)
        check_cluster_grid(grid, self.size, kernel)
        self._multicast_ops = [op for op in function.walk()
                               if op.opcode == OpCode.DESCRIPTOR_LOAD and op.attrs.get("multicast")]
        self.checked = self.size > 1 and bool(self._multicast_ops)
        self._calls: dict = {}

    def _key(self, program_id: tuple) -> tuple:
        return (program_id[0] // self.size, program_id[1], program_id[2])

    def record(self, ctx, op, offsets: tuple) -> None:
        """One multicast load of program `ctx.program_id` (its calls so far: ctx.multicast_calls).

        Raises:
            InterpreterError: rank 0 of the cluster loaded another box at this call, made fewer calls, or
                made this call after another number of cluster_sum calls.
        """
        calls = ctx.multicast_calls
        made = calls.get(id(op), 0)
        calls[id(op)] = made + 1
        cluster = self._calls.setdefault(self._key(ctx.program_id), {})
        log = cluster.setdefault(id(op), [])
        if ctx.program_id[0] % self.size == 0:
            log.append((offsets, ctx.cluster_sum_calls))
            return
        if made >= len(log):
            # rank 0 has run up to its next cluster_sum call only: count the calls before that one
            before = f" before cluster_sum call {ctx.cluster_sum_calls + 1}" if ctx.cluster_exchange is not None else ""
            raise ctx.error(op, f"a descriptor load with multicast=True runs {made + 1} times{before} in this program "
                                f"but {len(log)} times in rank 0 of its cluster: every program of a cluster must make "
                                f"the same multicast loads (on the GPU the cluster would hang)")
        expected, sums = log[made]
        if expected != offsets:
            raise ctx.error(op, f"a descriptor load with multicast=True loads the box at {offsets} in this program but "
                                f"at {expected} in rank 0 of its cluster (call {made + 1}): every program of a "
                                f"cluster must load the same box")
        if sums != ctx.cluster_sum_calls:
            raise ctx.error(op, f"a descriptor load with multicast=True makes its call {made + 1} after "
                                f"{ctx.cluster_sum_calls} cluster_sum calls in this program but after {sums} in rank 0 "
                                f"of its cluster: every program of a cluster must make the same multicast loads "
                                f"between the same cluster_sum calls (on the GPU the cluster would hang)")

    def finish(self, ctx) -> None:
        """After program `ctx.program_id` ran.

        Raises:
            InterpreterError: a rank > 0 made fewer multicast loads than rank 0 of its cluster.
        """
        if ctx.program_id[0] % self.size == 0:
            return
        calls = ctx.multicast_calls
        for op in self._multicast_ops:
            expected = len(self._calls.get(self._key(ctx.program_id), {}).get(id(op), ()))
            if calls.get(id(op), 0) != expected:
                raise ctx.error(op, f"a descriptor load with multicast=True runs {calls.get(id(op), 0)} times in this "
                                    f"program but {expected} times in rank 0 of its cluster: every program of a "
                                    f"cluster must make the same multicast loads (on the GPU the cluster would hang)")
