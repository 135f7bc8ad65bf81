"""The rule for CLUSTER_SUM (`dsl.cluster_sum`): each value summed over the programs of the cluster.

In a kernel with clusters of more than one program the executor runs each cluster's programs side by
side (cooperative.py) and the sum is made there, in rank order; with clusters of one program (no
`dsl.cluster_dims`) the sums are the values themselves.
"""

from __future__ import annotations

from ..ir.ops import OpCode
from .context import register


@register(OpCode.CLUSTER_SUM, multiple_results=True)
def _cluster_sum(ctx, op, *values):
    if ctx.cluster_exchange is None:
        return values
    return ctx.cluster_exchange.cluster_sum(ctx, op, values)
