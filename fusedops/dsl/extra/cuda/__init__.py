"""`dsl.extra.cuda`: holds `libdevice` (fusedops/dsl/language/libdevice.py), as Triton's
`triton.language.extra.cuda` does."""

import sys as _sys

from ...language import libdevice

_sys.modules.setdefault(__name__ + ".libdevice", libdevice)     # `import fusedops.dsl.extra.cuda.libdevice`

__all__ = ["libdevice"]
