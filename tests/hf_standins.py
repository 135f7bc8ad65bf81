"""Written-out stand-ins of the Hugging Face transformers modules that fusedops.nn.patch recognizes by their
qualified names (transformers is not a test dependency): LlamaRMSNorm and GPT-2's Conv1D, computing what the
originals compute."""

from __future__ import annotations

import torch


class LlamaRMSNorm(torch.nn.Module):
    """Hugging Face's LlamaRMSNorm, written out (the module patch() recognizes by its qualified name)."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


LlamaRMSNorm.__module__ = "transformers.models.llama.modeling_llama"


class Conv1D(torch.nn.Module):
    """Hugging Face's GPT-2 Conv1D, written out: x @ weight + bias with weight (nx, nf)."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf, self.nx = nf, nx
        self.weight = torch.nn.Parameter(torch.randn(nx, nf) * 0.02)
        self.bias = torch.nn.Parameter(torch.randn(nf))

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(size_out)


Conv1D.__module__ = "transformers.pytorch_utils"
