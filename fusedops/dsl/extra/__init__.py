"""`dsl.extra`: Triton's `triton.language.extra` namespace. `dsl.extra.libdevice` and `dsl.extra.cuda.libdevice`
are one module, the libdevice math functions (fusedops/dsl/language/libdevice.py), as Triton's
`from triton.language.extra import libdevice` / `from triton.language.extra.cuda import libdevice`.
"""

import sys as _sys

from . import cuda
from .cuda import libdevice

_sys.modules.setdefault(__name__ + ".libdevice", libdevice)     # `import fusedops.dsl.extra.libdevice`

__all__ = ["cuda", "libdevice"]
