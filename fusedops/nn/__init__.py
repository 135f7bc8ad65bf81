"""Drop-in torch.nn modules backed by fusedops kernels (same arguments and state_dict keys)."""

from fusedops.nn.softmax import LogSoftmax, Softmax  # noqa: E402,F401
from fusedops.nn.normalization import LayerNorm, RMSNorm  # noqa: E402,F401
from fusedops.nn.linear import Linear  # noqa: E402,F401
from fusedops.nn.patch import PatchReport, patch  # noqa: E402,F401
from fusedops.nn.attention import MultiheadAttention  # noqa: E402,F401
