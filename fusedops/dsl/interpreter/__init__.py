"""Executes block IR on the CPU with NumPy, with bounds-checked memory accesses.

    from fusedops.dsl.interpreter import launch
    launch(function, (n_programs,), [x, y, n])      # tensors are updated in place
"""

from .executor import Interpreter, launch, normalize_grid

__all__ = ["Interpreter", "launch", "normalize_grid"]
