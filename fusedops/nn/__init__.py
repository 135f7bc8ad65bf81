"""Drop-in torch.nn modules backed by fusedops kernels (same arguments and state_dict keys)."""

from fusedops.nn.softmax import LogSoftmax, Softmax  # noqa: E402,F401
