"""Drop-in torch.nn modules backed by fusedops kernels (same arguments and state_dict keys)."""
