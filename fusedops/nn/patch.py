"""`fusedops.nn.patch(model)`: run an existing model's layers on fusedops kernels, in place.

Each module whose type is exactly one of the supported classes gets its class changed to a
subclass that overrides `forward` only, the mechanism torch.nn.utils.parametrize uses:

| patch() flag | original class (exact type)                                | becomes                       |
|--------------|------------------------------------------------------------|-------------------------------|
| softmax      | torch.nn.Softmax, torch.nn.LogSoftmax                      | fusedops.nn.Softmax, LogSoftmax |
| layer_norm   | torch.nn.LayerNorm, torch.nn.RMSNorm                       | fusedops.nn.LayerNorm, RMSNorm |
| layer_norm   | transformers' LlamaRMSNorm, MistralRMSNorm, Qwen2RMSNorm   | a subclass: fusedops.rms_norm |
| linear       | torch.nn.Linear                                            | fusedops.nn.Linear            |
| linear       | transformers.pytorch_utils.Conv1D (GPT-2)                  | a subclass: fusedops.matmul   |
| attention    | torch.nn.MultiheadAttention                                | fusedops.nn.MultiheadAttention |

So the module objects stay where they are (a module shared by two parents, references held by
hooks or wrappers, stay valid), and so do their parameters and buffers (the same Parameter
objects: optimizers, tied weights and state_dict keys are untouched), hooks, training flag and
attributes; isinstance checks against the original class still hold. transformers classes are
recognized by their qualified class name, so transformers is never imported here.

Attention in transformers models is not a module to replace: their attention layers call a function
looked up by name (`config._attn_implementation`) in transformers' AttentionInterface registry. With
attention=True, patch() registers fusedops' function there under "fusedops"
(fusedops.nn.attention.register_transformers_attention: the semantics of "sdpa", on
fusedops.scaled_dot_product_attention) and switches each transformers model found in `model` (a
PreTrainedModel: its config and sub-configs, and its sub-models) from "sdpa" or "eager" to it with
`set_attn_implementation`; the report lists them in `attention`. Attention dropout (training with
attention_dropout > 0) runs torch's SDPA: the kernels have no dropout. Other implementations
(flash_attention_2, flex_attention, ...) are left alone and reported as skipped.

Not replaced, and listed in the report with the reason: subclasses of the supported classes (their
forward may differ, e.g. nn.MultiheadAttention's NonDynamicallyQuantizableLinear), modules whose
instance has its own `forward` attribute (set by accelerate-style hooks), kinds turned off by a
flag, modules with an attribute of their own that the replacement class uses (a Linear's `activation`: it
would be overwritten), and modules that already are fusedops modules. Functional calls inside a model's forward
(torch.softmax, F.layer_norm, F.scaled_dot_product_attention, ...) are not changed: only modules
and transformers' attention registry are.

Outside torch.compile, the patched transformers modules run their original forward for a tensor subclass among
their inputs and parameters (e.g. a quantized weight) or an active torch function or dispatch mode, so that the
subclass or mode sees the original's calls (fusedops.nn.Linear runs F.linear then, as torch.nn.Linear does), and
under torch.jit.script they are scripted as their original forward (where the original scripts).

Models with patched transformers classes (dynamically created subclasses) save and load through
state_dict as before; pickling the whole model object does not work for those.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
from typing import Dict, List

import torch

from fusedops import functional
from fusedops.autograd.function_host import autocast_off
from fusedops.nn import attention as _attention
from fusedops.nn.linear import Linear, subclass_or_mode
from fusedops.nn.normalization import LayerNorm, RMSNorm, _as_torch_error
from fusedops.nn.softmax import LogSoftmax, Softmax

FLAGS = ("softmax", "layer_norm", "linear", "attention")

# torch.nn class -> (flag, fusedops class, attributes the fusedops class's __init__ adds)
_TORCH_RULES: Dict[type, tuple] = {
    torch.nn.Softmax: ("softmax", Softmax, {}),
    torch.nn.LogSoftmax: ("softmax", LogSoftmax, {}),
    torch.nn.LayerNorm: ("layer_norm", LayerNorm, {}),
    torch.nn.RMSNorm: ("layer_norm", RMSNorm, {}),
    torch.nn.Linear: ("linear", Linear, {"activation": None}),
    torch.nn.MultiheadAttention: ("attention", _attention.MultiheadAttention, {}),
}

# transformers attention implementations that patch() switches to fusedops' (others are left alone)
_SWITCHABLE_ATTENTION = ("sdpa", "eager")


class _Conv1DForward:
    """forward of transformers' Conv1D (GPT-2): x @ weight + bias, weight (nx, nf), by fusedops.matmul."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():     # torch.jit.script: the original's forward (the kernels are Python calls)
            return self._original_forward(x)
        return self._fused_forward(x)

    @torch.jit.unused
    def _fused_forward(self, x: torch.Tensor) -> torch.Tensor:
        if subclass_or_mode(x, self.weight, self.bias):     # a tensor subclass or a torch mode: the original's calls
            return super().forward(x)
        if x.dim() == 0 or x.shape[-1] != self.nx:
            # the original's addmm refuses it (an empty batch too), as torch words it
            raise RuntimeError(f"Conv1D: mat1 and mat2 shapes cannot be multiplied: the input's last dim must be "
                               f"nx={self.nx}, got input of shape {tuple(x.shape)}")
        rows = x.reshape(math.prod(x.shape[:-1]), self.nx)     # the count spelled out: -1 is ambiguous for 0 elements
        # (an input of another dtype than the weight's: RuntimeError, as the original's addmm raises it)
        return _as_torch_error(x, lambda: functional.matmul(rows, self.weight, self.bias)).reshape(*x.shape[:-1],
                                                                                                   self.nf)


class _T5RMSNormForward:
    """forward of transformers' T5-style RMSNorms (LlamaRMSNorm, ...): weight * (x / rms(x)) over the
    last dim, by fusedops.rms_norm. The original rounds x / rms(x) to x's dtype before the weight multiplies it
    in their promoted dtype: with a weight of another dtype (a float32 norm over float16 activations, as
    k-bit training keeps them) so does this, the kernel normalizing and torch applying the weight."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():     # torch.jit.script: the original's forward (the kernels are Python calls)
            return self._original_forward(hidden_states)
        return self._fused_forward(hidden_states)

    @torch.jit.unused
    def _fused_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if subclass_or_mode(hidden_states, self.weight):  # a tensor subclass or a torch mode: the original's calls
            return super().forward(hidden_states)
        # The original's ops are none of autocast's, so its output dtype is the input's (or the weight's promotion
        # with it) under autocast too: fusedops.rms_norm runs without autocast's rms_norm policy (float32 on CUDA
        # with torch >= 2.12), as a call to torch.nn.functional.rms_norm would not.
        # (an input the op rejects, e.g. its last dim not the weight's: RuntimeError, as the original's ops raise it)
        with autocast_off(hidden_states.device.type):
            if self.weight.dtype != hidden_states.dtype:
                return self.weight * _as_torch_error(hidden_states, lambda: functional.rms_norm(
                    hidden_states, self.weight.shape, None, self.variance_epsilon))
            return _as_torch_error(hidden_states, lambda: functional.rms_norm(
                hidden_states, self.weight.shape, self.weight, self.variance_epsilon))


# qualified transformers class name -> (flag, forward mixin)
_TRANSFORMERS_RULES: Dict[str, tuple] = {
    "transformers.pytorch_utils.Conv1D": ("linear", _Conv1DForward),
    "transformers.models.llama.modeling_llama.LlamaRMSNorm": ("layer_norm", _T5RMSNormForward),
    "transformers.models.mistral.modeling_mistral.MistralRMSNorm": ("layer_norm", _T5RMSNormForward),
    "transformers.models.qwen2.modeling_qwen2.Qwen2RMSNorm": ("layer_norm", _T5RMSNormForward),
}


@dataclasses.dataclass(frozen=True)
class PatchedModule:
    """A module whose class patch() changed: its path in the model ("" for the model itself)."""

    path: str
    original: str       # qualified class names
    replacement: str


@dataclasses.dataclass(frozen=True)
class SkippedModule:
    """A module of a supported kind that patch() left alone, and why."""

    path: str
    module_type: str
    reason: str


@dataclasses.dataclass(frozen=True)
class SwitchedAttention:
    """A transformers model (at `path`) whose attention implementation patch() switched, for its config,
    sub-configs and sub-models (e.g. "sdpa" -> "fusedops")."""

    path: str
    model_type: str     # qualified class name
    original: str
    replacement: str


@dataclasses.dataclass
class PatchReport:
    """What fusedops.nn.patch did: `replaced` and `skipped` modules, in model order, the transformers
    models whose `attention` implementation was switched, and `notes` (limits of what was patched)."""

    replaced: List[PatchedModule] = dataclasses.field(default_factory=list)
    skipped: List[SkippedModule] = dataclasses.field(default_factory=list)
    attention: List[SwitchedAttention] = dataclasses.field(default_factory=list)
    notes: List[str] = dataclasses.field(default_factory=list)

    def counts(self) -> Dict[str, int]:
        """How many modules became each replacement class."""
        counts: Dict[str, int] = {}
        for entry in self.replaced:
            counts[entry.replacement] = counts.get(entry.replacement, 0) + 1
        return counts

    def __str__(self) -> str:
        lines = [f"fusedops.nn.patch: {len(self.replaced)} modules replaced, {len(self.skipped)} skipped"]
        lines += [f"  {name}: {count}" for name, count in sorted(self.counts().items())]
        lines += [f"  attention of {a.path or '<model>'} ({a.model_type}): {a.original} -> {a.replacement}"
                  for a in self.attention]
        lines += [f"  skipped {s.path or '<model>'} ({s.module_type}): {s.reason}" for s in self.skipped]
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


def _qualified_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@functools.lru_cache(maxsize=None)
def _fused_subclass(original: type, mixin: type) -> type:
    """`original` with `mixin`'s forward (one class per original class); the original's forward stays reachable as
    `_original_forward`, which the mixins' forward runs under torch.jit.script (TorchScript has no super())."""
    return type(f"Fused{original.__name__}", (mixin, original),
                {"__module__": __name__, "_original_forward": _renamed(original.forward, "_original_forward")})


def _renamed(function, name: str):
    """A copy of the Python function `function` named `name` (TorchScript compiles a method under its function's
    name: the original's `forward` beside the mixin's would be a "redefined method"); `function` itself where it is
    not a plain Python function (a wrapped or builtin forward: scripting it then fails as it would have)."""
    if not isinstance(function, types.FunctionType):
        return function
    copy = types.FunctionType(function.__code__, function.__globals__, name, function.__defaults__,
                              function.__closure__)
    copy.__kwdefaults__, copy.__annotations__ = function.__kwdefaults__, dict(function.__annotations__)
    copy.__qualname__ = function.__qualname__[:len(function.__qualname__) - len(function.__name__)] + name
    copy.__module__ = function.__module__
    return copy


def _plan(module: torch.nn.Module, enabled: Dict[str, bool]):
    """(replacement class, attributes to set) for `module`, a skip reason (str), or None when it is
    not a kind patch() handles."""
    cls = type(module)
    if cls.__module__.startswith("fusedops."):
        supported = any(issubclass(cls, base) for base in _TORCH_RULES) or cls.__name__.startswith("Fused")
        return "already a fusedops module" if supported else None
    rule = _TORCH_RULES.get(cls)
    if rule is not None:
        flag, replacement, attributes = rule
    elif _qualified_name(cls) in _TRANSFORMERS_RULES:
        flag, mixin = _TRANSFORMERS_RULES[_qualified_name(cls)]
        replacement, attributes = _fused_subclass(cls, mixin), {}
    else:
        base = next((b for b in _TORCH_RULES if isinstance(module, b)), None)
        if base is None:
            return None
        return f"a subclass of {_qualified_name(base)}: its forward may differ from the original's"
    if not enabled[flag]:
        return f"{flag}=False"
    if "forward" in vars(module):
        return "the instance has its own forward attribute (e.g. a hook library's wrapper)"
    # an attribute, parameter, buffer or submodule of the instance that the replacement would overwrite (a
    # Linear's own `activation`, which fusedops.nn.Linear would apply and the report's setattr would replace)
    taken = next((name for name in attributes if hasattr(module, name)), None)
    if taken is not None:
        return f"the instance has its own {taken!r} attribute, which {_qualified_name(replacement)} uses"
    return replacement, attributes


def patch(model: torch.nn.Module, *, softmax: bool = True, layer_norm: bool = True, linear: bool = True,
          attention: bool = True) -> PatchReport:
    """Make `model`'s supported modules (see the module docstring) run fusedops kernels, in place.

    Args:
        model: any torch.nn.Module; it and every submodule are considered.
        softmax, layer_norm, linear: which kinds to replace (softmax covers LogSoftmax; layer_norm
            covers RMSNorm and transformers' RMSNorms; linear covers transformers' Conv1D).
        attention: replace torch.nn.MultiheadAttention, and switch transformers models to the
            "fusedops" attention function (see the module docstring).
    Returns:
        A PatchReport of the modules replaced and skipped (print it for a summary).
    Raises:
        TypeError: `model` is not a torch.nn.Module.

    Outputs stay those of the original modules up to the kernels' rounding (CPU tensors keep running
    torch's ops unless FUSEDOPS_INTERPRET=1). Patching twice is harmless: the second call skips the
    fusedops modules and the models already on fusedops attention.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"fusedops.nn.patch(): expected a torch.nn.Module, got {type(model).__name__}")
    enabled = dict(softmax=softmax, layer_norm=layer_norm, linear=linear, attention=attention)
    report = PatchReport()
    for path, module in model.named_modules():
        plan = _plan(module, enabled)
        if plan is None:
            continue
        original = type(module)
        if isinstance(plan, str):
            report.skipped.append(SkippedModule(path, _qualified_name(original), plan))
            continue
        replacement, attributes = plan
        module.__class__ = replacement
        for name, value in attributes.items():
            setattr(module, name, value)
        report.replaced.append(PatchedModule(path, _qualified_name(original), _qualified_name(replacement)))
    if attention:
        _switch_transformers_attention(model, report)
    return report


def _transformers_models(model: torch.nn.Module):
    """(path, module) for the outermost transformers PreTrainedModels in `model` (their sub-models are
    switched with them), recognized by duck typing so that transformers is not imported."""
    covered = set()
    for path, module in model.named_modules():
        if id(module) in covered:
            continue
        config = getattr(module, "config", None)
        if callable(getattr(module, "set_attn_implementation", None)) and hasattr(config, "_attn_implementation"):
            covered.update(id(m) for m in module.modules())
            yield path, module


def _switch_transformers_attention(model: torch.nn.Module, report: PatchReport) -> None:
    """Switch the transformers models in `model` to the "fusedops" attention function (module docstring)."""
    dropout = False
    for path, module in _transformers_models(model):
        original = module.config._attn_implementation
        module_type = _qualified_name(type(module))
        if original == _attention.TRANSFORMERS_ATTENTION:
            report.skipped.append(SkippedModule(path, module_type, "already on the fusedops attention"))
            continue
        if original not in _SWITCHABLE_ATTENTION:
            report.skipped.append(SkippedModule(path, module_type, f"uses the {original!r} attention implementation; "
                                                f"patch() switches only {' and '.join(_SWITCHABLE_ATTENTION)}"))
            continue
        name = _attention.register_transformers_attention()
        module.set_attn_implementation(name)
        if module.config._attn_implementation != name:     # transformers refused (an old-style model)
            report.skipped.append(SkippedModule(path, module_type, "its attention does not go through transformers' "
                                                "AttentionInterface; attention runs as before"))
            continue
        report.attention.append(SwitchedAttention(path, module_type, original, name))
        dropout = dropout or any(getattr(module.config, key, 0) for key in
                                 ("attention_dropout", "attn_pdrop", "attention_probs_dropout_prob"))
    if dropout:
        report.notes.append("attention dropout > 0 in a model's config: while training, its attention runs "
                            "torch's scaled_dot_product_attention (the fusedops kernels have no attention "
                            "dropout); set it to 0 to train on the kernels")

