"""fusedops under torch's tracers, and the nn modules' argument checks against torch's.

- torch.jit.trace: while it runs every op takes torch's path (functional.needs_torch), so the trace
  records torch's ops, with sizes that follow the input: the traced module runs other shapes right.
- torch.fx.symbolic_trace: the public ops, fusedops.nn.linear.linear and
  fusedops.nn.attention.multi_head_attention are leaf functions, so a patched model traces into a graph
  of calls to them that runs (and pickles) like the model.
- MultiheadAttention's flash path raises what torch's forward raises, in torch's order; Linear raises
  torch's error types.
"""

from __future__ import annotations

import copy
import pickle
import re

import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.nn as fnn
from fusedops import functional
from fusedops.nn.attention import multi_head_attention
from fusedops.nn.linear import linear
from helpers import assert_close, module_pair

D = torch.float64


_pair = module_pair


class _Attention(torch.nn.Module):
    """Self-attention with an optional mask, the output only."""

    def __init__(self, attention, need_weights=False):
        super().__init__()
        self.attention, self.need_weights = attention, need_weights

    def forward(self, x, mask=None):
        return self.attention(x, x, x, attn_mask=mask, need_weights=self.need_weights)[0]


def _modules():
    """name -> (fusedops module, torch module with the same weights, input shape to trace, other shape)."""
    mha = [_pair(fnn.MultiheadAttention, torch.nn.MultiheadAttention, 8, 2, dtype=D, batch_first=first)
           for first in (False, True)]
    return {
        "LayerNorm": _pair(fnn.LayerNorm, torch.nn.LayerNorm, 8, dtype=D) + ((2, 8), (5, 8)),
        "RMSNorm": _pair(fnn.RMSNorm, torch.nn.RMSNorm, 8, dtype=D) + ((2, 3, 8), (4, 1, 8)),
        "Linear": _pair(fnn.Linear, torch.nn.Linear, 8, 4, dtype=D) + ((2, 3, 8), (5, 7, 8)),
        "Softmax": (fnn.Softmax(1), torch.nn.Softmax(1), (2, 8), (5, 9)),
        "LogSoftmax": (fnn.LogSoftmax(0), torch.nn.LogSoftmax(0), (2, 8), (5, 9)),
        "MultiheadAttention": tuple(_Attention(m.eval()) for m in mha[0]) + ((3, 2, 8), (5, 4, 8)),
        "MultiheadAttention_batch_first": tuple(_Attention(m.eval()) for m in mha[1]) + ((2, 3, 8), (4, 5, 8)),
    }


# ------------------------------------------------------------------------------------------------
# torch.jit.trace
# ------------------------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
@pytest.mark.parametrize("path", ["interpret", "fallback"])
@pytest.mark.parametrize("name", list(_modules()))
def test_jit_trace_of_modules_runs_other_shapes(request, path, name):
    request.getfixturevalue(path)
    ours, theirs, traced_shape, other_shape = _modules()[name]
    traced = torch.jit.trace(ours, torch.randn(traced_shape, dtype=D), check_trace=False)
    assert "PythonOp" not in str(traced.graph)         # torch's ops, no autograd Function of a kernel
    x = torch.randn(other_shape, dtype=D)
    assert_close(traced(x), theirs(x), D)


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")     # the ops' shape checks (constants in the trace)
def test_jit_trace_of_functional_ops(interpret):
    w, m = torch.randn(8, dtype=D), torch.randn(8, 8, dtype=D)

    def ops(f, x):
        y = f.softmax(x, -1) + f.log_softmax(x, 0) + f.layer_norm(x, (8,), w, w) + f.rms_norm(x, (8,), w)
        return f.matmul(y, m, w, "gelu") + f.scaled_dot_product_attention(x[None], x[None], y[None], is_causal=True)[0]

    class Torch:
        softmax, log_softmax, layer_norm, rms_norm = torch.softmax, torch.log_softmax, F.layer_norm, F.rms_norm
        scaled_dot_product_attention = F.scaled_dot_product_attention
        matmul = staticmethod(lambda a, b, bias, activation: F.gelu(a @ b + bias))

    traced = torch.jit.trace(lambda x: ops(fusedops, x), torch.randn(3, 8, dtype=D), check_trace=False)
    x = torch.randn(6, 8, dtype=D)
    assert_close(traced(x), ops(Torch, x), D)


# ------------------------------------------------------------------------------------------------
# torch.fx.symbolic_trace
# ------------------------------------------------------------------------------------------------
class _Model(torch.nn.Module):
    """Every module kind patch() replaces, MultiheadAttention with and without weights, with other key
    and value dims, with the is_causal hint; and fusedops ops called by name."""

    def __init__(self):
        super().__init__()
        self.attention = torch.nn.MultiheadAttention(8, 2, dtype=D, batch_first=True)
        self.cross = torch.nn.MultiheadAttention(8, 2, dtype=D, kdim=4, vdim=4)
        self.linear = torch.nn.Linear(8, 8, dtype=D)
        self.norm = torch.nn.LayerNorm(8, dtype=D)
        self.rms = torch.nn.RMSNorm(8, dtype=D)
        self.softmax = torch.nn.Softmax(-1)
        self.log_softmax = torch.nn.LogSoftmax(-1)

    def forward(self, x, memory):
        causal = torch.nn.Transformer.generate_square_subsequent_mask(x.shape[1], dtype=D)
        h = self.attention(x, x, x)[0] + self.attention(x, x, x, attn_mask=causal, need_weights=False,
                                                        is_causal=True)[0]
        h = h + self.cross(x.transpose(0, 1), memory, memory, need_weights=False)[0].transpose(0, 1)
        h = self.softmax(self.norm(self.linear(h))) + self.log_softmax(self.rms(h))
        return h + fusedops.rms_norm(x, (8,)) + functional.softmax(x, 0)


@pytest.mark.parametrize("path", ["interpret", "fallback"])
def test_fx_symbolic_trace_of_a_patched_model_records_fusedops_calls(request, path):
    request.getfixturevalue(path)
    model = _Model().eval()
    patched = copy.deepcopy(model)
    assert len(fnn.patch(patched).replaced) == 7
    graph = torch.fx.symbolic_trace(patched)
    called = {node.target for node in graph.graph.nodes if node.op == "call_function"}
    assert {functional.softmax, functional.log_softmax, functional.layer_norm, functional.rms_norm, linear,
            multi_head_attention} <= called
    assert not any(node.op == "call_module" for node in graph.graph.nodes)
    for batch, length in ((2, 3), (3, 5)):
        x, memory = torch.randn(batch, length, 8, dtype=D), torch.randn(4, batch, 4, dtype=D)
        expected = model(x, memory)
        assert_close(graph(x, memory), expected, D)
    assert_close(pickle.loads(pickle.dumps(graph))(x, memory), expected, D)


def test_fx_leaves_do_not_change_eager_calls():
    assert fusedops.softmax is functional.softmax            # the package's name is the op itself
    x = torch.randn(3, 8, dtype=D)
    assert_close(fusedops.softmax(x, -1), torch.softmax(x, -1), D)


# ------------------------------------------------------------------------------------------------
# MultiheadAttention: torch's checks, in torch's order
# ------------------------------------------------------------------------------------------------
def _raises_like_torch(ours, theirs, *args, **kwargs):
    with pytest.raises(Exception) as expected:
        theirs(*args, **kwargs)
    with pytest.raises(type(expected.value)) as actual:
        ours(*args, **kwargs)
    return expected.value, actual.value


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("mask_shape", [(1, 3, 3), (3, 3), (4, 3, 3), (7, 3, 3), (2, 2)])
def test_mha_is_causal_hint_drops_any_mask(interpret, batch_first, mask_shape):
    """Without a key_padding_mask and weights, torch drops attn_mask under is_causal before checking its
    shape (2-D or 3-D), and runs a causal attention."""
    ours, theirs = (m.eval() for m in _pair(fnn.MultiheadAttention, torch.nn.MultiheadAttention, 8, 2, dtype=D,
                                            batch_first=batch_first))
    x = torch.randn(2, 3, 8, dtype=D)
    mask = torch.randn(mask_shape, dtype=D)
    expected = theirs(x, x, x, attn_mask=mask, is_causal=True, need_weights=False)[0]
    assert_close(ours(x, x, x, attn_mask=mask, is_causal=True, need_weights=False)[0], expected, D)


@pytest.mark.parametrize("case", ["4d_query_causal_no_mask", "4d_query_int_mask", "causal_no_mask",
                                  "causal_padding_bad_mask", "unbatched_bad_3d_mask_causal", "bad_mask_and_padding"])
def test_mha_errors_come_in_torchs_order(interpret, case):
    ours, theirs = _pair(fnn.MultiheadAttention, torch.nn.MultiheadAttention, 8, 2, dtype=D)
    x, x4 = torch.randn(3, 2, 8, dtype=D), torch.randn(1, 3, 2, 8, dtype=D)
    padding = torch.zeros(2, 3, dtype=torch.bool)
    args, kwargs = {
        "4d_query_causal_no_mask": ((x4, x4, x4), dict(is_causal=True)),
        "4d_query_int_mask": ((x4, x4, x4), dict(attn_mask=torch.zeros(3, 3, dtype=torch.int64))),
        "causal_no_mask": ((x, x, x), dict(is_causal=True)),
        "causal_padding_bad_mask": ((x, x, x), dict(is_causal=True, key_padding_mask=padding,
                                                    attn_mask=torch.zeros(1, 3, 3, dtype=torch.bool))),
        "unbatched_bad_3d_mask_causal": ((x[:, 0], x[:, 0], x[:, 0]), dict(is_causal=True,
                                                                           attn_mask=torch.zeros(1, 3, 3))),
        "bad_mask_and_padding": ((x, x, x), dict(key_padding_mask=padding[:1], attn_mask=torch.zeros(2, 3, dtype=torch.bool))),
    }[case]
    expected, actual = _raises_like_torch(ours, theirs, *args, need_weights=False, **kwargs)
    assert str(actual) == str(expected) or case == "bad_mask_and_padding"


# ------------------------------------------------------------------------------------------------
# Linear: torch's error types, messages naming the argument and what was expected
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["interpret", "fallback"])
@pytest.mark.parametrize("case", ["last_dim", "last_dim_3d", "zero_dim", "dtype", "not_a_tensor"])
def test_linear_errors(request, path, case):
    request.getfixturevalue(path)
    ours, theirs = _pair(fnn.Linear, torch.nn.Linear, 8, 4, dtype=D)
    x, match = {"last_dim": (torch.randn(3, 5, dtype=D), r"'input' of shape \(\.\.\., 8\).*\(3, 5\)"),
                "last_dim_3d": (torch.randn(2, 3, 9, dtype=D), r"'input' of shape \(\.\.\., 8\).*\(2, 3, 9\)"),
                "zero_dim": (torch.tensor(1.0, dtype=D), "'input' of shape .* got a 0-d tensor"),
                "dtype": (torch.randn(3, 8), "'input' of the weight's dtype torch.float64, got torch.float32"),
                "not_a_tensor": ([[1.0] * 8], "must be Tensor")}[case]
    expected, actual = _raises_like_torch(ours, theirs, x)
    assert isinstance(actual, (RuntimeError, TypeError))
    assert re.search(match, str(actual)), str(actual)
