"""fusedops' public ops as PyTorch custom operators (`torch.ops.fusedops.*`), for torch.compile.

torch.compile cannot trace into a kernel launch, so under tracing the public functions of
fusedops.functional call these operators instead: each is registered with
`torch.library.custom_op` (opaque to the compiler: a node in the graph), `register_fake` (output
shapes, dtypes and strides computed from the inputs' metadata, without running a kernel) and
`register_autograd` (the backward calls the fusedops backward operators, themselves custom ops),
so `torch.compile(model, fullgraph=True)` traces a model that uses fusedops without graph breaks.

Eager calls do not go through these operators: a custom-op dispatch costs ~20 us of host time on
the CPU (57 us with autograd; measured on the CI machine, against ~2 us for torch.softmax), more
than a whole fused kernel on small inputs. fusedops.functional therefore checks
`torch.compiler.is_compiling()` (~0.2 us) and uses the operators only while a graph is traced; the
eager path launches the kernels directly. Calling `torch.ops.fusedops.*` directly works eagerly too.

| operator                       | returns                      | gradient through               |
|--------------------------------|------------------------------|--------------------------------|
| softmax(input, dim, dtype)     | output                       | softmax_backward               |
| log_softmax(input, dim, dtype) | output                       | softmax_backward               |
| layer_norm(input, normalized_shape, weight, bias, eps) | (output, mean, rstd) | norm_backward |
| rms_norm(input, normalized_shape, weight, eps) | (output, rstd) | norm_backward               |
| matmul(a, b, bias, activation, out_dtype) | output            | matmul (transposed operands)   |
| scaled_dot_product_attention(query, key, value, attn_mask, is_causal, scale, enable_gqa)       |
|                                | (output, lse)                | scaled_dot_product_attention_backward |

layer_norm and rms_norm also return their row statistics, attention the log-sum-exp of each row (see
their modules); the Python wrappers that fusedops.functional calls return the output alone. Every
output is a new contiguous tensor (a strided input is read in place by the kernels), but attention's, which
is laid out as torch's (and fusedops' eager path) lay it out: in the query's memory order.

Which implementation runs is decided per call, as in fusedops.functional: CUDA tensors of the
kernels' dtypes run the fusedops kernels; CPU tensors run torch ops unless FUSEDOPS_INTERPRET=1
runs the kernels in the interpreter (how `torch.library.opcheck` is exercised on the CPU).

Autocast: `autocast_dtype(op, device_type)` states torch's autocast policy for each op;
fusedops.functional applies it in eager mode and under tracing, and the operators register the
same policy with `torch.library.register_autocast` for direct callers (autocast.py).

The package, one module a job:
    common.py         the namespace, the routed operator names, the routing rule
    autocast.py       the autocast policy and its registration
    softmax_ops.py    softmax, log_softmax          norm_ops.py       layer_norm, rms_norm
    matmul_ops.py     matmul                        attention_ops.py  scaled_dot_product_attention
Importing the package registers every operator, then the autocast policy, once.
"""

# Importing an operator module registers its operators with torch.library.
from fusedops.library.attention_ops import attention_runs_kernels, scaled_dot_product_attention
from fusedops.library.autocast import AUTOCAST_POLICY, autocast_cast, autocast_dtype, register_autocast
from fusedops.library.common import NAMESPACE, OPS, interpret_enabled, refuse_duals_at_autograd
from fusedops.library.matmul_ops import matmul
from fusedops.library.norm_ops import layer_norm, rms_norm
from fusedops.library.softmax_ops import softmax

# The policy under its former private name, which tests patch (one dict: patching either patches both).
_AUTOCAST_POLICY = AUTOCAST_POLICY

# The operator modules above have registered torch.ops.fusedops.*; the autocast kernels attach to them.
register_autocast()
# ... and their autograd kernels refuse torch.func.jvp's tangents too (which gave zeros), as the kernels refuse
# forward_ad's dual tensors.
refuse_duals_at_autograd()

__all__ = ["NAMESPACE", "OPS", "AUTOCAST_POLICY", "autocast_dtype", "autocast_cast", "interpret_enabled",
           "attention_runs_kernels", "softmax", "layer_norm", "rms_norm", "matmul", "scaled_dot_product_attention"]
