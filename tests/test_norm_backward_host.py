"""The host path of the LayerNorm/RMSNorm backward (fusedops/autograd/norms.py NormFunction,
kernels/norms.py NormLaunches.backward).

NormLaunches.backward finds its launch by the gradients asked for alone when dy, the saved x and the
saved weight are contiguous, else by their strides: the cases here switch between the two within one
forward layout (dy layouts, frozen parameters, saved-tensor hooks that lay x or weight out anew) and
check every gradient against torch in float64. CPU tier: the interpreter, small shapes.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

import fusedops
from fusedops.autograd import norms as autograd_norms
from helpers import assert_close, random_tensor

ROWS, COLS = 6, 16      # rows != columns: a saved-tensor hook tells x's statistics from the weight by shape


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_INTERPRET", "1")


def _gradients(op, x, w, b, dy, requires, hooks=None):
    """(dx, dweight, dbias) of op(x, w, b) by fusedops (or None where not asked for) and by torch in
    float64; `requires`: which of x, w, b require a gradient."""
    ours = [t.detach().clone().requires_grad_(r) for t, r in zip((x, w, b), requires)]
    theirs = [t.detach().double().requires_grad_(r) for t, r in zip((x, w, b), requires)]
    with hooks if hooks is not None else contextlib.nullcontext():
        if op == "layer_norm":
            y = fusedops.layer_norm(ours[0], (COLS,), ours[1], ours[2])
        else:
            y = fusedops.rms_norm(ours[0], (COLS,), ours[1], 1e-5)
    if op == "layer_norm":
        expected = F.layer_norm(theirs[0], (COLS,), theirs[1], theirs[2])
    else:
        expected = F.rms_norm(theirs[0], (COLS,), theirs[1], 1e-5)
    wanted = [t for t, r in zip(ours, requires) if r]
    actual = iter(torch.autograd.grad(y, wanted, dy))
    reference = iter(torch.autograd.grad(expected, [t for t, r in zip(theirs, requires) if r], dy.double()))
    return [(next(actual), next(reference)) if r else None for r in requires]


def _check(op, x, w, b, dy, requires, hooks=None):
    for pair in _gradients(op, x, w, b, dy, requires, hooks):
        if pair is not None:
            actual, expected = pair
            assert actual.dtype == torch.float32 and actual.shape == expected.shape
            assert_close(actual, expected, torch.float32)


def _inputs(seed):
    x = random_tensor((ROWS, COLS), torch.float32, "cpu", seed)
    w = random_tensor((COLS,), torch.float32, "cpu", seed + 1, scale=0.5) + 1
    b = random_tensor((COLS,), torch.float32, "cpu", seed + 2)
    dy = random_tensor((ROWS, COLS), torch.float32, "cpu", seed + 3)
    return x, w, b, dy


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_one_forward_layout_every_dy_layout_and_frozen_parameters(interpret, op, seed):
    # One NormLaunches throughout: contiguous dy (its launch per gradients asked for), then dy laid
    # out otherwise (launches per strides), and back; parameters frozen and not.
    x, w, b, dy = _inputs(seed)
    layouts = (dy, dy[:1].expand(ROWS, COLS), dy.t().contiguous().t(), dy)
    every = [(True, True, True), (True, False, True), (False, True, False), (True, True, False)]
    for requires in every:
        requires = requires if op == "layer_norm" else requires[:2] + (False,)
        for grad in layouts:
            _check(op, x, w, b, grad, requires)
    known = autograd_norms.known_launches(op, x, (COLS,), w, b if op == "layer_norm" else None, 1e-5)
    assert set(known[0]._contiguous_backward) == {requires + (False, False) for requires in every
                                                  if op == "layer_norm"} | {
        requires[:2] + (False, False, False) for requires in every if op == "rms_norm"}


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_saved_tensor_hooks_that_give_back_strided_x_or_weight(interpret, op, seed):
    # A contiguous forward whose saved x or weight comes back strided: the backward must not take the
    # launch prepared for contiguous tensors (nor the other way round, test_norms.py).
    x, w, b, dy = _inputs(seed)

    def strided(t):
        if t.shape == (ROWS, COLS):
            return t.t().contiguous().t()                   # column stride ROWS
        if t.shape == (COLS,):
            return torch.stack((t, t), 1)[:, 0]             # stride 2
        return t

    requires = (True, True, op == "layer_norm")
    _check(op, x, w, b, dy, requires)                       # the contiguous launch first
    for pack in (strided, lambda t: strided(t) if t.dim() == 2 else t, lambda t: strided(t) if t.dim() == 1 else t):
        _check(op, x, w, b, dy, requires, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t))
    _check(op, x, w, b, dy, requires)
