"""The numeric rules of the kernel language, written as NumPy reference functions: the package says them,
its modules implement them.

These functions *are* the semantics: the interpreter calls them, and the compiler's lowering must give
the same results (bit for bit for integer, comparison, cast and rounding rules; within the documented
error for transcendental functions and for the order of floating-point sums).

Values are NumPy arrays (0-d for scalars) in the *compute representation* of their dtype:
`DType.numpy_dtype`, i.e. int1 is `np.bool_` and bfloat16 is `np.float32` holding only values that are
exactly representable in bfloat16. Every function takes the operands' element `DType` because the NumPy
dtype alone cannot tell bfloat16 from float32.

Floating point follows IEEE 754: overflow, division by zero and invalid operations give inf/NaN. NumPy
reports those as `RuntimeWarning`s; callers that do not want them wrap calls in
`np.errstate(all="ignore")` (the interpreter does so once per launch). Integer rules never warn.

Integer rules, shared by every width (int1 is treated as an unsigned 1-bit integer, so `+` on int1 is
xor, `*` is and, sums are parities):
- arithmetic wraps around (two's complement), like LLVM's `add`/`mul` without `nsw`;
- `//` (IDIV) truncates toward zero and `%` (MOD) has the sign of the dividend (C); `x // 0` is -1
  (all ones for unsigned) and `x % 0` is x (PTX `div`/`rem`); `MIN // -1` wraps to MIN and `MIN % -1`
  is 0;
- shifts by an amount >= the bit width (negative signed amounts count as huge) give 0 for `<<` and
  logical `>>`, and the sign fill for arithmetic `>>` of signed types (PTX `shl`/`shr` clamp the amount).

Floating-point rules:
- fp16/bf16 arithmetic and math are computed in float32 and rounded once (to nearest even) to the
  type; float32 math is computed in float32, float64 math in float64;
- `%` is C `fmod`; minimum/maximum and max/min reductions propagate NaN; argmax/argmin give the first
  index of the extreme, NaN counting as the extreme (torch semantics);
- conversions (`cast`): float -> int truncates toward zero and saturates, NaN -> 0; every rounding to a
  narrower float is one round-to-nearest-even.

The modules: `conversions.py` (the compute representation, rounding, CAST, BITCAST and bit patterns),
`arithmetic.py` (elementwise arithmetic, comparisons, math, FMA, WHERE), `reductions.py` (REDUCE, argmax /
argmin, SCAN, DOT).
"""
