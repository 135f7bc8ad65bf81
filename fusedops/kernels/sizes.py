"""Integer sizes the kernel launchers share: the next power of two (block sizes) and the int32 index limit."""

from __future__ import annotations

# Offsets and row indices at or past this do not fit the kernels' int32 arithmetic.
INT32_LIMIT = 2**31


def next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())
