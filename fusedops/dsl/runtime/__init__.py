"""Runtime: cuda-python driver, jit and specialization, launcher, disk cache, autotuner, knobs."""
