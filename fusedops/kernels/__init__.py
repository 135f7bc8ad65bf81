"""Kernels written in fusedops.dsl, with their launch wrappers (grids, block sizes, configs)."""
