"""The NumPy interpreter of the block IR, on IR built by hand (the frontend comes later)."""

import numpy as np
import pytest
import torch
from helpers import assert_close, poison, random_tensor

from fusedops.dsl.errors import InterpreterError, LaunchError
from fusedops.dsl.interpreter import Interpreter, launch
from fusedops.dsl.interpreter.context import RULES
from fusedops.dsl.ir import Block, Builder, Function, Location, OpCode, verify
from fusedops.dsl.ir.ops import COMPARISON
from fusedops.dsl.language import dtypes as dt
from fusedops.dsl.language.dtypes import BlockType, pointer_type, shape_of, with_element, with_shape

F32, F16, BF16, I32 = dt.float32, dt.float16, dt.bfloat16, dt.int32
TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class KernelIR:
    """A test-only shorthand over `Builder`: `k = KernelIR("name", x_ptr=ptr(F32), n=I32)`, `k["n"]`.

    Binary ops splat a scalar operand to the other's block shape; types follow the operands.
    """

    def __init__(self, name, **params):
        body = Block(list(params.values()), list(params))
        self.function = Function(name, body, list(params))
        self.builder = Builder(body)
        self.args = dict(zip(params, body.args))

    def __getitem__(self, name):
        return self.args[name]

    def op(self, code, operands, type_, **attrs):
        return self.builder.value(code, operands, type_, **attrs)

    def const(self, value, dtype, shape=()):
        return self.op(OpCode.CONSTANT, [], with_shape(dtype, shape), value=value)

    def pid(self, axis=0):
        return self.op(OpCode.PROGRAM_ID, [], I32, axis=axis)

    def arange(self, n):
        return self.op(OpCode.ARANGE, [], BlockType((n,), I32), start=0, end=n)

    def splat(self, x, shape):
        if shape_of(x.type) == tuple(shape):
            return x
        if shape_of(x.type):
            return self.op(OpCode.BROADCAST, [x], BlockType(tuple(shape), x.type.element))
        return self.op(OpCode.SPLAT, [x], BlockType(tuple(shape), x.type))

    def _match(self, *values):
        shape = max((shape_of(v.type) for v in values), key=len)
        return [self.splat(v, shape) for v in values]

    def bin(self, code, a, b):
        a, b = self._match(a, b)
        type_ = with_element(a.type, dt.int1) if code in COMPARISON else a.type
        return self.op(code, [a, b], type_)

    def expand(self, x, axis):
        shape = list(shape_of(x.type))
        shape.insert(axis, 1)
        return self.op(OpCode.EXPAND_DIMS, [x], with_shape(x.type.element, shape), axis=axis)

    def cast(self, x, dtype):
        return self.op(OpCode.CAST, [x], with_element(x.type, dtype))

    def addptr(self, pointer, offset):
        pointer, offset = self._match(pointer, offset)
        return self.op(OpCode.ADDPTR, [pointer, offset], pointer.type)

    def load(self, pointer, mask=None, other=None):
        operands = [pointer] + [v for v in (mask, other) if v is not None]
        element = pointer.type.scalar.element
        return self.op(OpCode.LOAD, operands, with_element(pointer.type, element),
                       masked=mask is not None, has_other=other is not None)

    def store(self, pointer, value, mask=None):
        operands = [pointer, value] + ([mask] if mask is not None else [])
        self.builder.create(OpCode.STORE, operands, [], {"masked": mask is not None})

    def reduce(self, x, kind, axis, code=OpCode.REDUCE):
        shape = list(shape_of(x.type))
        del shape[axis]
        element = I32 if code == OpCode.ARGREDUCE else x.type.element
        return self.op(code, [x], with_shape(element, shape), kind=kind, axis=axis)

    def region(self, arg_types, body):
        """A region whose ops come from `body(*args) -> yielded values` (CONDITION if `body` returns
        ("condition", cond, values))."""
        block = Block(arg_types)
        with self.builder.insert_into(block):
            out = body(*block.args)
            if isinstance(out, tuple) and out and out[0] == "condition":
                self.builder.create(OpCode.CONDITION, [out[1]] + list(out[2]))
            else:
                self.builder.create(OpCode.YIELD, list(out))
        return block

    def for_(self, lower, upper, step, initial, body):
        region = self.region([lower.type] + [v.type for v in initial], body)
        return self.builder.create(OpCode.FOR, [lower, upper, step] + list(initial),
                                   [v.type for v in initial], regions=[region]).results

    def while_(self, initial, before, after):
        types = [v.type for v in initial]
        regions = [self.region(types, before), self.region(types, after)]
        return self.builder.create(OpCode.WHILE, list(initial), types, regions=regions).results

    def if_(self, condition, then, otherwise, result_types):
        regions = [self.region([], then), self.region([], otherwise)]
        return self.builder.create(OpCode.IF, [condition], result_types, regions=regions).results

    def done(self):
        verify(self.function)
        return self.function


def ptr(dtype):
    return pointer_type(dtype)


def _block_offsets(k, block):
    """pid * block + arange(block) and its mask against k['n']."""
    offsets = k.bin(OpCode.ADD, k.bin(OpCode.MUL, k.pid(), k.const(block, I32)), k.arange(block))
    return offsets, k.bin(OpCode.LT, offsets, k["n"])


def _vector_add_kernel(dtype, block):
    k = KernelIR("add_kernel", x_ptr=ptr(dtype), y_ptr=ptr(dtype), out_ptr=ptr(dtype), n=I32)
    offsets, mask = _block_offsets(k, block)
    x = k.load(k.addptr(k["x_ptr"], offsets), mask)
    y = k.load(k.addptr(k["y_ptr"], offsets), mask)
    k.store(k.addptr(k["out_ptr"], offsets), k.bin(OpCode.ADD, x, y), mask)
    return k.done()


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=str)
@pytest.mark.parametrize("n", [1, 1000, 1024])
def test_vector_add_with_masked_tail(dtype, n, seed):
    block = 128
    x_t = random_tensor((n,), TORCH[dtype.name], seed=seed)
    y_t = random_tensor((n,), TORCH[dtype.name], seed=seed + 1)
    out = poison(torch.empty(n, dtype=TORCH[dtype.name]))
    launch(_vector_add_kernel(dtype, block), ((n + block - 1) // block,), [x_t, y_t, out, n])
    reference = x_t.double() + y_t.double()
    # one rounding of the exact sum: equal to the float64 reference rounded to the type
    torch.testing.assert_close(out, reference.to(out.dtype), rtol=0, atol=0)


@pytest.mark.cuda
def test_cuda_tensors_are_copied_to_the_cpu_and_back(seed):
    n, block = 1000, 128
    x_t = random_tensor((n,), torch.float32, "cuda", seed)
    y_t = random_tensor((n,), torch.float32, "cpu", seed + 1)       # devices may be mixed
    storage = poison(torch.empty(n + 5, device="cuda"))
    out = storage[5:]                                                 # a view at a storage offset
    launch(_vector_add_kernel(F32, block), ((n + block - 1) // block,), [x_t, y_t, out, n])
    assert out.device.type == "cuda" and torch.isnan(storage[:5]).all()
    torch.testing.assert_close(out.cpu(), x_t.cpu() + y_t, rtol=0, atol=0)
    with pytest.raises(InterpreterError, match="out-of-bounds load"):
        launch(_vector_add_kernel(F32, block), (8,), [x_t[:10].clone(), y_t, out, n])   # own storage


def test_row_reductions_sum_max_argmax(seed):
    m, n, block = 5, 37, 64
    k = KernelIR("rows", x_ptr=ptr(F32), sum_ptr=ptr(F32), max_ptr=ptr(F32), arg_ptr=ptr(I32),
                 stride=I32, n=I32)
    row = k.pid()
    cols = k.arange(block)
    mask = k.bin(OpCode.LT, cols, k["n"])
    pointers = k.addptr(k.addptr(k["x_ptr"], k.bin(OpCode.MUL, row, k["stride"])), cols)
    x = k.load(pointers, mask, k.const(float("-inf"), F32, (block,)))
    zeros = k.const(0.0, F32, (block,))
    k.store(k.addptr(k["sum_ptr"], row), k.reduce(k.op(OpCode.WHERE, [mask, x, zeros], x.type), "sum", 0))
    k.store(k.addptr(k["max_ptr"], row), k.reduce(x, "max", 0))
    k.store(k.addptr(k["arg_ptr"], row), k.reduce(x, "argmax", 0, OpCode.ARGREDUCE))
    gen = torch.Generator().manual_seed(seed)
    x_t = torch.randint(-4, 5, (m, n + 3), generator=gen).float()[:, :n]   # ties, row stride n + 3
    sums, maxes = poison(torch.empty(m)), poison(torch.empty(m))
    args = poison(torch.empty(m, dtype=torch.int32))
    launch(k.done(), (m,), [x_t, sums, maxes, args, x_t.stride(0), n])
    assert_close(sums, x_t.double().sum(1), torch.float32)
    assert torch.equal(maxes, x_t.amax(1))
    assert torch.equal(args, x_t.argmax(1).int())


def test_for_loop_carries_a_block_accumulator(seed):
    n, block = 300, 32
    k = KernelIR("chunked_sum", x_ptr=ptr(F32), out_ptr=ptr(F32), n=I32)
    cols = k.arange(block)

    def body(start, acc):
        offsets = k.bin(OpCode.ADD, cols, start)
        mask = k.bin(OpCode.LT, offsets, k["n"])
        return [k.bin(OpCode.ADD, acc, k.load(k.addptr(k["x_ptr"], offsets), mask))]

    (acc,) = k.for_(k.const(0, I32), k["n"], k.const(block, I32), [k.const(0.0, F32, (block,))], body)
    k.store(k["out_ptr"], k.reduce(acc, "sum", 0))
    x_t = random_tensor((n,), torch.float32, seed=seed)
    out = poison(torch.empty(1))
    launch(k.done(), (1,), [x_t, out, n])
    assert_close(out, x_t.double().sum().reshape(1), torch.float32)


def test_if_selects_a_branch_per_program():
    k = KernelIR("parity", out_ptr=ptr(I32))
    pid = k.pid()
    even = k.bin(OpCode.EQ, k.bin(OpCode.MOD, pid, k.const(2, I32)), k.const(0, I32))
    (value,) = k.if_(even, lambda: [k.bin(OpCode.MUL, pid, k.const(10, I32))],
                     lambda: [k.bin(OpCode.SUB, k.const(0, I32), pid)], [I32])
    k.store(k.addptr(k["out_ptr"], pid), value)
    out = torch.zeros(7, dtype=torch.int32)
    launch(k.done(), (7,), [out])
    assert out.tolist() == [0, -1, 20, -3, 40, -5, 60]


def test_while_loop_counts_doublings():
    k = KernelIR("doublings", out_ptr=ptr(I32))
    target = k.bin(OpCode.ADD, k.pid(), k.const(1, I32))

    def before(value, count):
        return ("condition", k.bin(OpCode.LT, value, target), [value, count])

    def after(value, count):
        return [k.bin(OpCode.MUL, value, k.const(2, I32)), k.bin(OpCode.ADD, count, k.const(1, I32))]

    _, count = k.while_([k.const(1, I32), k.const(0, I32)], before, after)
    k.store(k.addptr(k["out_ptr"], k.pid()), count)
    out = torch.full((20,), -1, dtype=torch.int32)
    launch(k.done(), (20,), [out])
    assert out.tolist() == [int(np.ceil(np.log2(p + 1))) for p in range(20)]


def _tile_offsets(k, rows, cols, row_stride):
    """rows x cols offsets i * row_stride + j (a 2-D block built with expand_dims + broadcast)."""
    i = k.expand(k.bin(OpCode.MUL, k.arange(rows), k.const(row_stride, I32)), 1)
    j = k.expand(k.arange(cols), 0)
    shape = (rows, cols)
    return k.bin(OpCode.ADD, k.splat(i, shape), k.splat(j, shape))


@pytest.mark.parametrize("dtype, acc_dtype", [(F16, F32), (BF16, F32), (F32, F32), (dt.int8, I32)], ids=str)
def test_dot_of_16x16_blocks(dtype, acc_dtype, seed):
    k = KernelIR("matmul16", a_ptr=ptr(dtype), b_ptr=ptr(dtype), c_ptr=ptr(acc_dtype))
    offsets = _tile_offsets(k, 16, 16, 16)
    a = k.load(k.addptr(k["a_ptr"], offsets))
    b = k.load(k.addptr(k["b_ptr"], offsets))
    acc = k.const(1, acc_dtype, (16, 16))
    c = k.op(OpCode.DOT, [a, b, acc], acc.type, input_precision="ieee")
    k.store(k.addptr(k["c_ptr"], offsets), c)
    torch_dtype = dt.to_torch(dtype)
    a_t, b_t = random_tensor((16, 16), torch_dtype, seed=seed), random_tensor((16, 16), torch_dtype, seed=seed + 1)
    c_t = poison(torch.empty(16, 16, dtype=dt.to_torch(acc_dtype)))
    launch(k.done(), (1,), [a_t, b_t, c_t])
    reference = a_t.double() @ b_t.double() + 1
    if dtype == dt.int8:
        assert torch.equal(c_t, reference.int())
    else:
        assert_close(c_t, reference, torch.float32)   # products of 16-bit values are exact in fp32


def test_atomic_add_histogram_with_colliding_addresses(seed):
    bins, block, n = 8, 64, 200
    k = KernelIR("histogram", x_ptr=ptr(I32), hist_ptr=ptr(I32), old_ptr=ptr(I32), n=I32)
    offsets, mask = _block_offsets(k, block)
    values = k.load(k.addptr(k["x_ptr"], offsets), mask)
    old = k.builder.create(OpCode.ATOMIC_RMW, [k.addptr(k["hist_ptr"], values), k.const(1, I32, (block,)), mask],
                           [values.type], {"kind": "add", "masked": True, "sem": "relaxed", "scope": "gpu"}).result
    k.store(k.addptr(k["old_ptr"], offsets), old, mask)
    x_t = torch.randint(0, bins, (n,), generator=torch.Generator().manual_seed(seed), dtype=torch.int32)
    hist, olds = torch.zeros(bins, dtype=torch.int32), torch.full((n,), -1, dtype=torch.int32)
    launch(k.done(), ((n + block - 1) // block,), [x_t, hist, olds, n])
    assert torch.equal(hist, torch.bincount(x_t, minlength=bins).int())
    for b in range(bins):   # programs and lanes run in order: each lane saw the count before it
        assert olds[x_t == b].tolist() == list(range(int((x_t == b).sum())))


@pytest.mark.parametrize("reverse", [False, True])
def test_cumsum_scan(reverse, seed):
    k = KernelIR("cumsum", x_ptr=ptr(F32), out_ptr=ptr(F32))
    cols = k.arange(64)
    x = k.load(k.addptr(k["x_ptr"], cols))
    scanned = k.op(OpCode.SCAN, [x], x.type, kind="sum", axis=0, reverse=reverse)
    k.store(k.addptr(k["out_ptr"], cols), scanned)
    x_t = random_tensor((64,), torch.float32, seed=seed)
    out = poison(torch.empty(64))
    launch(k.done(), (1,), [x_t, out])
    reference = x_t.double().flip(0).cumsum(0).flip(0) if reverse else x_t.double().cumsum(0)
    assert_close(out, reference, torch.float32)


LOAD_LOCATION = Location("kernels/demo.py", 42, 8, "copy_kernel", "    x = dsl.load(x_ptr + offsets)")


def _copy_kernel(masked):
    k = KernelIR("copy_kernel", x_ptr=ptr(F32), out_ptr=ptr(F32), n=I32)
    offsets, mask = _block_offsets(k, 16)
    k.builder.loc = LOAD_LOCATION
    x = k.load(k.addptr(k["x_ptr"], offsets), mask if masked else None)
    k.builder.loc = Location("kernels/demo.py", 43, 4, "copy_kernel", "    dsl.store(...)")
    k.store(k.addptr(k["out_ptr"], offsets), x, mask if masked else None)
    return k.done()


def test_unmasked_out_of_bounds_load_raises_with_location_and_program_id():
    x_t, out = torch.randn(20), torch.zeros(32)
    with pytest.raises(InterpreterError) as caught:
        launch(_copy_kernel(masked=False), (2,), [x_t, out, 20])
    message = str(caught.value)
    assert "kernels/demo.py:42" in message
    assert "program_id=(1, 0, 0)" in message
    assert "copy_kernel" in message and "dsl.load(x_ptr + offsets)" in message
    # lanes 4..15 of program 1 read elements 20..31: byte offsets 80.. from x_ptr
    assert "12 of 16" in message and "block index (4,)" in message
    assert "byte offset 80 from pointer argument 'x_ptr'" in message
    assert caught.value.program_id == (1, 0, 0)


def test_masked_out_of_bounds_lanes_are_not_touched():
    x_t = torch.randn(20)
    out = torch.full((20,), float("nan"))
    launch(_copy_kernel(masked=True), (2,), [x_t, out, 20])
    assert torch.equal(out, x_t)


def test_misaligned_pointer_raises():
    x_t = torch.randn(8)
    k = KernelIR("misaligned", x_ptr=ptr(F32), out_ptr=ptr(F32))
    cols = k.arange(4)
    as_bytes = k.op(OpCode.BITCAST, [k["x_ptr"]], ptr(dt.int8))   # pointer casts are bit-for-bit
    shifted = k.op(OpCode.BITCAST, [k.addptr(as_bytes, k.const(2, I32))], ptr(F32))
    k.store(k.addptr(k["out_ptr"], cols), k.load(k.addptr(shifted, cols)))
    with pytest.raises(InterpreterError, match="misaligned load of float32: 4 of 4"):
        launch(k.done(), (1,), [x_t, torch.zeros(4)])


def test_non_contiguous_view_reads_and_writes_through_storage_offset():
    base = torch.arange(60, dtype=torch.float32).reshape(6, 10)
    column = base[1:, 3]             # storage offset 13, stride 10
    target = base[:, 7]              # written in place through the same storage
    k = KernelIR("column_copy", src_ptr=ptr(F32), dst_ptr=ptr(F32), src_stride=I32, dst_stride=I32, n=I32)
    rows = k.arange(8)
    mask = k.bin(OpCode.LT, rows, k["n"])
    values = k.load(k.addptr(k["src_ptr"], k.bin(OpCode.MUL, rows, k["src_stride"])), mask)
    k.store(k.addptr(k["dst_ptr"], k.bin(OpCode.MUL, rows, k["dst_stride"])),
            k.bin(OpCode.MUL, values, k.const(-1.0, F32, (8,))), mask)
    expected = base.clone()
    expected[:5, 7] = -base[1:, 3]
    launch(k.done(), (1,), [column, target, column.stride(0), target.stride(0), 5])
    assert torch.equal(base, expected)


@pytest.mark.parametrize("grid", [(0,), (4, 0), (2, 3, 0)])
def test_grid_with_a_zero_dimension_runs_nothing(grid):
    out = torch.full((40,), 7.0)
    launch(_copy_kernel(masked=False), grid, [torch.zeros(1), out, 1])   # would fault if it ran
    assert torch.equal(out, torch.full((40,), 7.0))


def test_three_dimensional_grid_and_num_programs():
    k = KernelIR("grid3", out_ptr=ptr(I32))
    x, y, z = k.pid(0), k.pid(1), k.pid(2)
    nx, ny = (k.op(OpCode.NUM_PROGRAMS, [], I32, axis=a) for a in (0, 1))
    linear = k.bin(OpCode.ADD, k.bin(OpCode.MUL, k.bin(OpCode.ADD, k.bin(OpCode.MUL, z, ny), y), nx), x)
    k.store(k.addptr(k["out_ptr"], linear), k.bin(OpCode.ADD, k.bin(OpCode.MUL, x, k.const(100, I32)),
                                                   k.bin(OpCode.ADD, k.bin(OpCode.MUL, y, k.const(10, I32)), z)))
    out = torch.full((24,), -1, dtype=torch.int32)
    launch(k.done(), (4, 3, 2), [out])
    assert out.tolist() == [100 * x + 10 * y + z for z in range(2) for y in range(3) for x in range(4)]


def test_bad_grid_and_arguments_are_rejected():
    function = _copy_kernel(masked=True)
    with pytest.raises(LaunchError):
        launch(function, (1, 1, 1, 1), [torch.zeros(1), torch.zeros(1), 1])
    with pytest.raises(LaunchError):
        launch(function, (-1,), [torch.zeros(1), torch.zeros(1), 1])
    with pytest.raises(TypeError, match="'out_ptr'"):
        launch(function, (1,), [torch.zeros(1), 3.0, 1])
    with pytest.raises(TypeError, match="takes 3 runtime arguments"):
        launch(function, (1,), [torch.zeros(1)])


def test_print_and_assert(capsys):
    k = KernelIR("debug", n=I32)
    k.builder.create(OpCode.PRINT, [k.pid()], [], {"prefix": "pid:", "hex": False})
    k.builder.create(OpCode.PRINT, [k.arange(4)], [], {"prefix": "x:", "hex": True})
    k.builder.create(OpCode.ASSERT, [k.bin(OpCode.LT, k.arange(4), k["n"])], [], {"message": "index < n"})
    function = k.done()
    launch(function, (2,), [4])
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["pid (0, 0, 0) pid: 0", "pid (0, 0, 0) x: [0x0, 0x1, 0x2, 0x3]",
                     "pid (1, 0, 0) pid: 1", "pid (1, 0, 0) x: [0x0, 0x1, 0x2, 0x3]"]
    with pytest.raises(InterpreterError, match=r"index < n \(1 of 4 elements false, first at index \(3,\)\)"):
        launch(function, (1,), [3])


def test_scalar_arguments_are_cast_to_their_dtype():
    k = KernelIR("scalars", out_ptr=ptr(F32), a=dt.float16, b=I32)
    k.store(k["out_ptr"], k.cast(k["a"], F32))
    k.store(k.addptr(k["out_ptr"], k.const(1, I32)), k.cast(k["b"], F32))
    out = torch.zeros(2)
    launch(k.done(), (1,), [out, 0.1, 2 ** 32 + 3])
    assert out.tolist() == [float(np.float16(0.1)), 3.0]


def test_op_without_a_rule_raises_not_implemented(monkeypatch):
    monkeypatch.delitem(RULES, OpCode.SCAN)
    k = KernelIR("scan_kernel", x_ptr=ptr(F32))
    x = k.load(k.addptr(k["x_ptr"], k.arange(4)))
    k.op(OpCode.SCAN, [x], x.type, kind="sum", axis=0, reverse=False)
    with pytest.raises(NotImplementedError, match="'scan'"):
        Interpreter(k.done())


def _atomic(k, code, operands, **attrs):
    return k.builder.create(code, operands, [operands[1].type], attrs).result


@pytest.mark.parametrize("kind, expected", [
    ("max", [9, 7, 0, 0]), ("min", [-1, 0, 0, 0]), ("xchg", [-1, 7, 0, 0]), ("xor", [9 ^ -1 ^ 3, 4 ^ 7, 0, 0]),
])
def test_masked_atomic_rmw_kinds(kind, expected):
    # lanes 0..5 write cells [0, 0, 1, 0, 1, 2] with values [3, 9, 4, -1, 7, 5]; lane 5 is masked off
    k = KernelIR("atomics", cell_ptr=ptr(I32), index_ptr=ptr(I32), value_ptr=ptr(I32), old_ptr=ptr(I32))
    lanes = k.arange(8)
    mask = k.bin(OpCode.LT, lanes, k.const(5, I32))
    index = k.load(k.addptr(k["index_ptr"], lanes), mask)
    value = k.load(k.addptr(k["value_ptr"], lanes), mask)
    old = _atomic(k, OpCode.ATOMIC_RMW, [k.addptr(k["cell_ptr"], index), value, mask],
                  kind=kind, masked=True, sem="acq_rel", scope="gpu")
    k.store(k.addptr(k["old_ptr"], lanes), old)
    cells = torch.zeros(4, dtype=torch.int32)
    olds = poison(torch.empty(8, dtype=torch.int32))
    indices = torch.tensor([0, 0, 1, 0, 1, 2, 0, 0], dtype=torch.int32)
    values = torch.tensor([3, 9, 4, -1, 7, 5, 0, 0], dtype=torch.int32)
    launch(k.done(), (1,), [cells, indices, values, olds])
    assert cells.tolist() == expected
    combine = {"max": max, "min": min, "xchg": lambda old, new: new, "xor": lambda old, new: old ^ new}[kind]
    memory, expected_olds = [0, 0, 0, 0], []
    for i, v in zip(indices[:5].tolist(), values[:5].tolist()):   # lane order
        expected_olds.append(memory[i])
        memory[i] = combine(memory[i], v)
    assert olds.tolist() == expected_olds + [0, 0, 0]   # masked-off lanes return 0, touch nothing


def test_atomic_cas_as_a_lock_counter():
    # every lane of every program swaps 0 -> its ticket only if the cell still holds 0: the first wins
    k = KernelIR("cas", cell_ptr=ptr(F32), old_ptr=ptr(F32))
    lanes = k.arange(4)
    tickets = k.cast(k.bin(OpCode.ADD, lanes, k.bin(OpCode.MUL, k.pid(), k.const(4, I32))), F32)
    cells = k.splat(k["cell_ptr"], (4,))
    old = _atomic(k, OpCode.ATOMIC_CAS, [cells, k.const(-0.0, F32, (4,)), tickets], sem="acq_rel", scope="gpu")
    k.store(k.addptr(k["old_ptr"], k.bin(OpCode.ADD, lanes, k.bin(OpCode.MUL, k.pid(), k.const(4, I32)))), old)
    cell, olds = torch.tensor([-0.0]), poison(torch.empty(8))
    launch(k.done(), (2,), [cell, olds])
    assert cell.item() == 0.0   # -0.0 and ticket 0 compare by bits: the first lane wins, with 0.0
    assert olds.tolist() == [-0.0] + [0.0] * 7


def test_bool_and_bfloat16_memory_and_shape_ops():
    # out[j, i] = where(flags[i, j], x[i, j] * 3, 0) through trans and reshape
    k = KernelIR("shapes", flag_ptr=ptr(dt.int1), x_ptr=ptr(BF16), out_ptr=ptr(BF16), any_ptr=ptr(dt.int1))
    flat = k.arange(8)
    flags = k.op(OpCode.RESHAPE, [k.load(k.addptr(k["flag_ptr"], flat))], BlockType((2, 4), dt.int1))
    x = k.op(OpCode.RESHAPE, [k.load(k.addptr(k["x_ptr"], flat))], BlockType((2, 4), BF16))
    y = k.op(OpCode.WHERE, [flags, k.bin(OpCode.MUL, x, k.const(3.0, BF16, (2, 4))), k.const(0.0, BF16, (2, 4))],
             x.type)
    transposed = k.op(OpCode.TRANS, [y], BlockType((4, 2), BF16), perm=(1, 0))
    k.store(k.addptr(k["out_ptr"], flat), k.op(OpCode.RESHAPE, [transposed], BlockType((8,), BF16)))
    k.store(k["any_ptr"], k.reduce(k.op(OpCode.RESHAPE, [flags], BlockType((8,), dt.int1)), "max", 0))
    flag_t = torch.tensor([1, 0, 1, 1, 0, 0, 1, 0], dtype=torch.bool)
    x_t = random_tensor((8,), torch.bfloat16, seed=7)
    out, any_flag = poison(torch.empty(8, dtype=torch.bfloat16)), torch.zeros(1, dtype=torch.bool)
    launch(k.done(), (1,), [flag_t, x_t, out, any_flag])
    expected = torch.where(flag_t, x_t * 3, torch.zeros(8, dtype=torch.bfloat16)).reshape(2, 4).T.reshape(-1)
    assert torch.equal(out, expected) and any_flag.item() is True


def test_out_of_bounds_store_names_the_nearest_storage_when_the_pointer_has_no_argument():
    k = KernelIR("stray", out_ptr=ptr(F32), address=dt.int64)
    raw = k.op(OpCode.BITCAST, [k["address"]], ptr(F32))   # a pointer made from an integer
    k.store(raw, k.const(1.0, F32))
    out = torch.zeros(4)
    with pytest.raises(InterpreterError, match=r"1 of 1 accessed lanes .* 4 bytes past the end of the "
                                               r"storage of argument 'out_ptr' \(16 bytes\)"):
        launch(k.done(), (1,), [out, out.data_ptr() + 16])
