"""A 2-D convolution whose second derivatives run on the backend's own weight-gradient kernel.

The losses that train an energy differentiate its input gradient again: denoising score matching
(`composable_ebm.training.denoising`) fits ``dE/dx``, and the KL loss (Du et al. 2021, Eq. 7) backpropagates
through a Langevin step, which holds ``dE/dx``. For a convolution ``y = conv(x, w)`` the input gradient is
``gx = conv_input_grad(gy, w)``, and its derivative in ``w`` against an incoming ``ggx`` is the weight gradient of
a convolution of ``ggx`` against ``gy``. Autograd's generic formula computes that term as a convolution with the
batch and channel axes swapped and the whole feature map as the kernel, which the CPU's convolution library runs
several times slower than its weight-gradient kernel (docs/benchmarks.md, "Second derivatives of convolutions").
`Conv2d` states the two derivatives itself, each a call of ``torch.nn.grad.conv2d_input`` / ``conv2d_weight``
(``aten::convolution_backward``) or of ``conv2d``, and computes only the gradients the current backward pass
asks for.

It does so inside `second_derivatives()`, which the denoising loss enters; elsewhere (a sampling chain takes first
derivatives only) ``conv2d`` runs as it is, without the Python-level derivatives' overhead per call. The KL loss's
last Langevin step does not enter it: the contrastive-divergence recipes' small batches measured no faster. It is
on by default on the CPU, where it was measured; `use_native_conv_grad` (or ``CEBM_NATIVE_CONV_GRAD``: ``0`` off,
``1`` on every device, ``cpu`` the default) chooses. The forward pass is ``conv2d`` itself, and under autocast the
convolution runs at autocast's dtype, as ``conv2d`` would.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.grad import conv2d_input, conv2d_weight

_CHOICES = ("0", "1", "cpu")
_setting = os.environ.get("CEBM_NATIVE_CONV_GRAD", "cpu")
if _setting not in _CHOICES:
    raise ValueError(f"CEBM_NATIVE_CONV_GRAD={_setting!r} is not a valid setting; valid choices: {list(_CHOICES)}"
                     " (0: off, 1: on every device, cpu: on the CPU only)")

_will_execute = getattr(torch._C, "_will_engine_execute_node", None)  # absent: every gradient asked for is computed


def use_native_conv_grad(enabled: bool | str) -> None:
    """Switch `Conv2d`'s own derivatives on (``True``: every device), off (``False``: autograd's formulas), or on
    the CPU only (``"cpu"``, the default unless ``CEBM_NATIVE_CONV_GRAD`` says otherwise) for this process."""
    global _setting
    choices = {True: "1", False: "0", "cpu": "cpu"}
    if not isinstance(enabled, (bool, str)) or enabled not in choices:
        raise ValueError(f"use_native_conv_grad takes True, False or 'cpu', got {enabled!r}")
    _setting = choices[enabled]


_scope = threading.local()


@contextlib.contextmanager
def second_derivatives() -> Iterator[None]:
    """Within it, `Conv2d` records its own derivatives (where `native_conv_grad` holds): enter it around an energy
    evaluation whose input gradient will be differentiated again."""
    _scope.depth = getattr(_scope, "depth", 0) + 1
    try:
        yield
    finally:
        _scope.depth -= 1


def native_conv_grad(device_type: str) -> bool:
    """Whether `Conv2d` on a device of this type (``"cpu"``, ``"cuda"``, ...) uses its own derivatives."""
    return _setting == "1" or (_setting == "cpu" and device_type == "cpu")


def _wanted(ctx, index: int) -> bool:
    """Whether the running backward pass needs the gradient of the ``index``-th input (an input that requires no
    gradient is never needed; one the pass does not reach, such as the weights while only ``dE/dx`` is taken, is
    skipped)."""
    if not ctx.needs_input_grad[index]:
        return False
    node = ctx.next_functions[index][0]
    return node is not None and (_will_execute is None or bool(_will_execute(node)))


class _Geometry:
    """A convolution's stride, padding, dilation and groups, as ``conv2d`` takes them."""

    def __init__(self, stride: tuple[int, int], padding: tuple[int, int], dilation: tuple[int, int],
                 groups: int) -> None:
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups

    def conv(self, x: Tensor, w: Tensor) -> Tensor:
        return F.conv2d(x, w, None, self.stride, self.padding, self.dilation, self.groups)

    def input_grad(self, shape: torch.Size, w: Tensor, gy: Tensor) -> Tensor:
        return conv2d_input(shape, w, gy, self.stride, self.padding, self.dilation, self.groups)

    def weight_grad(self, x: Tensor, shape: torch.Size, gy: Tensor) -> Tensor:
        return conv2d_weight(x, shape, gy, self.stride, self.padding, self.dilation, self.groups)


class _InputGrad(torch.autograd.Function):
    """``gx = conv_input_grad(gy, w)``, linear in ``gy`` and in ``w``; differentiable again (its own derivatives
    are a convolution and a weight gradient, each differentiable by autograd)."""

    @staticmethod
    def forward(ctx, gy: Tensor, w: Tensor, shape: torch.Size, geometry: _Geometry) -> Tensor:
        ctx.save_for_backward(gy, w)
        ctx.geometry = geometry
        return geometry.input_grad(shape, w, gy)

    @staticmethod
    def backward(ctx, ggx: Tensor) -> tuple[Tensor | None, ...]:
        gy, w = ctx.saved_tensors
        geometry: _Geometry = ctx.geometry
        g_gy = geometry.conv(ggx, w) if _wanted(ctx, 0) else None  # the adjoint of the input gradient: the conv
        g_w = geometry.weight_grad(ggx, w.shape, gy) if _wanted(ctx, 1) else None
        return g_gy, g_w, None, None


class _Conv(torch.autograd.Function):
    """``conv2d(x, w) + b`` with the input gradient as `_InputGrad` (so its derivative in ``w`` runs the
    weight-gradient kernel)."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor, b: Tensor | None, geometry: _Geometry) -> Tensor:
        ctx.save_for_backward(x, w)
        ctx.geometry = geometry
        ctx.has_bias = b is not None
        return F.conv2d(x, w, b, geometry.stride, geometry.padding, geometry.dilation, geometry.groups)

    @staticmethod
    def backward(ctx, gy: Tensor) -> tuple[Tensor | None, ...]:
        x, w = ctx.saved_tensors
        geometry: _Geometry = ctx.geometry
        gx = None
        if _wanted(ctx, 0):  # gy as a view, so `_InputGrad` never sees a leaf (see `Conv2d.forward`)
            gx = _InputGrad.apply(gy.view_as(gy) if gy.requires_grad else gy, w, x.shape, geometry)
        gw = geometry.weight_grad(x, w.shape, gy) if _wanted(ctx, 1) else None
        gb = gy.sum((0, 2, 3)) if ctx.has_bias and _wanted(ctx, 2) else None
        return gx, gw, gb, None


class Conv2d(nn.Conv2d):
    """``nn.Conv2d`` (same parameters and state-dict keys) whose derivatives are `_Conv`'s inside
    `second_derivatives()` where `native_conv_grad` holds for the input's device and a gradient is being recorded;
    ``conv2d`` itself otherwise (no gradient, ``torch.compile``, a padding mode other than zeros)."""

    def filter(self) -> Tensor:
        """The convolution's weights as applied (a subclass may transform them)."""
        return self.weight

    def forward(self, x: Tensor) -> Tensor:
        """The convolution of ``x`` ``(B, C, H, W)``."""
        w, b = self.filter(), self.bias
        device = x.device.type
        if (not getattr(_scope, "depth", 0) or not torch.is_grad_enabled() or not native_conv_grad(device)
                or self.padding_mode != "zeros"
                or isinstance(self.padding, str) or torch.compiler.is_compiling()
                or not (x.requires_grad or w.requires_grad)):
            return self._conv_forward(x, w, b)  # nn.Conv2d's own (which pads a non-zero padding mode itself)
        if torch.is_autocast_enabled(device):  # as autocast runs conv2d: in its dtype, whatever the inputs'
            dtype = torch.get_autocast_dtype(device)
            x, w, b = x.to(dtype), w.to(dtype), (b.to(dtype) if b is not None else None)
        geometry = _Geometry(self.stride, self.padding, self.dilation, self.groups)
        # views, so no input is a leaf when `_wanted` asks the engine about it (it cannot answer for a leaf inside
        # autograd.grad)
        x, w = (x.view_as(x) if x.requires_grad else x), (w.view_as(w) if w.requires_grad else w)
        b = b.view_as(b) if b is not None and b.requires_grad else b
        with torch.autocast(device, enabled=False):
            return _Conv.apply(x, w, b, geometry)
