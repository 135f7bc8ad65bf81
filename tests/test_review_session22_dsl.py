"""Review (session 22, the DSL): a fresh reviewer played a demanding Triton user on the CPU: negative reduction
axes, loop-carried tuples and re-bound induction variables, `is not None and load(...)` short-circuits,
dots of transposed / non-square / chained operands, literal and `dsl.full` conversions into every integer
type (interpreted and compiled on the host), 64-bit `range` loops, aliased views in the interpreter,
scalar compiled expressions fuzzed against the interpreter (550 random programs, no mismatch), and the
size limit of blocks.

Defects (fixed in session 22; each test asserts the correct behaviour):
- The 2**20-element block limit (`shape_ops._MAX_BLOCK_NUMEL`, checked by `_check_shape` for
  full / zeros / broadcast_to) is not applied to the blocks that `dsl.arange`, `dsl.dot` and a tensor
  descriptor's `load` create. A dot of (2048, 16) x (16, 1024) passes the frontend and the interpreter,
  and compiling it for sm_90a ran out of memory (the process was killed at ~23 GB; a 1024 x 1024 result
  already takes 51 s and 6 GB). `dsl.arange(0, 2**21)` is accepted, and the error, when a later
  elementwise op broadcasts it, names `broadcast_to`, which the user never wrote, on another line.
- `x_ptr + 1.0` (a float offset) gets the hint "a torch.Tensor argument, a 0-d one included, is a
  pointer to its data", which is about another mistake (semantics.py `_pointer_binary` adds it whenever
  one operand is a pointer and the other is not).
The other tests pin tricky behaviour that held.
"""

from __future__ import annotations

import pytest
import torch

import fusedops.dsl as dsl
from fusedops.dsl.target import assemble, ptxas_available
from host_jit import run_on_host
from kernel_source import jit_from_source


def _assemble(compiled, arch):
    if ptxas_available():
        assemble(compiled.asm["ptx"], arch)


def _kernel(source: str, tag: str, namespace=None):
    return jit_from_source(source, f"<review22 {tag}>", namespace=namespace)


# ================================================================================================
# Defect (fixed): blocks past 2**20 elements made by arange, dot and descriptor loads were not refused
# ================================================================================================
@dsl.jit
def _big_arange(o_ptr, B: dsl.constexpr):
    x = dsl.arange(0, B)
    dsl.store(o_ptr, dsl.sum(x, axis=0))


@dsl.jit
def _big_dot(o_ptr, a_ptr, b_ptr, M: dsl.constexpr, N: dsl.constexpr, K: dsl.constexpr):
    a = dsl.load(a_ptr + dsl.arange(0, M)[:, None] * K + dsl.arange(0, K)[None, :])
    b = dsl.load(b_ptr + dsl.arange(0, K)[:, None] * N + dsl.arange(0, N)[None, :])
    dsl.store(o_ptr, dsl.sum(dsl.sum(dsl.dot(a, b), axis=1), axis=0))


@dsl.jit
def _big_box(o_ptr, x_ptr, M, N, BM: dsl.constexpr, BN: dsl.constexpr):
    desc = dsl.make_tensor_descriptor(x_ptr, (M, N), (N, 1), (BM, BN))
    dsl.store(o_ptr, dsl.sum(dsl.sum(desc.load((0, 0)), axis=1), axis=0))


def _launch_big(which):
    if which == "arange":
        _big_arange[(1,)](torch.zeros(1, dtype=torch.int32), B=2**21, interpret=True)
    elif which == "dot":
        # the interpreter is quick here; kernel.compile(..., target="sm_90a") of the same call is what
        # ran out of memory, so the test only interprets it
        _big_dot[(1,)](torch.zeros(1), torch.zeros(2048, 16).half(), torch.zeros(16, 1024).half(),
                       M=2048, N=1024, K=16, interpret=True)
    else:
        _big_box[(1,)](torch.zeros(1), torch.ones(4, 4), 4, 4, BM=2048, BN=1024, interpret=True)


@pytest.mark.parametrize("which", ["arange", "dot", "descriptor_load"])
def test_blocks_past_the_element_limit_are_refused_where_they_are_made(which):
    with pytest.raises(dsl.CompilationError, match="at most 1048576") as info:
        _launch_big(which)
    assert "broadcast_to" not in str(info.value)


def test_the_element_limit_itself_and_blocks_at_it():
    # full / zeros / broadcast_to refuse 2**21 elements with a located error; 2**20 is fine
    kernel = _kernel("def k(o_ptr, B: dsl.constexpr):\n    dsl.store(o_ptr, dsl.sum(dsl.zeros((B,), dsl.int32) + 1, axis=0))\n",
                     "limit")
    out = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(dsl.CompilationError, match=r"<review22 limit>:2:.*at most 1048576"):
        kernel[(1,)](out, B=2**21, interpret=True)
    kernel[(1,)](out, B=2**20, interpret=True)
    assert out.item() == 2**20
    _big_arange[(1,)](out, B=2**16, interpret=True)
    assert out.item() == (2**16 - 1) * 2**15


# ================================================================================================
# Defect (fixed, message): a float pointer offset got the hint meant for a 0-d tensor passed as a scalar
# ================================================================================================
def test_float_pointer_offset_error_does_not_blame_a_tensor_argument():
    kernel = _kernel("def k(o_ptr, x_ptr):\n    dsl.store(o_ptr, dsl.load(x_ptr + 1.0))\n", "float_offset")
    with pytest.raises(dsl.CompilationError, match="<review22 float_offset>:2:") as info:
        kernel[(1,)](torch.zeros(1), torch.ones(2), interpret=True)
    message = str(info.value)
    assert "integer" in message and "torch.Tensor" not in message


# ================================================================================================
# Passing: negative axes, reverse cumsum, Python semantics of loops, short-circuits on None
# ================================================================================================
@dsl.jit
def _negative_axis(o_ptr, x_ptr, OP: dsl.constexpr):
    r = dsl.arange(0, 4)[:, None]
    c = dsl.arange(0, 8)[None, :]
    x = dsl.load(x_ptr + r * 8 + c)
    if OP == "sum":
        dsl.store(o_ptr + dsl.arange(0, 4), dsl.sum(x, axis=-1))
    elif OP == "max":
        dsl.store(o_ptr + dsl.arange(0, 4), dsl.max(x, axis=-1))
    elif OP == "argmax":
        dsl.store(o_ptr + dsl.arange(0, 4), dsl.argmax(x, axis=-1).to(dsl.float64))
    elif OP == "cumsum":
        dsl.store(o_ptr + r * 8 + c, dsl.cumsum(x, axis=-1))
    else:
        dsl.store(o_ptr + r * 8 + c, dsl.cumsum(x, axis=-2, reverse=True))


@pytest.mark.parametrize("op", ["sum", "max", "argmax", "cumsum", "cumsum_reverse"])
def test_negative_axes_and_reverse_cumsum(op):
    torch.manual_seed(22)
    x = torch.randn(4, 8, dtype=torch.float64)
    x[2, 5] = x[2, 1]      # a tie for argmax when x[2, 1] is the row's maximum
    out = torch.full((32,), float("nan"), dtype=torch.float64)
    _negative_axis[(1,)](out, x, OP=op, interpret=True)
    expected = {"sum": lambda: x.sum(-1), "max": lambda: x.amax(-1), "argmax": lambda: x.argmax(-1).double(),
                "cumsum": lambda: x.cumsum(-1).flatten(),
                "cumsum_reverse": lambda: x.flip(0).cumsum(0).flip(0).flatten()}[op]()
    torch.testing.assert_close(out[:expected.numel()], expected, rtol=1e-12, atol=1e-12)


@dsl.jit
def _python_loops(o_ptr, n):
    acc = 0
    for i in range(n):
        i = i + 5            # re-binding the induction variable does not change the iteration
        acc += i
    a = 1
    b = 2
    for _ in range(n):
        a, b = b, a + b      # a tuple assignment reads every right-hand side first
    dsl.store(o_ptr, acc)
    dsl.store(o_ptr + 1, a)
    dsl.store(o_ptr + 2, b)


def test_rebound_induction_variable_and_tuple_swap_follow_python():
    def reference(n):
        acc = sum(i + 5 for i in range(n))
        a, b = 1, 2
        for _ in range(n):
            a, b = b, a + b
        return [acc, a, b]

    for n in (0, 1, 6):
        out, host = torch.zeros(3, dtype=torch.int32), torch.zeros(3, dtype=torch.int32)
        _python_loops[(1,)](out, n, interpret=True)
        run_on_host(_python_loops, host, n)
        assert out.tolist() == host.tolist() == reference(n)


@dsl.jit
def _optional_pointer(o_ptr, b_ptr, n, FLAG: dsl.constexpr):
    i = dsl.arange(0, 8)
    y = i * 0
    if b_ptr is not None and dsl.load(b_ptr) > 0:
        y += 1
    if b_ptr is None or dsl.load(b_ptr) > 5:
        y += 10
    if n > 0 and FLAG:
        y += 100
    y += dsl.load(b_ptr) * 1000 if b_ptr is not None else 5000
    dsl.store(o_ptr + i, y)


@pytest.mark.parametrize("b,flag,expected", [(None, False, 5010), (None, True, 5110), (1, False, 1001),
                                             (7, True, 7111), (-2, True, -1900)])
def test_constexpr_none_short_circuits_before_the_load(b, flag, expected):
    out = torch.full((8,), -1, dtype=torch.int32)
    b_tensor = None if b is None else torch.tensor([b], dtype=torch.int32)
    _optional_pointer[(1,)](out, b_tensor, 3, FLAG=flag, interpret=True)
    assert out.tolist() == [expected] * 8
    _assemble(_optional_pointer.compile(out, b_tensor, 3, target="sm_90a", FLAG=flag), "sm_90a")


# ================================================================================================
# Passing: dot of transposed, non-square and chained operands (interpreted exactly; compiled)
# ================================================================================================
@dsl.jit
def _dot_forms(o_ptr, a_ptr, b_ptr, M: dsl.constexpr, N: dsl.constexpr, K: dsl.constexpr, MODE: dsl.constexpr):
    rm = dsl.arange(0, M)
    rn = dsl.arange(0, N)
    rk = dsl.arange(0, K)
    a = dsl.load(a_ptr + rm[:, None] * K + rk[None, :])          # M x K
    bt = dsl.load(b_ptr + rn[:, None] * K + rk[None, :])         # N x K: B stored transposed
    if MODE == "bt":
        dsl.store(o_ptr + rm[:, None] * N + rn[None, :], dsl.dot(a, dsl.trans(bt)))
    elif MODE == "double_trans":
        dsl.store(o_ptr + rm[:, None] * N + rn[None, :], dsl.dot(dsl.trans(dsl.trans(a)), bt.trans()) + 1.0)
    else:   # P = A B^T rounded to fp16, then P B: M x K
        p = dsl.dot(a, dsl.trans(bt)).to(dsl.float16)
        dsl.store(o_ptr + rm[:, None] * K + rk[None, :], dsl.dot(p, bt))


@pytest.mark.parametrize("mode", ["bt", "double_trans", "chain"])
@pytest.mark.parametrize("m,n,k", [(16, 32, 16), (32, 16, 64)])
def test_dot_of_transposed_and_chained_operands(mode, m, n, k):
    torch.manual_seed(m + n + k)
    # small integers: every product and sum is exact in fp16/fp32, so the comparison is exact
    a = torch.randint(-3, 4, (m, k)).half()
    b = torch.randint(-3, 4, (n, k)).half()
    out = torch.full((m, k if mode == "chain" else n), float("nan"))
    _dot_forms[(1,)](out, a, b, M=m, N=n, K=k, MODE=mode, interpret=True)
    s = a.double() @ b.double().T
    expected = {"bt": s, "double_trans": s + 1, "chain": s @ b.double()}[mode]
    assert torch.equal(out.double(), expected)
    if (m, n, k) == (16, 32, 16):
        for arch in ("sm_80", "sm_90a"):
            _assemble(_dot_forms.compile(out, a, b, target=arch, num_warps=4, M=m, N=n, K=k, MODE=mode), arch)


# ================================================================================================
# Passing: literal / dsl.full conversions and narrow-type arithmetic, interpreted and compiled on the host
# ================================================================================================
_CONVERSIONS = [
    ("dsl.full((4,), 300, dsl.int8)", 44), ("dsl.full((4,), -1, dsl.uint8)", 255),
    ("dsl.full((4,), 1e10, dsl.int32)", 2**31 - 1), ("dsl.full((4,), -1e10, dsl.uint32)", 0),
    ("dsl.full((4,), n, dsl.int8)", 44), ("dsl.full((4,), 0.25, dsl.int1)", 1),
    ("dsl.full((4,), f, dsl.int32)", 2), ("dsl.full((4,), 2**63, dsl.uint64)", 2.0**63),
    ("dsl.full((4,), 255.9, dsl.uint8)", 255), ("dsl.full((4,), 2**31, dsl.int32)", -2**31),
    ("(dsl.zeros((4,), dsl.uint8) - 1) // 2", 127), ("dsl.full((4,), 200, dsl.uint8) * 2", 144),
    ("dsl.full((4,), 100, dsl.int8) + 100", -56), ("dsl.full((4,), 100, dsl.int8) + 200", 300),
    ("(dsl.full((4,), 1, dsl.uint32) - 2) // 2", 2**31 - 1), ("dsl.full((4,), 1, dsl.uint32) < -1", 1),
    ("dsl.full((4,), 5, dsl.uint8) < -1", 0), ("dsl.full((4,), 5, dsl.uint64) > 2**63", 0),
    ("-dsl.full((4,), 5, dsl.uint8)", 251), ("dsl.full((4,), -7, dsl.int8) >> 1", -4),
    ("dsl.full((4,), 2**24 + 1, dsl.int32).to(dsl.float32)", float(2**24)),
    ("dsl.full((4,), 1e30, dsl.float32).to(dsl.uint64)", 2.0**64 - 1),
    ("dsl.full((4,), float('nan'), dsl.float32).to(dsl.int1)", 1),
    ("dsl.full((4,), -0.0, dsl.float32).to(dsl.int1)", 0),
]


@pytest.mark.parametrize("index", range(len(_CONVERSIONS)))
def test_full_and_literal_conversions_interpreted_and_compiled_alike(index):
    expression, expected = _CONVERSIONS[index]
    kernel = _kernel(f"def k(o_ptr, n, f):\n    v = {expression}\n"
                     "    dsl.store(o_ptr, dsl.sum(v.to(dsl.float64), axis=0) / 4)\n", f"conv{index}")
    interpreted, host = torch.zeros(1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)
    kernel[(1,)](interpreted, 300, 2.5, interpret=True)
    assert interpreted.item() == expected
    try:
        run_on_host(kernel, host, 300, 2.5)
    except AssertionError:       # conversions that need NVVM intrinsics cannot run on the host
        return
    assert host.item() == expected


@dsl.jit
def _wide_range(o_ptr, lo, hi, step):
    acc = 0
    count = 0
    for i in range(lo, hi, step):
        acc += i
        count += 1
    dsl.store(o_ptr, acc)
    dsl.store(o_ptr + 1, count)


@pytest.mark.parametrize("lo,hi,step", [(2**40, 2**40 + 3, 1), (0, 2**31 + 2, 2**30), (2**31 - 3, 2**31 + 3, 2),
                                        (5, -2**40, -2**39), (2**62, 2**63 - 1, 2**61)], ids=str)
def test_range_loops_with_64_bit_bounds(lo, hi, step):
    values = list(range(lo, hi, step))
    expected = [(sum(values) + 2**63) % 2**64 - 2**63, len(values)]
    interpreted, host = torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64)
    _wide_range[(1,)](interpreted, lo, hi, step, interpret=True)
    run_on_host(_wide_range, host, lo, hi, step)
    assert interpreted.tolist() == host.tolist() == expected


# ================================================================================================
# Passing: the interpreter reads every load of a block before a store, also through aliased views
# ================================================================================================
@dsl.jit
def _double(o_ptr, x_ptr, n, B: dsl.constexpr):
    i = dsl.arange(0, B)
    v = dsl.load(x_ptr + i, mask=i < n)
    dsl.store(o_ptr + i, v * 2, mask=i < n)


def test_aliased_views_in_the_interpreter():
    x = torch.arange(10.0)
    _double[(1,)](x[2:], x[1:], 8, B=8, interpret=True)       # overlapping, shifted by one element
    assert x.tolist() == [0.0, 1.0] + [2.0 * v for v in range(1, 9)]
    y = torch.arange(12.0).reshape(3, 4)
    _double[(1,)](y[1:, 1], y[0, :], 3, B=4, interpret=True)     # a strided view's storage, pointer arithmetic
    assert y[1, 1].item() == 0.0 and y[1, 2].item() == 2.0 and y[1, 3].item() == 4.0


# ================================================================================================
# Fixed (noticed by the review): a bad Config is refused where it is made; interpret given as text
# ================================================================================================
@pytest.mark.parametrize("num_warps, num_stages", [(3, 2), (0, 2), (64, 2), (True, 2), (4.0, 2), (4, 0), (4, 1.5)])
def test_config_refuses_bad_warps_and_stages_where_it_is_made(num_warps, num_stages):
    with pytest.raises(ValueError, match="num_warps" if num_stages == 2 else "num_stages"):
        dsl.Config({"BLOCK": 16}, num_warps=num_warps, num_stages=num_stages)


def test_interpret_given_as_text_is_refused():
    kernel = _kernel("def k(o_ptr):\n    dsl.store(o_ptr, 1.0)\n", "interpret_text")
    out = torch.zeros(1)
    with pytest.raises(dsl.LaunchError, match="interpret"):
        kernel[(1,)](out, interpret="no")
    kernel[(1,)](out, interpret=True)
    assert out.item() == 1.0
