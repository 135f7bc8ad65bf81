"""The type of a shared-memory buffer that a pass allocates (`local_alloc`): not a value a kernel can
compute with, a place that `async_copy` writes and `local_load` reads.

    !shared<3x128x32xfloat16>   three buffers (pipeline stages) of a 128 x 32 float16 tile
"""

from __future__ import annotations

import dataclasses

from ..language.dtypes import DType


@dataclasses.dataclass(frozen=True)
class SharedBufferType:
    """`num_buffers` tiles of `tile_shape` elements of `element` in shared memory."""

    num_buffers: int
    tile_shape: tuple
    element: DType

    def __str__(self) -> str:
        return f"!shared<{self.num_buffers}x{'x'.join(map(str, self.tile_shape))}x{self.element}>"

    @property
    def tile_bytes(self) -> int:
        n = self.element.itemsize
        for size in self.tile_shape:
            n *= size
        return n

    @property
    def nbytes(self) -> int:
        return self.num_buffers * self.tile_bytes
