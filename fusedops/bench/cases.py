"""The one table of benchmark cases, shared by `python -m fusedops.bench`, the CPU self-check and the
pytest-benchmark suite in bench/.

Each entry of `CASES` says, for one op in one direction (forward, or backward through autograd):
its shapes (full run, --quick run, CPU self-check), dtypes, how to make inputs, the native PyTorch
implementation (the baseline, and on float64 inputs the reference), how to reach the fusedops
implementation, and the bytes or FLOPs one call moves. Adding an op is adding one `_op(...)` entry:
the runner, the self-check, the tests and the plots pick it up. An entry whose fusedops function
does not exist yet is skipped with a one-line reason.

Calling conventions (one per case, the same for every provider):
    make_inputs(shape, dtype, device, generator) -> tuple of tensors
    torch_fn(*inputs, **options(shape)) -> tensor           (options: non-tensor arguments)
    fusedops() -> a function with torch_fn's signature       (raises ImportError/AttributeError
                                                              while the op does not exist)
    reference_fn(*inputs_float64, **options) -> tensor       (default: torch_fn)
    reference_grads(inputs_float64, grad_output_float64, **options) -> gradients
                                                             (default: autograd through reference_fn)
    work(shape, element_size) -> bytes (unit "GB/s") or FLOPs (unit "TFLOP/s") of one call
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
from typing import Callable, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from . import references

Shape = Tuple  # ints (and bools, e.g. causal), named by BenchCase.dims

DTYPE_NAMES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
UNITS = ("GB/s", "TFLOP/s")


def dtype_name(dtype: torch.dtype) -> str:
    """"fp16", "bf16" or "fp32" (the --dtype spelling)."""
    for name, value in DTYPE_NAMES.items():
        if value == dtype:
            return name
    return str(dtype).replace("torch.", "")


def no_dtype_line(case, dtypes) -> str:
    """The line saying that `case` (a BenchCase) has none of `dtypes`, so a run leaves it out."""
    return (f"skipped {case.name}: no {', '.join(dtype_name(d) for d in dtypes)} case "
            f"(its dtypes: {', '.join(dtype_name(d) for d in case.dtypes)})")


def _no_options(shape: Shape) -> dict:
    return {}


@dataclasses.dataclass(frozen=True)
class BenchCase:
    """One op in one direction; see the module docstring for the calling conventions."""

    name: str                       # unique; what --ops takes: "softmax", "softmax_backward"
    op: str                         # the op: one plot per op, forward and backward together
    backward: bool                  # time the backward pass (autograd) instead of the forward
    dims: Tuple[str, ...]           # names of the shape's entries: ("M", "N")
    shapes: Tuple[Shape, ...]       # full run
    quick_shapes: Tuple[Shape, ...]
    selfcheck_shapes: Tuple[Shape, ...]   # small: the interpreter runs these on the CPU
    dtypes: Tuple[torch.dtype, ...]       # the first is the --quick dtype
    make_inputs: Callable
    torch_fn: Callable
    fusedops: Callable[[], Callable]
    unit: str
    work: Callable[[Shape, int], float]
    options: Callable[[Shape], dict] = _no_options
    grad_inputs: Tuple[int, ...] = (0,)   # inputs the backward differentiates (backward cases)
    reference_fn: Optional[Callable] = None
    reference_grads: Optional[Callable] = None
    extra_providers: Tuple[Tuple[str, Callable], ...] = ()   # more baselines: (name, fn like torch_fn)
    triton: Optional[str] = None    # function of bench/triton_reference.py (forward cases only)
    compile: bool = True            # offer torch.compile(torch_fn) with --compile

    @property
    def fusedops_path(self) -> str:
        """The attribute of `fusedops` the case uses ("softmax", "nn.Linear")."""
        return getattr(self.fusedops, "path", self.name)

    def label(self, shape: Shape) -> str:
        """"M=8192 N=4096"; a true flag shows its name ("causal"), a false one nothing."""
        parts = []
        for dim, value in zip(self.dims, shape):
            if isinstance(value, bool):
                if value:
                    parts.append(dim)
            else:
                parts.append(f"{dim}={value}")
        return " ".join(parts)

    def reference(self, *inputs, **options):
        return (self.reference_fn or self.torch_fn)(*inputs, **options)


@dataclasses.dataclass(frozen=True)
class Library:
    """The resolver of `fusedops.<path>` ("softmax", "nn.Linear"): calling it returns the attribute,
    wrapped as `adapt(attribute, *inputs, **options)` when `adapt` is given, and raises ImportError
    or AttributeError while the attribute does not exist."""

    path: str
    adapt: Optional[Callable] = None

    def __call__(self) -> Callable:
        target = importlib.import_module("fusedops")
        name = "fusedops"
        for part in self.path.split("."):
            name = f"{name}.{part}"
            try:
                target = getattr(target, part)
            except AttributeError:
                # a subpackage (fusedops.nn) is an attribute only once imported
                if importlib.util.find_spec(name) is None:
                    raise
                target = importlib.import_module(name)
        return functools.partial(self.adapt, target) if self.adapt is not None else target


# -- inputs -----------------------------------------------------------------------------------------
def _randn(shape, dtype, device, generator, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
    values = torch.randn(shape, dtype=dtype, device=device, generator=generator)
    if scale != 1.0:
        values.mul_(scale)
    if shift != 0.0:
        values.add_(shift)
    return values


def _rows_inputs(shape, dtype, device, generator):
    return (_randn(shape, dtype, device, generator),)


def _norm_inputs(with_bias: bool):
    def make(shape, dtype, device, generator):
        _, n = shape
        x = _randn(shape, dtype, device, generator)
        weight = _randn((n,), dtype, device, generator, scale=0.1, shift=1.0)
        if not with_bias:
            return x, weight
        return x, weight, _randn((n,), dtype, device, generator, scale=0.1)
    return make


def _matmul_inputs(shape, dtype, device, generator):
    m, n, k = shape
    # b scaled by 1/sqrt(K): outputs of order 1 at every K (fp16 stays far from overflow)
    return _randn((m, k), dtype, device, generator), _randn((k, n), dtype, device, generator, scale=k ** -0.5)


def _linear_inputs(shape, dtype, device, generator):
    m, n, k = shape
    return (_randn((m, k), dtype, device, generator), _randn((n, k), dtype, device, generator, scale=k ** -0.5),
            _randn((n,), dtype, device, generator))


def _attention_inputs(shape, dtype, device, generator):
    b, h, s, e, _ = shape
    return tuple(_randn((b, h, s, e), dtype, device, generator) for _ in range(3))


def _attention_options(shape: Shape) -> dict:
    return {"causal": shape[4]}


# -- work (bytes or FLOPs of one call) --------------------------------------------------------------
def _rows_bytes(reads_and_writes: int):
    # softmax-like: every element of the (M, N) tensors read or written once
    return lambda shape, size: reads_and_writes * shape[0] * shape[1] * size


def _norm_bytes(matrix_passes: int, vector_passes: int, stat_bytes_per_row: int):
    # matrix_passes reads/writes of the (M, N) tensors, vector_passes of the (N,) weight/bias (and
    # their gradients), plus the fp32 statistics (mean/rstd) per row
    return lambda shape, size: ((matrix_passes * shape[0] * shape[1] + vector_passes * shape[1]) * size
                                + stat_bytes_per_row * shape[0])


def _matmul_flops(products: int):
    return lambda shape, size: 2.0 * products * shape[0] * shape[1] * shape[2]


def _attention_flops(factor: float):
    # 4*B*H*L*S*E (two matrix products) forward, halved when causal; backward 2.5x forward
    def flops(shape, size):
        b, h, s, e, causal = shape
        return factor * 4.0 * b * h * s * s * e * (0.5 if causal else 1.0)
    return flops


# -- implementations outside torch's own op --------------------------------------------------------
def _naive_softmax(x):
    # the composed eager version: four kernels and three extra round trips through memory
    shifted = x - x.max(dim=-1, keepdim=True).values
    numerator = shifted.exp()
    return numerator / numerator.sum(dim=-1, keepdim=True)


@functools.lru_cache(maxsize=None)
def _meta_linear(module_class, in_features: int, out_features: int):
    # One shell per size, its parameters passed per call (functional_call): on the meta device when
    # the class takes `device` as torch.nn.Linear does (no memory, no initialization).
    try:
        return module_class(in_features, out_features, bias=True, device="meta")
    except TypeError:
        return module_class(in_features, out_features, bias=True)


def _linear_module(module_class, x, weight, bias):
    module = _meta_linear(module_class, weight.shape[1], weight.shape[0])
    return torch.func.functional_call(module, {"weight": weight, "bias": bias}, (x,))


def _sdpa_backend(backend_name: str):
    def attention(q, k, v, causal):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(getattr(SDPBackend, backend_name)):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return attention


# -- the table ------------------------------------------------------------------------------------
_M = 8192
_SOFTMAX_COLUMNS = (1000, 1024, 2048, 4096, 8192, 16384, 32768, 50257)
_NORM_COLUMNS = (1000, 1024, 2048, 4096, 4097, 8192, 16384, 32768)
_ROWS_SELFCHECK = ((3, 17), (4, 1000), (2, 20000))    # 20000 > one block: the looped paths
_MATMUL_SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192), (8192, 11008, 4096), (8192, 4096, 11008),
                  (8192, 14336, 4096), (8192, 4096, 14336))
_LINEAR_SHAPES = ((4096, 4096, 4096), (8192, 4096, 4096), (8192, 11008, 4096), (8192, 4096, 11008), (8192, 14336, 4096))
_MATMUL_SELFCHECK = ((17, 33, 40), (64, 48, 32))
# 16k tokens (B*S), H*E = 2048
_ATTENTION_SHAPES = tuple((16384 // s, 2048 // e, s, e, causal)
                          for e in (64, 128) for s in (1024, 2048, 4096, 8192, 16384) for causal in (False, True))
_ATTENTION_QUICK = ((4, 16, 4096, 128, False), (4, 16, 4096, 128, True))
_ATTENTION_SELFCHECK = ((1, 2, 17, 64, False), (1, 1, 33, 64, True))
_HALF = (torch.float16, torch.bfloat16)
_FLOAT = (torch.float16, torch.bfloat16, torch.float32)


def _op(name: str, *, work_forward, work_backward=None, triton: Optional[str] = None,
        extra_providers: Mapping[str, Callable] = (), extra_backward: bool = True, **fields) -> tuple:
    """The forward case of an op, and its backward case when `work_backward` is given."""
    extras = tuple(dict(extra_providers).items())
    forward = BenchCase(name=name, op=name, backward=False, work=work_forward, triton=triton,
                        extra_providers=extras, **fields)
    if work_backward is None:
        return (forward,)
    backward = dataclasses.replace(forward, name=f"{name}_backward", backward=True, work=work_backward,
                                   triton=None, extra_providers=extras if extra_backward else ())
    return forward, backward


CASES: Tuple[BenchCase, ...] = (
    *_op("softmax", dims=("M", "N"), unit="GB/s",
         shapes=tuple((_M, n) for n in _SOFTMAX_COLUMNS), quick_shapes=((_M, 4096),),
         selfcheck_shapes=_ROWS_SELFCHECK, dtypes=_FLOAT, make_inputs=_rows_inputs,
         torch_fn=lambda x: torch.softmax(x, dim=-1),
         fusedops=Library("softmax", lambda f, x: f(x, dim=-1)),
         work_forward=_rows_bytes(2), work_backward=_rows_bytes(3),   # read y, dy; write dx
         # the naive version's fp16 backward is not accurate enough to pass the check: forward only
         extra_providers={"torch-naive": _naive_softmax}, extra_backward=False, triton="softmax"),
    *_op("log_softmax", dims=("M", "N"), unit="GB/s",
         shapes=tuple((_M, n) for n in _SOFTMAX_COLUMNS), quick_shapes=((_M, 4096),),
         selfcheck_shapes=_ROWS_SELFCHECK, dtypes=_FLOAT, make_inputs=_rows_inputs,
         torch_fn=lambda x: torch.log_softmax(x, dim=-1),
         fusedops=Library("log_softmax", lambda f, x: f(x, dim=-1)),
         work_forward=_rows_bytes(2), work_backward=_rows_bytes(3)),
    *_op("layer_norm", dims=("M", "N"), unit="GB/s",
         shapes=tuple((_M, n) for n in _NORM_COLUMNS), quick_shapes=((_M, 4096),),
         selfcheck_shapes=_ROWS_SELFCHECK, dtypes=_FLOAT, make_inputs=_norm_inputs(with_bias=True),
         torch_fn=lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b),
         fusedops=Library("layer_norm", lambda f, x, w, b: f(x, x.shape[-1:], w, b)),
         grad_inputs=(0, 1, 2),
         # forward: read x, w, b; write y. backward: read x, dy, w, mean, rstd; write dx, dw, db
         work_forward=_norm_bytes(2, 2, 0), work_backward=_norm_bytes(3, 3, 8), triton="layer_norm"),
    *_op("rms_norm", dims=("M", "N"), unit="GB/s",
         shapes=tuple((_M, n) for n in _NORM_COLUMNS), quick_shapes=((_M, 4096),),
         selfcheck_shapes=_ROWS_SELFCHECK, dtypes=_FLOAT, make_inputs=_norm_inputs(with_bias=False),
         torch_fn=lambda x, w: F.rms_norm(x, x.shape[-1:], w),
         fusedops=Library("rms_norm", lambda f, x, w: f(x, x.shape[-1:], w)),
         grad_inputs=(0, 1),
         # forward: read x, w; write y. backward: read x, dy, w, rstd; write dx, dw
         work_forward=_norm_bytes(2, 1, 0), work_backward=_norm_bytes(3, 2, 4)),
    *_op("matmul", dims=("M", "N", "K"), unit="TFLOP/s",
         shapes=_MATMUL_SHAPES, quick_shapes=((4096, 4096, 4096),), selfcheck_shapes=_MATMUL_SELFCHECK,
         dtypes=_HALF, make_inputs=_matmul_inputs, torch_fn=torch.matmul,
         fusedops=Library("matmul"), grad_inputs=(0, 1),
         work_forward=_matmul_flops(1), work_backward=_matmul_flops(2), triton="matmul"),
    *_op("linear", dims=("M", "N", "K"), unit="TFLOP/s",
         shapes=_LINEAR_SHAPES, quick_shapes=((4096, 4096, 4096),), selfcheck_shapes=_MATMUL_SELFCHECK,
         dtypes=_HALF, make_inputs=_linear_inputs, torch_fn=F.linear,
         fusedops=Library("nn.Linear", _linear_module), grad_inputs=(0, 1, 2),
         work_forward=_matmul_flops(1), work_backward=_matmul_flops(2)),
    *_op("attention", dims=("B", "H", "S", "E", "causal"),
         unit="TFLOP/s", shapes=_ATTENTION_SHAPES, quick_shapes=_ATTENTION_QUICK,
         selfcheck_shapes=_ATTENTION_SELFCHECK, dtypes=_HALF, make_inputs=_attention_inputs,
         options=_attention_options,
         torch_fn=lambda q, k, v, causal: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
         fusedops=Library("scaled_dot_product_attention", lambda f, q, k, v, causal: f(q, k, v, is_causal=causal)),
         reference_fn=references.attention, reference_grads=references.attention_grads, grad_inputs=(0, 1, 2),
         work_forward=_attention_flops(1.0), work_backward=_attention_flops(2.5),
         extra_providers={"torch-flash": _sdpa_backend("FLASH_ATTENTION"),
                          "torch-cudnn": _sdpa_backend("CUDNN_ATTENTION")}),
)

CASES_BY_NAME: Mapping[str, BenchCase] = {case.name: case for case in CASES}


def select(names: Optional[Sequence[str]] = None) -> Tuple[BenchCase, ...]:
    """The cases named (in table order), or all of them. Raises KeyError naming an unknown one."""
    if names is None:
        return CASES
    unknown = [name for name in names if name not in CASES_BY_NAME]
    if unknown:
        raise KeyError(f"unknown op(s) {', '.join(unknown)}; valid ops: {', '.join(CASES_BY_NAME)}")
    wanted = set(names)
    return tuple(case for case in CASES if case.name in wanted)
