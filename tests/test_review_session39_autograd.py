"""Review (session 39, autograd): the autograd Functions of every public op (fusedops/autograd/*.py: softmax,
log_softmax, layer_norm / rms_norm, matmul, scaled_dot_product_attention) and the autograd registrations of the
custom operators (fusedops/library/*_ops.py, torch.ops.fusedops.*), judged by torch's autograd contract. The
kernels run in the NumPy interpreter (FUSEDOPS_INTERPRET=1, the route CUDA tensors take); the oracle is torch in
float64.

What was tried (peer report -> case), right unless listed under DEFECTS:
- pytorch#5569 / #25340, pyro#1049, sru#171, dgl#1060 (tensors kept on ctx instead of save_for_backward: leaks,
  hooks bypassed): a forward + backward loop keeps the number of live tensors constant; weakrefs to inputs die
  after `del`; intermediates saved for the backward are freed by the backward while the output lives on; every
  saved tensor goes through saved_tensors_hooks (a pack/unpack that copies gives the same gradients) and through
  torch.autograd.graph.allow_mutation_on_saved_tensors (every input or output changed in place after the forward
  gives the gradients of the unchanged values), for the eager Functions and the custom operators.
- Liger-Kernel#370 / apex (version counter): an input changed in place after the forward fails the backward with
  torch's "modified by an inplace operation" error where the backward reads it; so does the output of softmax /
  log_softmax / attention (which save it); the output of the norms and matmul (not saved) may be changed in place.
- retain_graph=True: a second backward gives the same gradients; a further one without it raises torch's
  "backward through the graph a second time" error.
- needs_input_grad: a frozen input (a frozen weight, a frozen query) gets grad None.
- FlagGems / unsloth (wrong gradient shape for broadcast inputs): stride-0 expanded leaves get gradients of their
  own shape and the right values.
- mixed dtypes (a bfloat16 input with float32 weight / bias): every gradient has its input's dtype.
- Tensor.register_hook on inputs and outputs, torch.autograd.graph.register_multi_grad_hook, detect_anomaly (it
  names the fusedops backward node when that node returns NaN).
- create_graph=True (double backward) is covered by tests/test_review_session37_ops.py.

DEFECTS found (fixed):
1. The custom operators torch.ops.fusedops.layer_norm / rms_norm (kernel route), softmax / log_softmax of a 0-d
   input and scaled_dot_product_attention returned their output as a view (y.view(x.shape), o.reshape(...), also
   of the same shape). To autograd that is a view made inside a custom Function, which may not be modified in
   place: `y = torch.ops.fusedops.layer_norm(...)[0]; y += residual` raised "Output 0 of
   GeneratedBackwardFor_fusedops_layer_norm_default is a view and is being modified inplace" where torch's
   layer_norm and fusedops' eager route allow it (the path of an exported program run eagerly, or of a direct
   call; pytorch#90507 is the same fault in AOT autograd), and attention's output raised that error at the
   in-place op itself instead of torch's version-counter error at the backward. Fixed by
   library/common.unviewed (the output as a tensor over the same memory that is not a view; no copy), used by
   norm_ops, softmax_ops and attention_ops.
2. torch.ops.fusedops.matmul (without an activation) saved both operands for its backward, so an operand changed
   in place after the call failed the backward even where its partner needs no gradient, so that nothing reads
   it (x @ w with x frozen and w updated in place: dW reads x alone), where torch.matmul and fusedops' eager
   MatmulFunction run. Fixed in
   library/matmul_ops._setup_matmul: as MatmulFunction, an operand is saved only where the other's gradient reads
   it (else a meta stand-in of its shape, strides and dtype); with an activation the operator still recomputes Z
   from a, b and the bias, so all three are read (documented there).
Left as is (designed, documented in NormFunction.forward): where the norms' input needs no gradient, the weight is
kept on ctx unsaved (only its dtype and layout are read), so a computed weight lives as long as the graph.
"""

from __future__ import annotations

import gc
import math
import warnings
import weakref

import pytest
import torch
import torch.nn.functional as F

import fusedops
import fusedops.library  # noqa: F401  (registers torch.ops.fusedops.*)
from helpers import assert_close

D = torch.float64
OPS = torch.ops.fusedops
INPLACE_ERROR = "modified by an inplace operation"


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _sdpa_ref(q, k, v, causal=False):
    s = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), -math.inf)
    return torch.softmax(s, -1) @ v


# name -> (fusedops call, float64 torch reference, input shapes); every input requires grad
CASES = {
    "softmax": (lambda t: fusedops.softmax(t[0], -1), lambda t: torch.softmax(t[0], -1), [(3, 8)]),
    "log_softmax": (lambda t: fusedops.log_softmax(t[0], 0), lambda t: torch.log_softmax(t[0], 0), [(3, 8)]),
    "layer_norm": (lambda t: fusedops.layer_norm(t[0], (8,), t[1], t[2]),
                   lambda t: F.layer_norm(t[0], (8,), t[1], t[2]), [(3, 8), (8,), (8,)]),
    "rms_norm": (lambda t: fusedops.rms_norm(t[0], (8,), t[1], eps=1e-6),
                 lambda t: F.rms_norm(t[0], (8,), t[1], eps=1e-6), [(3, 8), (8,)]),
    "matmul": (lambda t: fusedops.matmul(t[0], t[1], t[2], activation="gelu"),
               lambda t: F.gelu(t[0] @ t[1] + t[2]), [(3, 8), (8, 4), (4,)]),
    "attention": (lambda t: fusedops.scaled_dot_product_attention(*t, is_causal=True),
                  lambda t: _sdpa_ref(*t, causal=True), [(1, 2, 4, 8)] * 3),
    "op_layer_norm": (lambda t: OPS.layer_norm(t[0], [8], t[1], t[2], 1e-5)[0],
                      lambda t: F.layer_norm(t[0], (8,), t[1], t[2]), [(3, 8), (8,), (8,)]),
    "op_rms_norm": (lambda t: OPS.rms_norm(t[0], [8], t[1], 1e-6)[0],
                    lambda t: F.rms_norm(t[0], (8,), t[1], eps=1e-6), [(3, 8), (8,)]),
    "op_matmul": (lambda t: OPS.matmul(t[0], t[1], t[2], "gelu", None),
                  lambda t: F.gelu(t[0] @ t[1] + t[2]), [(3, 8), (8, 4), (4,)]),
    "op_attention": (lambda t: OPS.scaled_dot_product_attention(*t, None, True, None, False)[0],
                     lambda t: _sdpa_ref(*t, causal=True), [(1, 2, 4, 8)] * 3),
    "op_softmax": (lambda t: OPS.softmax(t[0], -1, None), lambda t: torch.softmax(t[0], -1), [(3, 8)]),
}
# the ops whose backward reads their output (a change of it in place must fail the backward)
SAVES_OUTPUT = {"softmax", "log_softmax", "attention", "op_attention", "op_softmax"}


def _inputs(seed, shapes, frozen=()):
    g = _gen(seed)
    return [torch.randn(s, dtype=D, generator=g).requires_grad_(j not in frozen) for j, s in enumerate(shapes)]


def _grads(y, inputs, dy):
    wanted = [t for t in inputs if t.requires_grad]
    got = iter(torch.autograd.grad(y, wanted, dy))
    return [next(got) if t.requires_grad else None for t in inputs]


def _reference_grads(name, inputs, dy):
    ref_inputs = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    return _grads(CASES[name][1](ref_inputs), ref_inputs, dy)


def _assert_grads(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert (g is None) == (w is None)
        if g is not None:
            assert g.shape == w.shape and g.dtype == w.dtype
            assert_close(g, w, D)


# -- DEFECT 1: the custom operators' outputs are not views ----------------------------------------------

@pytest.mark.parametrize("name", ["op_layer_norm", "op_rms_norm", "op_matmul"])
def test_custom_op_output_changed_in_place_then_backward(seed, name):
    """`y = op(...); y.mul_(2); y += r` as after torch's op: the gradients are twice torch's (the op's backward
    does not read y)."""
    f, _, shapes = CASES[name]
    inputs = _inputs(seed, shapes)
    y = f(inputs)
    assert not y._is_view()
    residual = torch.randn(y.shape, dtype=D, generator=_gen(seed + 1))
    y.mul_(2)
    y += residual
    dy = torch.randn(y.shape, dtype=D, generator=_gen(seed + 2))
    _assert_grads(_grads(y, inputs, dy), _reference_grads(name, inputs, 2 * dy))


@pytest.mark.parametrize("case", ["layer_norm_3d", "rms_norm_1d", "softmax_0d", "log_softmax_0d", "attention_3d",
                                  "attention_4d", "attention_5d"])
def test_custom_op_outputs_are_not_views(seed, case):
    """Every output of the operators is a tensor of its own (also lse, the statistics), with the right values;
    where the backward reads the output, changing it in place fails the backward with torch's version error,
    not at the in-place op with the view error."""
    g = _gen(seed)
    r = lambda *s: torch.randn(s, dtype=D, generator=g).requires_grad_()  # noqa: E731
    if case == "layer_norm_3d":
        x = r(2, 3, 8)
        outs, ref = OPS.layer_norm(x, [3, 8], None, None, 1e-5), F.layer_norm(x, (3, 8))
    elif case == "rms_norm_1d":
        x = r(8)
        outs, ref = OPS.rms_norm(x, [8], None, 1e-6), F.rms_norm(x, (8,), eps=1e-6)
    elif case.endswith("softmax_0d"):
        x = r()
        log = case.startswith("log")
        outs = (OPS.log_softmax if log else OPS.softmax)(x, 0, None)
        ref = (torch.log_softmax if log else torch.softmax)(x, 0)
    else:
        shape = {"attention_3d": (2, 4, 8), "attention_4d": (1, 2, 4, 8), "attention_5d": (2, 1, 2, 4, 8)}[case]
        q, k, v = r(*shape), r(*shape), r(*shape)
        outs, ref = OPS.scaled_dot_product_attention(q, k, v, None, False, None, False), _sdpa_ref(q, k, v)
    outs = outs if isinstance(outs, tuple) else (outs,)
    y = outs[0]
    assert not any(t._is_view() for t in outs), [t._is_view() for t in outs]
    assert y.shape == ref.shape
    assert_close(y, ref, D)
    y.add_(1.0)     # allowed at the in-place op (torch's ops allow it too)
    if "softmax" in case or "attention" in case:
        with pytest.raises(RuntimeError, match=INPLACE_ERROR):
            y.sum().backward()
    else:
        y.sum().backward()


@pytest.mark.parametrize("route", ["eager", "op"])
@pytest.mark.parametrize("shapes", [((3, 8), (8, 4)), ((2, 3, 8), (8,)), ((8,), (2, 8, 4))])
def test_matmul_operand_changed_in_place_whose_partner_is_frozen(seed, route, shapes):
    """DEFECT 2: as torch.matmul, an operand changed in place after the forward fails the backward only where the
    other operand's gradient reads it: x @ w with a frozen x and w updated in place (an optimizer step inside the
    backward, a weight shared by two steps) gives torch's gradient of w (it reads x alone); the operator saved
    both operands and raised."""
    g = _gen(seed)
    call = (lambda a, b: fusedops.matmul(a, b)) if route == "eager" else (lambda a, b: OPS.matmul(a, b, None, None,
                                                                                                  None))
    for trained in (0, 1):
        a, b = (torch.randn(s, dtype=D, generator=g).requires_grad_(j == trained) for j, s in enumerate(shapes))
        operands = (a, b)
        y = call(a, b)
        dy = torch.randn(y.shape, dtype=D, generator=g)
        want = torch.autograd.grad(torch.matmul(a, b), operands[trained], dy)[0]
        with torch.no_grad():
            operands[trained].mul_(3.0)       # its own gradient does not read it
        got = torch.autograd.grad(y, operands[trained], dy)[0]
        assert got.shape == want.shape
        assert_close(got, want, D)
        y = call(a, b)
        with torch.no_grad():
            operands[1 - trained].add_(1.0)   # the frozen partner: read by the trained one's gradient
        with pytest.raises(RuntimeError, match=INPLACE_ERROR):
            torch.autograd.grad(y, operands[trained], dy)


# -- the autograd contract, eager Functions and custom operators -----------------------------------------

@pytest.mark.parametrize("name", list(CASES))
def test_saved_tensor_hooks_and_inplace_version_checks(seed, name):
    """saved_tensors_hooks see every saved tensor (a pack that copies, an unpack that copies: the same
    gradients); a changed input or output fails the backward with torch's error exactly where the backward
    reads it; under allow_mutation_on_saved_tensors the gradients are those of the unchanged values."""
    f, _, shapes = CASES[name]
    inputs = _inputs(seed, shapes)
    dy_shape = CASES[name][1](inputs).shape
    dy = torch.randn(dy_shape, dtype=D, generator=_gen(seed + 1))
    want = _reference_grads(name, inputs, dy)
    packed = []

    def pack(t):
        packed.append(t)
        return t.clone()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t.clone()):
        y = f(inputs)
    assert packed
    _assert_grads(_grads(y, inputs, dy), want)
    for changed in range(len(inputs) + 1):      # each input, then the output
        fresh = [t.detach().clone().requires_grad_() for t in inputs]
        y = f(fresh)
        with torch.no_grad():
            (y if changed == len(inputs) else fresh[changed]).mul_(1.5)
        if changed == len(inputs):
            reads = name in SAVES_OUTPUT
        else:       # softmax saves its output alone; the norms and the eager matmul never read the bias (the
            # operator recomputes the pre-activation from a, b and the bias)
            reads = "softmax" not in name and not (name in ("layer_norm", "op_layer_norm", "matmul") and changed == 2)
        if reads:
            with pytest.raises(RuntimeError, match=INPLACE_ERROR):
                torch.autograd.grad(y, fresh, dy)
        else:
            torch.autograd.grad(y, fresh, dy)
        with torch.autograd.graph.allow_mutation_on_saved_tensors():
            fresh = [t.detach().clone().requires_grad_() for t in inputs]
            y = f(fresh)
            with torch.no_grad():
                (y if changed == len(inputs) else fresh[changed]).mul_(1.5)
            _assert_grads(_grads(y, fresh, dy), want)


@pytest.mark.parametrize("name", list(CASES))
def test_retain_graph_hooks_frozen_inputs_and_freed_memory(seed, name):
    f, _, shapes = CASES[name]
    inputs = _inputs(seed, shapes)
    y = f(inputs)
    dy = torch.randn(y.shape, dtype=D, generator=_gen(seed + 1))
    first = torch.autograd.grad(y, inputs, dy, retain_graph=True)
    second = torch.autograd.grad(y, inputs, dy)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    _assert_grads(list(first), _reference_grads(name, inputs, dy))
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        torch.autograd.grad(y, inputs, dy)

    # hooks on the inputs, the output, and a multi-grad hook see the gradients
    seen = {}
    y = f(inputs)
    y.register_hook(lambda g: seen.__setitem__("out", g.clone()))
    for j, t in enumerate(inputs):
        t.register_hook(lambda g, j=j: seen.__setitem__(j, g.clone()))
    handle = torch.autograd.graph.register_multi_grad_hook(inputs, lambda gs: seen.__setitem__("all", gs))
    y.backward(dy)
    handle.remove()
    assert torch.equal(seen["out"], dy)
    for j, t in enumerate(inputs):
        assert torch.equal(seen[j], t.grad) and torch.equal(seen["all"][j], t.grad)
        assert torch.equal(t.grad, first[j])
        t.grad = None

    # a frozen input (e.g. a frozen weight) gets no gradient, the others torch's
    if len(inputs) > 1:
        for frozen in range(len(inputs)):
            part = [t.detach().clone().requires_grad_(j != frozen) for j, t in enumerate(inputs)]
            y = f(part)
            y.backward(dy)
            assert part[frozen].grad is None
            _assert_grads([t.grad for t in part], _reference_grads(name, part, dy))

    # intermediates: freed by the backward while the output lives on, and with the output
    mids = [t * 1 for t in inputs]
    refs = [weakref.ref(t) for t in mids]
    y = f(mids)
    del mids
    y.backward(dy)
    assert all(r() is None for r in refs)      # (no gc.collect: no reference cycle either)
    keep = weakref.ref(y)
    del y
    assert keep() is None


def test_training_loop_keeps_live_tensors_constant(seed):
    """Forward + backward steps of every op (eager and operator) leave no tensor behind."""
    calls = [(CASES[name][0], _inputs(seed, CASES[name][2])) for name in CASES]

    def steps(count):
        for _ in range(count):
            for f, inputs in calls:
                f(inputs).sum().backward()

    def live():
        gc.collect()
        with warnings.catch_warnings():     # (isinstance on some deprecated module attributes warns)
            warnings.simplefilter("ignore")
            return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))

    steps(2)
    before = live()
    steps(3)
    # (<=: the count is the whole process's; a test run before this one in the same worker may still free
    # tensors of its own, e.g. a bounded cache's evictions, as the CI run of session 40 saw: 12372 -> 12338)
    assert live() <= before


@pytest.mark.parametrize("name", ["softmax", "rms_norm", "matmul", "attention", "op_layer_norm", "op_matmul"])
def test_detect_anomaly_names_the_fusedops_node(seed, name):
    f, _, shapes = CASES[name]
    inputs = _inputs(seed, shapes)
    with pytest.warns(UserWarning), torch.autograd.detect_anomaly():
        y = f(inputs)
        node = type(y.grad_fn).__name__
        assert "Function" in node or "fusedops" in node, node
        with pytest.raises(RuntimeError, match=f"Function '{node}' returned nan values"):
            y.backward(torch.full_like(y, math.nan))


# -- dtypes and shapes of the gradients ---------------------------------------------------------------

@pytest.mark.parametrize("route", ["eager", "op"])
def test_mixed_dtype_gradients_have_the_inputs_dtypes(seed, route):
    """bfloat16 inputs with float32 parameters: every gradient has its input's dtype and torch's value."""
    g = _gen(seed)
    bf, f32 = torch.bfloat16, torch.float32
    x = torch.randn(3, 8, generator=g).to(bf).requires_grad_()
    w, b = torch.randn(8, generator=g).requires_grad_(), torch.randn(8, generator=g).requires_grad_()
    mat, bias = torch.randn(8, 4, generator=g).to(bf).requires_grad_(), torch.randn(4, generator=g).requires_grad_()
    eager = route == "eager"
    outs = [fusedops.rms_norm(x, (8,), w, eps=1e-6) if eager else OPS.rms_norm(x, [8], w, 1e-6)[0],
            fusedops.layer_norm(x, (8,), w, b) if eager else OPS.layer_norm(x, [8], w, b, 1e-5)[0],
            fusedops.matmul(x, mat, bias, activation="relu") if eager else OPS.matmul(x, mat, bias, "relu", None)]
    sm = fusedops.softmax(x, -1, dtype=f32) if eager else OPS.softmax(x, -1, f32)
    loss = sum(o.float().square().sum() for o in outs) + (sm * torch.arange(8.0)).sum()
    leaves = [x, w, b, mat, bias]
    got = torch.autograd.grad(loss, leaves)
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    rx, rw, rb, rmat, rbias = ref_leaves
    ref_outs = [F.rms_norm(rx, (8,), rw, eps=1e-6), F.layer_norm(rx, (8,), rw, rb), F.relu(rx @ rmat + rbias)]
    ref_loss = sum(o.square().sum() for o in ref_outs) + (torch.softmax(rx, -1) * torch.arange(8.0)).sum()
    want = torch.autograd.grad(ref_loss, ref_leaves)
    for leaf, grad, ref in zip(leaves, got, want):
        assert grad.dtype == leaf.dtype and grad.shape == leaf.shape
        assert_close(grad.float(), ref, torch.bfloat16)     # (inputs and outputs rounded to bfloat16)


@pytest.mark.parametrize("route", ["eager", "op"])
def test_expanded_leaves_get_gradients_of_their_own_shape(seed, route):
    """Stride-0 expanded tensors that are themselves leaves (a broadcast weight shared by a batch): the gradient
    has the expanded shape and torch's values (not summed into the base, not written through stride 0)."""
    g = _gen(seed)
    leaf = lambda base, *shape: base.expand(*shape).requires_grad_()  # noqa: E731
    x = leaf(torch.randn(1, 8, dtype=D, generator=g), 4, 8)
    a = torch.randn(3, 5, 8, dtype=D, generator=g).requires_grad_()
    b = leaf(torch.randn(8, 4, dtype=D, generator=g), 3, 8, 4)
    q = leaf(torch.randn(1, 2, 4, 8, dtype=D, generator=g), 3, 2, 4, 8)
    k = torch.randn(3, 2, 4, 8, dtype=D, generator=g).requires_grad_()
    v = leaf(torch.randn(1, 1, 4, 8, dtype=D, generator=g), 3, 2, 4, 8)
    if route == "eager":
        outs = [fusedops.layer_norm(x, (8,)), fusedops.softmax(x, 0), fusedops.matmul(a, b),
                fusedops.scaled_dot_product_attention(q, k, v)]
    else:
        outs = [OPS.layer_norm(x, [8], None, None, 1e-5)[0], OPS.softmax(x, 0, None),
                OPS.matmul(a, b, None, None, None), OPS.scaled_dot_product_attention(q, k, v, None, False, None,
                                                                                     False)[0]]
    leaves = [x, a, b, q, k, v]
    weights = [torch.randn(o.shape, dtype=D, generator=g) for o in outs]
    got = torch.autograd.grad(sum((o * w).sum() for o, w in zip(outs, weights)), leaves)
    refs = [t.detach().clone().requires_grad_() for t in leaves]
    rx, ra, rb, rq, rk, rv = refs
    ref_outs = [F.layer_norm(rx, (8,)), torch.softmax(rx, 0), ra @ rb, _sdpa_ref(rq, rk, rv)]
    want = torch.autograd.grad(sum((o * w).sum() for o, w in zip(ref_outs, weights)), refs)
    for leaf_, grad, ref in zip(leaves, got, want):
        assert grad.shape == leaf_.shape
        assert_close(grad, ref, D)
