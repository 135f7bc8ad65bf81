"""Review (session 24, the changes of 579fe78..1c08e28): a fresh reviewer tried to break them on the CPU.

- passes/dot_accumulation.py (`c + dot(a, b, 0)` -> `dot(a, b, c)`): int8 dots into int32, float16 dots
  added to float32 / float16 tiles, tf32, float64, a scalar literal, a runtime scalar, a bias row / column
  broadcast, a transposed c, c loaded after the dot, the add in an `if` of a dot outside it (left alone), both
  in an `if`, the dot read in a nested region (left alone), `d + d` (left alone), dot(a, b) + dot(b, a), chains
  `acc += dot + dot` in for / while loops, the loop carry as c, a dot of a dot, `where` and reductions of the
  result: the IR after the whole sm_80 / sm_90a pipeline interprets as the frontend's IR, compiles and
  assembles, and no dot moves into another block. Nothing wrong found.
- autograd/matmul.py (an operand saved only for the other's gradient): save_on_cpu, saved_tensors_hooks (also
  relaying out the saved tensors), checkpoint (reentrant or not), retain_graph + a second backward, jacobian
  (vectorize=True), torch.func grad / vmap / jacrev, views, expanded and 1-D operands, out_dtype, gelu: all
  match torch.matmul in float64. DEFECT: a double backward that used to raise is now silently zero.
- reshape(x, ()) of one-element blocks (int8 / uint8 / int32 / int64 / bool / float16 / bfloat16 / float32 /
  float64, NaN, -0.0, extremes) in stores, arithmetic, where, reductions: interpreter, host-JIT of the sm_90a
  code and ptxas agree.
- int literals rounded once into float dtypes: float16 65519 / 65520 / -65520, bfloat16, 2**53 + 2**29 + 1
  in float32, in the interpreter and in the PTX constants. DEFECT: an int literal of 2**1024 or more.
- bench scripts' argparse types, the IR dump folder per kernel, the LaunchError of a tensor-less launch.
  DEFECT: --out that can never be a directory passes the check.

Defects (fixed in the same session; the tests assert the correct behaviour):
1. fusedops.matmul(x, w, activation="gelu") with w frozen (or x constant and w trained): the second derivative
   through torch.autograd.grad(g, x, allow_unused=True) is None and torch.autograd.functional.hessian is all
   zeros; before 579fe78 it raised the "differentiate twice" error (once_differentiable ties its error node to
   the saved tensors that require grad, and the operand needing a gradient is no longer saved).
2. The same with only the bias requiring a gradient (pre-existing: the bias was never saved).
3. dsl.full(shape, 2**1024, dsl.float32) / x + 2**1030: a raw OverflowError from float(), where 2**1023 gives
   inf (float16 / bfloat16 / float32) and float64's overflow is inf too.
4. scripts.output_dir("") and output_dir("<a file>/sub") (and `python -m fusedops.bench --out <file>/sub`)
   pass the check; write_rows' os.makedirs then fails after the whole GPU run.
Fixes: 1-2: MatmulFunction saves an empty anchor tensor (autograd/matmul.py `_error_anchor`) for each input
needing a gradient that it does not save, so the error node reaches it; 3: such literals are +-inf; 4:
output_dir walks up to the nearest existing parent.
"""

from __future__ import annotations

import argparse
import copy

import pytest
import torch

import fusedops
import fusedops.dsl as dsl
from codegen_helpers import interpret_ir, pipelined_ir
from fusedops.dsl.ir import OpCode
from fusedops.dsl.passes.dot_accumulation import combine_dot_accumulation
from fusedops.dsl.target import assemble, ptxas_available
from kernel_source import jit_from_source

needs_ptxas = pytest.mark.skipif(not ptxas_available(), reason="ptxas is not on the PATH")


def _kernel(source: str, tag: str, name: str = "k"):
    return jit_from_source(source, f"<review24x {tag}>", name)


# ================================================================================================
# Holds: dot accumulation, through the sm_80 / sm_90a pipelines, interprets like the frontend IR
# ================================================================================================
_DOT_HEAD = '''
def k(o_ptr, a_ptr, b_ptr, c_ptr, flag, K, B: dsl.constexpr, DT: dsl.constexpr):
    r = dsl.arange(0, B)
    ij = r[:, None] * B + r[None, :]
    a = dsl.load(a_ptr + ij)
    b = dsl.load(b_ptr + ij)
'''
_DOT_TAIL = "\n    dsl.store(o_ptr + ij, out)\n"
# name -> (body, whether the pass rewrites an add)
_DOT_BODIES = {
    "c_plus_dot": ("c = dsl.load(c_ptr + ij)\n    out = c + dsl.dot(a, b)", True),
    "plus_literal": ("out = dsl.dot(a, b) + 3", True),
    "plus_runtime_scalar": ("out = dsl.dot(a, b) + flag", True),
    "bias_row": ("bias = dsl.load(c_ptr + r)\n    out = dsl.dot(a, b) + bias[None, :]", True),
    "bias_column": ("bias = dsl.load(c_ptr + r)\n    out = bias[:, None] + dsl.dot(a, b)", True),
    "transposed_c": ("out = dsl.dot(a, b) + dsl.trans(dsl.load(c_ptr + ij))", True),
    "c_loaded_after_dot": ("d = dsl.dot(a, b)\n    c = dsl.load(c_ptr + ij)\n    out = d + c", True),
    "add_in_if_dot_outside": ("d = dsl.dot(a, b)\n    out = dsl.load(c_ptr + ij)\n    if flag > 0:\n"
                              "        out = out + d", False),
    "both_in_if": ("out = dsl.load(c_ptr + ij)\n    if flag > 0:\n        out = out + dsl.dot(a, b)", True),
    "dot_read_in_nested_region": ("d = dsl.dot(a, b)\n    out = d + dsl.load(c_ptr + ij)\n    if flag > 0:\n"
                                  "        out = out * d", False),
    "dot_plus_itself": ("d = dsl.dot(a, b)\n    out = d + d", False),
    "two_dots": ("out = dsl.dot(a, b) + dsl.dot(b, a)", True),
    "chain_in_loop": ("out = dsl.load(c_ptr + ij)\n    for i in range(0, K):\n"
                      "        out += dsl.dot(a, b) + dsl.dot(b, a)", True),
    "loop_carry_as_c": ("out = dsl.load(c_ptr + ij)\n    for i in range(0, K):\n        out = dsl.dot(a, b) + out", True),
    "dot_outside_loop": ("d = dsl.dot(a, b)\n    out = dsl.load(c_ptr + ij)\n    for i in range(0, K):\n"
                         "        out = out + d", False),
    "while_loop": ("out = dsl.load(c_ptr + ij)\n    i = 0\n    while i < K:\n        out += dsl.dot(a, b)\n"
                   "        i += 1", True),
    "where_of_sum": ("out = dsl.where(r[:, None] > r[None, :], dsl.dot(a, b) + dsl.load(c_ptr + ij), 0)", True),
    "reduced": ("s = dsl.sum(dsl.dot(a, b) + dsl.load(c_ptr + ij), axis=1)\n"
                "    out = s[:, None] + dsl.zeros((B, B), DT)", True),
    "explicit_zero_acc": ("out = dsl.dot(a, b, dsl.zeros((B, B), DT)) + dsl.load(c_ptr + ij)", True),
    "dot_of_dot": ("d = dsl.dot(a, b)\n    out = dsl.dot(d.to(a.dtype), b) + d", True),
}
_DOT_KERNELS = {name: _kernel(_DOT_HEAD + "    " + body + _DOT_TAIL, "dot_" + name)
                for name, (body, _) in _DOT_BODIES.items()}
_DOT_DTYPES = {"fp16": (torch.float16, torch.float32, dsl.float32, None),
               "int8": (torch.int8, torch.int32, dsl.int32, None),
               "tf32": (torch.float32, torch.float32, dsl.float32, "tf32"),
               "fp64": (torch.float64, torch.float64, dsl.float64, None)}


def _dot_operands(in_dtype, acc_dtype, block=16):
    gen = torch.Generator().manual_seed(24)
    if in_dtype == torch.int8:
        a, b = (torch.randint(-128, 128, (block * block,), generator=gen, dtype=torch.int8) for _ in range(2))
        c = torch.randint(-2 ** 31, 2 ** 31 - 1, (block * block,), generator=gen, dtype=torch.int32)
        return a, b, c
    a, b = (torch.randn(block * block, generator=gen).to(in_dtype) for _ in range(2))
    return a, b, torch.randn(block * block, generator=gen).to(acc_dtype)


def _check_dot_case(name, dtype_name, archs=("sm_80", "sm_90a")):
    in_dtype, acc_dtype, dsl_acc, precision = _DOT_DTYPES[dtype_name]
    kernel = _DOT_KERNELS[name]
    if precision is not None:       # the same kernel with input_precision="tf32"
        body = _DOT_BODIES[name][0].replace("dsl.dot(a, b)", "dsl.dot(a, b, input_precision='tf32')")
        kernel = _kernel(_DOT_HEAD + "    " + body + _DOT_TAIL, f"dot_{name}_tf32")
    a, b, c = _dot_operands(in_dtype, acc_dtype)
    kw = dict(B=16, DT=dsl_acc)
    function = copy.deepcopy(kernel.ir(torch.empty(256, dtype=acc_dtype), a, b, c, 1, 3, **kw))
    dots_before = {id(op): op.parent for op in function.walk() if op.opcode == OpCode.DOT}
    assert combine_dot_accumulation(function) is _DOT_BODIES[name][1]
    for op in function.walk():      # no dot changes block: a rewritten add stays where it was
        if id(op) in dots_before:
            assert op.parent is dots_before[id(op)]
    for flag in (0, 1):
        expected = torch.full((256,), -7, dtype=acc_dtype)
        kernel[(1,)](expected, a, b, c, flag, 3, **kw, interpret=True)
        for arch in archs:
            out = torch.full((256,), -5, dtype=acc_dtype)
            args = (out, a, b, c, flag, 3)
            pipelined, _ = pipelined_ir(kernel, args, kw, 4, arch=arch, num_stages=3)
            interpret_ir(kernel, pipelined, (1,), args, kw)
            if acc_dtype == torch.int32:
                assert torch.equal(out, expected), (name, arch, flag)
            else:
                torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5, msg=f"{name} {arch} {flag}")
    return kernel, kw


@pytest.mark.parametrize("name", list(_DOT_BODIES))
def test_dot_accumulation_cases_interpret_like_the_frontend_fp16(name):
    _check_dot_case(name, "fp16")


@pytest.mark.parametrize("name", ["c_plus_dot", "plus_literal", "bias_row", "chain_in_loop", "while_loop",
                                  "two_dots", "add_in_if_dot_outside"])
@pytest.mark.parametrize("dtype_name", ["int8", "tf32", "fp64"])
def test_dot_accumulation_cases_interpret_like_the_frontend_other_dtypes(name, dtype_name):
    _check_dot_case(name, dtype_name, archs=("sm_80",) if dtype_name == "fp64" else ("sm_80", "sm_90a"))


@needs_ptxas
@pytest.mark.parametrize("name", ["c_plus_dot", "bias_row", "bias_column", "plus_runtime_scalar", "chain_in_loop",
                                  "c_loaded_after_dot", "both_in_if", "dot_of_dot", "while_loop"])
@pytest.mark.parametrize("dtype_name", ["fp16", "int8"])
def test_dot_accumulation_cases_compile_and_assemble(name, dtype_name):
    in_dtype, acc_dtype, dsl_acc, _ = _DOT_DTYPES[dtype_name]
    kernel = _DOT_KERNELS[name]
    x, acc = torch.empty(16, dtype=in_dtype), torch.empty(16, dtype=acc_dtype)
    for arch in ("sm_80", "sm_90a"):
        compiled = kernel.compile(acc, x, x, acc, 1, 3, target=arch, num_warps=4, num_stages=3, B=16, DT=dsl_acc)
        result = assemble(compiled.asm["ptx"], arch)
        assert result.spill_bytes == 0, result.log


def test_dot_outside_a_loop_is_not_moved_into_it():
    a, b, c = _dot_operands(torch.float16, torch.float32)
    out = torch.empty(256)
    args = (out, a, b, c, 1, 3)
    function, _ = pipelined_ir(_DOT_KERNELS["dot_outside_loop"], args, dict(B=16, DT=dsl.float32), 4, arch="sm_90a",
                               num_stages=3)
    [loop] = [op for op in function.walk() if op.opcode == OpCode.FOR]
    assert not [op for op in loop.regions[0].walk() if op.opcode in (OpCode.DOT,)]


# ================================================================================================
# DEFECT 1 / 2: a second derivative through fusedops.matmul with an activation is silently zero
# ================================================================================================
def _operands_for_double_backward():
    gen = torch.Generator().manual_seed(7)
    return torch.randn(3, 6, generator=gen), torch.randn(6, 5, generator=gen), torch.randn(5, generator=gen)


def _second_derivative(matmul, which, tensors):
    leaves = [t.clone() for t in tensors]
    index = {"a": 0, "b": 1, "bias": 2}[which]
    leaves[index].requires_grad_()
    y = matmul(*leaves)
    (g,) = torch.autograd.grad(y.sum(), leaves[index], create_graph=True)
    return torch.autograd.grad((g * g).sum(), leaves[index], allow_unused=True)[0]


def _raises_or_matches(which):
    tensors = _operands_for_double_backward()
    expected = _second_derivative(lambda a, b, bias: torch.nn.functional.gelu(a @ b + bias), which,
                                  [t.double() for t in tensors])
    assert expected is not None and expected.abs().sum() > 0
    try:
        got = _second_derivative(lambda a, b, bias: fusedops.matmul(a, b, bias, activation="gelu"), which, tensors)
    except RuntimeError as error:
        assert "differentiate twice" in str(error)
        return
    assert got is not None, "second derivative silently None (zero)"
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("which", ["a", "b"])
def test_matmul_gelu_second_derivative_of_the_trained_operand_raises_or_is_right(interpret, which):
    _raises_or_matches(which)


def test_matmul_gelu_second_derivative_of_the_bias_raises_or_is_right(interpret):
    _raises_or_matches("bias")


def test_matmul_gelu_hessian_with_frozen_weight_raises_or_is_right(interpret):
    x, w, _ = _operands_for_double_backward()
    expected = torch.autograd.functional.hessian(lambda x: torch.nn.functional.gelu(x @ w.double()).sum(), x.double())
    try:
        got = torch.autograd.functional.hessian(lambda x: fusedops.matmul(x, w, activation="gelu").sum(), x)
    except RuntimeError as error:
        assert "differentiate twice" in str(error)
        return
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("needs", [(True, True), (True, False), (False, True)])
def test_matmul_double_backward_through_backward_call_still_raises(interpret, needs):
    x, w, _ = _operands_for_double_backward()
    x, w = x.requires_grad_(needs[0]), w.requires_grad_(needs[1])
    y = fusedops.matmul(x, w, activation="gelu")
    y.sum().backward(create_graph=True)
    grads = [t.grad for t in (x, w) if t.requires_grad]
    with pytest.raises(RuntimeError, match="differentiate twice"):
        sum((g * g).sum() for g in grads).backward()


# ================================================================================================
# Holds: MatmulFunction's saved operands under hooks, checkpointing, second backwards and transforms
# ================================================================================================
_NEEDS = [(True, True, False), (True, False, False), (False, True, False), (False, False, True), (True, False, True)]


def _plain(mm, a, b, bias, act):
    return mm(a, b, bias, act)


def _save_on_cpu(mm, a, b, bias, act):
    with torch.autograd.graph.save_on_cpu():
        return mm(a, b, bias, act)


def _relayout_hooks(mm, a, b, bias, act):    # saved tensors come back column-major copies
    pack = lambda t: t.t().contiguous().t() if t.dim() == 2 else t.clone()  # noqa: E731
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        return mm(a, b, bias, act)


def _checkpointed(reentrant):
    def run(mm, a, b, bias, act):
        from torch.utils.checkpoint import checkpoint
        return checkpoint(lambda a, b, bias: mm(a, b, bias, act) * 2, a * 1, b * 1, bias * 1, use_reentrant=reentrant)
    return run


def _views(mm, a, b, bias, act):
    return mm(a[::2], b.t().contiguous().t()[:, 1:], bias[1:], act)


def _expanded(mm, a, b, bias, act):
    return mm(a.expand(3, *a.shape), b, bias, act)


_WRAPPERS = {"plain": _plain, "save_on_cpu": _save_on_cpu, "relayout_hooks": _relayout_hooks,
             "checkpoint_reentrant": _checkpointed(True), "checkpoint": _checkpointed(False), "views": _views,
             "expanded": _expanded}


def _fused(a, b, bias, act):
    return fusedops.matmul(a, b, bias, activation=act)


def _reference(a, b, bias, act):
    z = torch.matmul(a, b) + bias
    return torch.nn.functional.gelu(z) if act == "gelu" else z


def _gradients(mm, wrapper, needs, act, a_shape, b_shape, dtype, twice=False):
    gen = torch.Generator().manual_seed(11)
    n = b_shape[-1] if len(b_shape) > 1 else 1
    leaves = [torch.randn(*shape, generator=gen).to(dtype).requires_grad_(need)
              for shape, need in zip((a_shape, b_shape, (n,)), needs)]
    y = _WRAPPERS[wrapper](mm, *leaves, act)
    weights = torch.linspace(-1, 1, y.numel(), dtype=torch.float64).view(y.shape)
    loss = (y.double() * weights).sum()
    loss.backward(retain_graph=twice)
    if twice:
        loss.backward()
    return y, [t.grad for t in leaves]


@pytest.mark.parametrize("wrapper", list(_WRAPPERS))
@pytest.mark.parametrize("needs", _NEEDS)
@pytest.mark.parametrize("act", [None, "gelu"])
def test_matmul_gradients_under_hooks_and_checkpoints_match_torch(interpret, wrapper, needs, act):
    y, got = _gradients(_fused, wrapper, needs, act, (8, 16), (16, 8), torch.float32)
    y_ref, expected = _gradients(_reference, wrapper, needs, act, (8, 16), (16, 8), torch.float64)
    torch.testing.assert_close(y.double(), y_ref, rtol=1e-4, atol=1e-4)
    for g, e in zip(got, expected):
        assert (g is None) == (e is None)
        if g is not None:
            torch.testing.assert_close(g.double(), e, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shapes", [((16,), (16, 8)), ((8, 16), (16,)), ((16,), (16,)), ((16,), (3, 16, 8)),
                                    ((2, 8, 16), (16, 8))])
@pytest.mark.parametrize("needs", _NEEDS)
def test_matmul_gradients_of_1d_and_batched_operands_retain_graph_twice(interpret, shapes, needs):
    y, got = _gradients(_fused, "plain", needs, "gelu", *shapes, torch.float32, twice=True)
    y_ref, expected = _gradients(_reference, "plain", needs, "gelu", *shapes, torch.float64, twice=True)
    torch.testing.assert_close(y.double(), y_ref, rtol=1e-4, atol=1e-4)
    for g, e in zip(got, expected):
        assert (g is None) == (e is None)
        if g is not None:
            torch.testing.assert_close(g.double(), e, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype, out_dtype", [(torch.float16, torch.float32), (torch.bfloat16, torch.float32),
                                              (torch.float32, torch.float64)])
@pytest.mark.parametrize("needs", _NEEDS)
def test_matmul_out_dtype_gradients_with_one_operand_saved(interpret, dtype, out_dtype, needs):
    gen = torch.Generator().manual_seed(3)
    base = [torch.randn(*s, generator=gen).to(dtype) for s in ((8, 16), (16, 8), (8,))]
    grads = []
    for fused in (True, False):
        leaves = [t.clone().requires_grad_(n) for t, n in zip(base, needs)]
        if fused:
            with torch.autograd.graph.save_on_cpu():
                y = fusedops.matmul(*leaves, activation="gelu", out_dtype=out_dtype)
            assert y.dtype == out_dtype
        else:
            y = torch.nn.functional.gelu(leaves[0].double() @ leaves[1].double() + leaves[2].double())
        (y.double() * torch.linspace(-1, 1, 64, dtype=torch.float64).view(8, 8)).sum().backward()
        grads.append([t.grad for t in leaves])
    for g, e in zip(*grads):
        assert (g is None) == (e is None)
        if g is not None:
            torch.testing.assert_close(g.double(), e.double(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("act", [None, "gelu"])
def test_matmul_jacobians_and_torch_func_match_torch(interpret, act):
    gen = torch.Generator().manual_seed(5)
    a, b, bias = (torch.randn(*s, generator=gen, dtype=torch.float64) for s in ((4, 6), (6, 5), (5,)))
    fused = lambda a, b, bias: fusedops.matmul(a, b, bias, activation=act)  # noqa: E731
    ref = lambda a, b, bias: _reference(a, b, bias, act)  # noqa: E731
    for index in range(3):
        def only(mm, index=index):
            def f(x):
                args = [a, b, bias]
                args[index] = x
                return mm(*args)
            return f
        got = torch.autograd.functional.jacobian(only(fused), [a, b, bias][index], vectorize=True)
        expected = torch.autograd.functional.jacobian(only(ref), [a, b, bias][index], vectorize=True)
        torch.testing.assert_close(got, expected)
    torch.testing.assert_close(torch.func.grad(lambda x: fused(x, b, bias).sum())(a),
                               torch.func.grad(lambda x: ref(x, b, bias).sum())(a))
    torch.testing.assert_close(torch.func.jacrev(lambda w: fused(a, w, bias))(b),
                               torch.func.jacrev(lambda w: ref(a, w, bias))(b))
    batch = a.unsqueeze(1).expand(4, 3, 6)
    torch.testing.assert_close(torch.func.vmap(lambda x: fused(x, b, bias))(batch),
                               torch.func.vmap(lambda x: ref(x, b, bias))(batch))


def test_matmul_gelu_input_changed_in_place_with_frozen_weight(interpret):
    gen = torch.Generator().manual_seed(9)
    x0, w = torch.randn(4, 6, generator=gen), torch.randn(6, 5, generator=gen)
    grads = []
    for mm, dtype in ((fusedops.matmul, torch.float32), (None, torch.float64)):
        leaf = x0.to(dtype).detach().clone().requires_grad_()
        h = leaf * 2
        y = (fusedops.matmul(h, w, activation="gelu") if mm else torch.nn.functional.gelu(h @ w.double()))
        with torch.no_grad():
            h.mul_(3)       # h is not needed: dH = dZ @ W^T reads W and Z alone
        y.sum().backward()
        grads.append(leaf.grad)
    torch.testing.assert_close(grads[0].double(), grads[1], rtol=1e-4, atol=1e-4)


# ================================================================================================
# Holds: reshape(x, ()) of a one-element block gives its element
# ================================================================================================
_RESHAPE = _kernel('''
def k(o_ptr, x_ptr, y_ptr, SHAPE: dsl.constexpr):
    v = dsl.load(x_ptr + dsl.zeros(SHAPE, dsl.int32))
    s = dsl.reshape(v, ())
    dsl.store(o_ptr, s)
    dsl.store(o_ptr + 1, s + s)
    dsl.store(o_ptr + 2, dsl.where(s == s, s, dsl.load(y_ptr)))
    dsl.store(o_ptr + 3 + dsl.arange(0, 2), dsl.full((2,), 0, o_ptr.dtype.element_ty) + s)
    dsl.store(o_ptr + 5, dsl.max(dsl.reshape(s, (1,)), axis=0))
''', "reshape")

_RESHAPE_VALUES = [(torch.float32, [1.5, float("nan"), -0.0, float("inf"), -float("inf")]),
                   (torch.float16, [float("nan"), -0.0, 65504.0]), (torch.bfloat16, [float("nan"), -0.0]),
                   (torch.float64, [float("nan"), -0.0]), (torch.int32, [-5, 2 ** 31 - 1, -2 ** 31]),
                   (torch.int8, [-128, 127]), (torch.uint8, [255, 0]), (torch.int64, [-2 ** 63, 2 ** 62]),
                   (torch.bool, [True, False])]


def _reshape_expected(x: torch.Tensor, y: torch.Tensor, dtype) -> torch.Tensor:
    s = x[0]
    twice = s | s if dtype == torch.bool else (s + s).to(dtype)
    plus_zero = (torch.zeros((), dtype=dtype) + s).to(dtype)
    return torch.stack([s, twice, torch.where(s == s, s, y[0]), plus_zero, plus_zero, s])


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype.is_floating_point:
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    return torch.equal(a, b)


@pytest.mark.parametrize("dtype, values", _RESHAPE_VALUES, ids=[str(d).replace("torch.", "") for d, _ in _RESHAPE_VALUES])
def test_reshape_one_element_block_to_scalar_in_the_interpreter(dtype, values):
    for value in values:
        for shape in [(1,), (1, 1), (1, 1, 1)]:
            x, y = torch.tensor([value], dtype=dtype), torch.zeros(1, dtype=dtype)
            out = torch.zeros(6, dtype=dtype)
            _RESHAPE[(1,)](out, x, y, SHAPE=shape, interpret=True)
            assert _bits_equal(out, _reshape_expected(x, y, dtype)), (value, shape, out)


@needs_ptxas
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.int8, torch.bool, torch.int64])
def test_reshape_one_element_block_to_scalar_compiles(dtype):
    t = torch.empty(8, dtype=dtype)
    for arch in ("sm_80", "sm_90a"):
        compiled = _RESHAPE.compile(t, t, t, target=arch, SHAPE=(1, 1))
        assemble(compiled.asm["ptx"], arch)


_RESHAPE_HOST = _kernel('''
def k(o_ptr, x_ptr, SHAPE: dsl.constexpr):
    s = dsl.reshape(dsl.load(x_ptr + dsl.zeros(SHAPE, dsl.int32)), ())
    dsl.store(o_ptr, s)
    dsl.store(o_ptr + 1, s * 2)
''', "reshape_host")


@pytest.mark.parametrize("dtype, value", [(torch.float32, float("nan")), (torch.float32, -0.0), (torch.int32, -2 ** 31),
                                          (torch.int64, -2 ** 63), (torch.uint8, 255), (torch.int8, -128),
                                          (torch.float64, float("nan"))])
def test_reshape_one_element_block_to_scalar_on_the_host_matches_the_interpreter(dtype, value):
    pytest.importorskip("llvmlite")
    from host_jit import run_on_host

    x = torch.tensor([value], dtype=dtype)
    interpreted, compiled = torch.zeros(2, dtype=dtype), torch.ones(2, dtype=dtype)
    _RESHAPE_HOST[(1,)](interpreted, x, SHAPE=(1, 1), interpret=True)
    run_on_host(_RESHAPE_HOST, compiled, x, SHAPE=(1, 1), num_warps=1)
    assert _bits_equal(compiled, interpreted), (compiled, interpreted)


def test_reshape_pointer_block_to_scalar_is_a_compilation_error():
    kernel = _kernel("def k(o_ptr):\n    p = dsl.reshape(o_ptr + dsl.zeros((1,), dsl.int32), ())\n"
                     "    dsl.store(p, 1.0)\n", "reshape_ptr")
    with pytest.raises(dsl.CompilationError, match="pointers"):
        kernel[(1,)](torch.zeros(1), interpret=True)


# ================================================================================================
# Holds: int literals rounded once into float dtypes; DEFECT 3: literals of 2**1024 and more
# ================================================================================================
def _full_kernel(value, dtype_name, tag):
    return _kernel(f"def k(o_ptr):\n    dsl.store(o_ptr + dsl.arange(0, 4), dsl.full((4,), {value}, dsl.{dtype_name}))\n"
                   f"    dsl.store(o_ptr + 4, dsl.full((), {value}, dsl.{dtype_name}))\n", f"full_{tag}")


_LITERALS = [  # (value, dtype name, torch dtype, expected float, PTX immediate of the block store)
    (65519, "float16", torch.float16, 65504.0, "31743"),
    (65520, "float16", torch.float16, float("inf"), "31744"),
    (-65520, "float16", torch.float16, -float("inf"), "-1024"),
    (2 ** 128, "float32", torch.float32, float("inf"), "2139095040"),
    (2 ** 200, "bfloat16", torch.bfloat16, float("inf"), "32640"),
    (2 ** 53 + 2 ** 29 + 1, "float32", torch.float32, float(2 ** 53 + 2 ** 30), "1509949441"),
    (-(2 ** 53 + 2 ** 29 + 1), "float32", torch.float32, -float(2 ** 53 + 2 ** 30), None),
    (2 ** 64 + 2 ** 40 + 1, "float32", torch.float32, float(2 ** 64 + 2 ** 41), None),
    (2 ** 1023, "float16", torch.float16, float("inf"), None),
]


@pytest.mark.parametrize("index", range(len(_LITERALS)))
def test_int_literal_rounded_once_into_a_float_dtype(index):
    value, name, dtype, expected, immediate = _LITERALS[index]
    kernel = _full_kernel(value, name, f"ok{index}")
    out = torch.zeros(5, dtype=dtype)
    kernel[(1,)](out, interpret=True)
    assert out.double().tolist() == [expected] * 5
    if immediate is not None and ptxas_available():
        for arch in ("sm_80", "sm_90a"):
            ptx = kernel.compile(torch.empty(8, dtype=dtype), target=arch).asm["ptx"]
            assert f", {immediate};" in ptx
            assemble(ptx, arch)


@pytest.mark.parametrize("expr", ["dsl.full((4,), 2 ** 1024, dsl.DT)", "dsl.load(x_ptr + dsl.arange(0, 4)) + 2 ** 1030",
                                  "dsl.full((4,), -(2 ** 1030), dsl.DT)"])
@pytest.mark.parametrize("dtype_name", ["float16", "float32"])
def test_int_literal_beyond_float64_range_is_inf_or_a_compilation_error(expr, dtype_name):
    dtype = getattr(torch, dtype_name)
    kernel = _kernel(f"def k(o_ptr, x_ptr):\n    dsl.store(o_ptr + dsl.arange(0, 4), "
                     f"{expr.replace('DT', dtype_name)})\n", f"huge_{dtype_name}_{sum(map(ord, expr))}")
    out = torch.zeros(4, dtype=dtype)
    try:
        kernel[(1,)](out, torch.ones(4, dtype=dtype), interpret=True)
    except dsl.CompilationError:
        return
    assert torch.isinf(out).all()


# ================================================================================================
# Bench CLI types; DEFECT 4: an --out that can never be a directory
# ================================================================================================
def test_bench_list_types_accept_and_reject():
    from fusedops.bench import scripts

    assert scripts.int_list(" 1024, 2048") == [1024, 2048]
    assert scripts.shape_list("1x2x3, 4x5x6") == [(1, 2, 3), (4, 5, 6)]
    assert scripts.choice_list(["fp16", "bf16"])("bf16,") == ["bf16"]
    for bad in ["", "0", "-1", "+5", "1,,2", "1.5", "1e3", "²"]:
        with pytest.raises((argparse.ArgumentTypeError, ValueError)):
            scripts.int_list(bad)
    for bad in ["1x2", "1x2x0", "1x2x3x4", "1X2X3", "1x2x3,", "ax2x3"]:
        with pytest.raises(argparse.ArgumentTypeError):
            scripts.shape_list(bad)
    for bad in ["", ",", "fp32", "fp16,fp32"]:
        with pytest.raises(argparse.ArgumentTypeError):
            scripts.choice_list(["fp16", "bf16"])(bad)


def test_bench_output_dir_of_an_existing_file_is_a_usage_error(tmp_path):
    from fusedops.bench import scripts
    from fusedops.bench.__main__ import parse_args

    existing = tmp_path / "results.csv"
    existing.write_text("")
    with pytest.raises(argparse.ArgumentTypeError):
        scripts.output_dir(str(existing))
    assert scripts.output_dir(str(tmp_path / "new")) == str(tmp_path / "new")
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--out", str(existing)])
    assert exit_info.value.code == 2


@pytest.mark.parametrize("kind", ["empty", "under_a_file"])
def test_bench_output_dir_that_cannot_be_created_is_a_usage_error(tmp_path, kind):
    from fusedops.bench import scripts
    from fusedops.bench.__main__ import parse_args

    existing = tmp_path / "results.csv"
    existing.write_text("")
    text = "" if kind == "empty" else str(existing / "sub")
    with pytest.raises(argparse.ArgumentTypeError):
        scripts.output_dir(text)
    with pytest.raises(SystemExit):
        parse_args(["--out", text])


# ================================================================================================
# Holds: IR dumps in a folder per kernel; a tensor-less compiled launch without CUDA is a LaunchError
# ================================================================================================
def test_ir_dumps_go_to_a_folder_per_kernel_and_a_file_as_dump_dir_is_named(tmp_path, monkeypatch):
    first = _kernel("def first_kernel(o_ptr, n):\n    dsl.store(o_ptr, n)\n", "dump1", "first_kernel")
    second = _kernel("def second_kernel(o_ptr, n):\n    dsl.store(o_ptr + 1, n)\n", "dump2", "second_kernel")
    monkeypatch.setenv("FUSEDOPS_DUMP_IR", "1")
    monkeypatch.setenv("FUSEDOPS_DUMP_DIR", str(tmp_path / "dumps"))
    for kernel in (first, second):
        kernel.compile(torch.empty(4), 3, target="sm_80")
    folders = sorted(p.name for p in (tmp_path / "dumps").iterdir())
    assert folders == ["first_kernel", "second_kernel"]
    assert (tmp_path / "dumps" / "first_kernel" / "00_combine_dot_accumulation.before.ir").exists()
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("FUSEDOPS_DUMP_DIR", str(blocker))
    third = _kernel("def third_kernel(o_ptr, n):\n    dsl.store(o_ptr + 2, n)\n", "dump3", "third_kernel")
    with pytest.raises(OSError, match="FUSEDOPS_DUMP_DIR"):
        third.compile(torch.empty(4), 3, target="sm_80")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the launch without CUDA")
@pytest.mark.parametrize("grid", [(1,), (0,)])
def test_tensorless_compiled_launch_without_cuda_is_a_launch_error(monkeypatch, grid):
    monkeypatch.delenv("FUSEDOPS_INTERPRET", raising=False)
    kernel = _kernel("def k(n, B: dsl.constexpr):\n    x = n + B\n", "tensorless")
    with pytest.raises(dsl.LaunchError, match="CUDA"):
        kernel[grid](3, B=2)
    assert issubclass(dsl.LaunchError, dsl.FusedOpsError) and "BackendError" in dsl.__all__
