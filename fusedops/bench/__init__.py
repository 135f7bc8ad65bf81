"""Benchmarks of fusedops ops against native PyTorch; run with `python -m fusedops.bench`."""
