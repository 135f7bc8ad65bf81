"""torch.autograd.Function per op: forward and backward kernels and the tensors they save."""
