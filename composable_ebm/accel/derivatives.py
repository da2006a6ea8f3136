"""Layers that state their own second derivatives: a 2-D convolution, group normalisation and SiLU.

The losses that train an energy differentiate its input gradient again: denoising score matching
(`composable_ebm.training.denoising`) fits ``dE/dx``, and the KL loss (Du et al. 2021, Eq. 7) backpropagates
through a Langevin step, which holds ``dE/dx``. Autograd differentiates a layer's backward pass by generic formulas:

- For a convolution ``y = conv(x, w)`` the input gradient is ``gx = conv_input_grad(gy, w)``, and its derivative in
  ``w`` against an incoming ``ggx`` is the weight gradient of a convolution of ``ggx`` against ``gy``. Autograd
  computes that term as a convolution with the batch and channel axes swapped and the whole feature map as the
  kernel, which the CPU's convolution library runs several times slower than its weight-gradient kernel. `Conv2d`
  calls ``torch.nn.grad.conv2d_input`` / ``conv2d_weight`` (``aten::convolution_backward``) or ``conv2d``.
- Group normalisation's input gradient, when it is to be differentiated again, is composed by autograd of a dozen
  elementwise operations in float32 on tensors of the input's size, each of them differentiated in turn.
  `GroupNorm` runs the backend's fused ``native_group_norm_backward`` for it and states its derivatives in closed
  form: sums per channel and three weighted sums of tensors.
- SiLU's input gradient is composed of six elementwise operations, each differentiated in turn; `silu` runs the
  fused ``silu_backward`` and states its second derivative, ``silu''(x) = s (1 - s) (2 + x (1 - 2 s))`` with
  ``s = sigmoid(x)``.

The layers do so inside `second_derivatives()`, which the denoising loss enters; elsewhere (a sampling chain takes
first derivatives only) they run as ``nn.Conv2d``, ``nn.GroupNorm`` and ``F.silu`` do, without the Python-level
derivatives' overhead per call. The KL loss's last Langevin step does not enter it: the contrastive-divergence
recipes' small batches measured no faster with the convolutions' own. Each computes only the gradients the current
backward pass asks for. It is on by default on the CPU, where it was measured; the run's
`composable_ebm.accel.settings.Speed` (``CEBM_OWN_DERIVATIVES``: ``0`` off, ``1`` on every device, ``cpu`` the
default, read when the run starts) chooses, and the loss passes its choice to `second_derivatives`. The forward
passes are the backend's own, at the dtype autocast would run them in.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.grad import conv2d_input, conv2d_weight

_will_execute = getattr(torch._C, "_will_engine_execute_node", None)  # absent: every gradient asked for is computed

_scope = threading.local()


@contextlib.contextmanager
def second_derivatives(where: str = "cpu") -> Iterator[None]:
    """Within it, `Conv2d`, `GroupNorm` and `silu` record their own derivatives on the devices ``where`` names (a
    run's ``Speed.own_derivatives``: ``cpu``, ``1`` every device, ``0`` none): enter it around an energy evaluation
    whose input gradient will be differentiated again. The choice holds in this thread, inside the block only."""
    outer = getattr(_scope, "where", "0")
    _scope.where = where
    try:
        yield
    finally:
        _scope.where = outer


def _recording(x: Tensor, *params: Tensor | None) -> bool:
    """Whether a layer applied to ``x`` with ``params`` records its own derivatives here: inside
    `second_derivatives` with them on, with a gradient being recorded through it, and not while ``torch.compile``
    traces it."""
    where = getattr(_scope, "where", "0")
    return ((where == "1" or (where == "cpu" and x.device.type == "cpu")) and torch.is_grad_enabled()
            and not torch.compiler.is_compiling()
            and (x.requires_grad or any(p is not None and p.requires_grad for p in params)))


def _view(t: Tensor | None) -> Tensor | None:
    """``t`` as a view when it requires a gradient, so no input of a Function is a leaf when `_wanted` asks the engine
    about it (it cannot answer for a leaf inside ``autograd.grad``)."""
    return t.view_as(t) if t is not None and t.requires_grad else t


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
        if _wanted(ctx, 0):
            gx = _InputGrad.apply(_view(gy), w, x.shape, geometry)
        gw = geometry.weight_grad(x, w.shape, gy) if _wanted(ctx, 1) else None
        gb = gy.sum((0, 2, 3)) if ctx.has_bias and _wanted(ctx, 2) else None
        return gx, gw, gb, None


class Conv2d(nn.Conv2d):
    """``nn.Conv2d`` (same parameters and state-dict keys) whose derivatives are `_Conv`'s where `_recording` holds;
    ``nn.Conv2d``'s own forward otherwise, and for a padding mode other than zeros."""

    def filter(self) -> Tensor:
        """The convolution's weights as applied (a subclass may transform them)."""
        return self.weight

    def forward(self, x: Tensor) -> Tensor:
        """The convolution of ``x`` ``(B, C, H, W)``."""
        w, b = self.filter(), self.bias
        if not _recording(x, w, b) or self.padding_mode != "zeros" or isinstance(self.padding, str):
            return self._conv_forward(x, w, b)  # nn.Conv2d's own (which pads a non-zero padding mode itself)
        device = x.device.type
        if torch.is_autocast_enabled(device):  # as autocast runs conv2d: in its dtype, whatever the inputs'
            dtype = torch.get_autocast_dtype(device)
            x, w, b = x.to(dtype), w.to(dtype), (b.to(dtype) if b is not None else None)
        geometry = _Geometry(self.stride, self.padding, self.dilation, self.groups)
        with torch.autocast(device, enabled=False):
            return _Conv.apply(_view(x), _view(w), _view(b), geometry)


# Group normalisation. Within a group of M elements (a group's channels times the spatial size), with mean mu and
# r = 1 / sqrt(var + eps), x^ = (x - mu) r and g = gamma gy (gamma per channel), the input gradient is
#     gx = r (g - mean(g) - x^ mean(g x^)) = r P(g),
# where P(v) = v - mean(v) - x^ mean(v x^) is symmetric in v. Against an incoming u = dL/dgx:
#     dL/dgy    = gamma r P(u)
#     dL/dgamma = the sum over the batch and space of gy r P(u)
#     dL/dx     = -r^2 (x^ (mean(u g) - mean(u) mean(g) - 3 A B) + B (g - mean(g)) + A (u - mean(u))),
# with A = mean(g x^) and B = mean(u x^). The last follows from L = r M (mean(u g) - mean(u) mean(g) - A B),
# differentiated through r (dr/dx = -r^2 x^ / M) and through x^ (whose Jacobian applied to v is r P(v)).


def _group_sums(t: Tensor, groups: int) -> Tensor:
    """``(N, C)`` per-channel values summed over each group's channels: ``(N, G)``."""
    return t.view(t.shape[0], groups, -1).sum(2)


def _sums(a: Tensor, b: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """The sums over space of ``a`` and of ``a * b`` for each sample and channel of two ``(N, C, ...)`` tensors,
    ``(N, C)`` each in ``dtype``, in one pass: group normalisation's weight-gradient kernel with every sample's
    channel its own group, a mean of 0 and a scale of 1 computes exactly these, with the products and the sums in
    float32 or wider whatever the inputs' dtype (a product of two bfloat16 tensors would round each term)."""
    n, c = a.shape[:2]
    if a.device.type != "cpu":  # mixed dtypes (bfloat16 in, float32 gains) are the CPU kernel's; elsewhere, one dtype
        a, b = a.to(dtype), b.to(dtype)
    shape, groups = (1, n * c, a[0, 0].numel()), n * c
    zero = torch.zeros(1, groups, dtype=dtype, device=a.device)
    one = torch.ones(groups, dtype=dtype, device=a.device)
    _, s_ab, s_a = torch.ops.aten.native_group_norm_backward(a.reshape(shape), b.reshape(shape), zero, zero + 1, one,
                                                             *shape, groups, [False, True, True])
    return s_a.view(n, c), s_ab.view(n, c)


def _per_channel(t: Tensor, channels: int) -> Tensor:
    """``(N, G)`` per-group values repeated for each of a group's channels: ``(N, C)``."""
    n, groups = t.shape
    return t.unsqueeze(2).expand(n, groups, channels // groups).reshape(n, channels)


class _GroupNormInputGrad(torch.autograd.Function):
    """``gx = native_group_norm_backward(gy, x, ...)``, differentiable again by the closed forms above."""

    @staticmethod
    def forward(ctx, gy: Tensor, x: Tensor, w: Tensor | None, mean: Tensor, rstd: Tensor, groups: int) -> Tensor:
        ctx.save_for_backward(gy, x, w, mean, rstd)
        ctx.groups = groups
        n, c = x.shape[:2]
        return torch.ops.aten.native_group_norm_backward(gy, x, mean, rstd, w, n, c, x[0, 0].numel(), groups,
                                                         [True, False, False])[0]

    @staticmethod
    def backward(ctx, u: Tensor) -> tuple[Tensor | None, ...]:
        gy, x, w, mean, rstd = ctx.saved_tensors
        want_gy, want_x, want_w = _wanted(ctx, 0), _wanted(ctx, 1), w is not None and _wanted(ctx, 2)
        n, c = x.shape[:2]
        groups = ctx.groups
        m = x[0].numel() // groups
        dtype = torch.promote_types(x.dtype, torch.float32)  # sums and coefficients in float32 or wider

        def spread(t: Tensor) -> Tensor:  # (N, C) -> (N, C, 1, ...), to broadcast over space
            return t.view(n, c, *[1] * (x.dim() - 2))

        gamma = w.to(dtype) if w is not None else torch.ones(c, dtype=dtype, device=x.device)
        mu, r = mean.to(dtype).view(n, groups), rstd.to(dtype).view(n, groups)
        s_u, s_ux = _sums(u, x, dtype)
        u_mean = _group_sums(s_u, groups) / m
        b_term = r * (_group_sums(s_ux, groups) / m - mu * u_mean)  # B = mean(u x^)
        g_gy = g_x = g_w = None
        if want_gy:  # gamma r P(u) = gamma r u - gamma r^2 B x + gamma r (r B mu - mean(u))
            g_gy = torch.addcmul(spread(_per_channel(r * (r * b_term * mu - u_mean), c) * gamma),
                                 spread(_per_channel(-r * r * b_term, c) * gamma), x)
            g_gy = g_gy.addcmul_(spread(_per_channel(r, c) * gamma), u).to(gy.dtype)
        if want_x or want_w:
            (s_gy, s_gyx), (_, s_ugy) = _sums(gy, x, dtype), _sums(u, gy, dtype)
        if want_x:
            g_mean = _group_sums(gamma * s_gy, groups) / m
            a_term = r * (_group_sums(gamma * s_gyx, groups) / m - mu * g_mean)  # A = mean(g x^)
            k = _group_sums(gamma * s_ugy, groups) / m - u_mean * g_mean - 3 * a_term * b_term
            r2 = r * r
            # -r^2 (x^ k + B (g - mean(g)) + A (u - mean(u))), with x^ = r (x - mu) and g = gamma gy
            g_x = torch.addcmul(spread(_per_channel(r2 * (r * k * mu + b_term * g_mean + a_term * u_mean), c)),
                                spread(_per_channel(-r2 * r * k, c)), x)
            g_x = g_x.addcmul_(spread(_per_channel(-r2 * b_term, c) * gamma), gy)
            g_x = g_x.addcmul_(spread(_per_channel(-r2 * a_term, c)), u).to(x.dtype)
        if want_w:  # the sum over the batch of r (sum(u gy) - mean(u) sum(gy) - r B (sum(gy x) - mu sum(gy)))
            g_w = _per_channel(r, c) * (s_ugy - _per_channel(u_mean, c) * s_gy
                                        - _per_channel(r * b_term, c) * (s_gyx - _per_channel(mu, c) * s_gy))
            g_w = g_w.sum(0).to(w.dtype)
        return g_gy, g_x, g_w, None, None, None


class _GroupNorm(torch.autograd.Function):
    """``native_group_norm(x, w, b)`` whose input gradient is `_GroupNormInputGrad` while the backward pass records
    a graph."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor | None, b: Tensor | None, groups: int, eps: float) -> Tensor:
        n, c = x.shape[:2]
        y, mean, rstd = torch.native_group_norm(x, w, b, n, c, x[0, 0].numel(), groups, eps)
        ctx.save_for_backward(x, w, mean, rstd)
        ctx.groups, ctx.eps = groups, eps
        return y

    @staticmethod
    def backward(ctx, gy: Tensor) -> tuple[Tensor | None, ...]:
        x, w, mean, rstd = ctx.saved_tensors
        want = [_wanted(ctx, i) for i in range(3)]
        n, c = x.shape[:2]
        groups = ctx.groups
        if not torch.is_grad_enabled():  # a backward pass that records nothing: the backend's kernel for all three
            gx, gw, gb = torch.ops.aten.native_group_norm_backward(gy, x, mean, rstd, w, n, c, x[0, 0].numel(),
                                                                   groups, want)
            return gx, gw, gb, None, None
        gx = _GroupNormInputGrad.apply(_view(gy), x, w, mean, rstd, groups) if want[0] else None
        gw = gb = None
        if want[1] or want[2]:  # differentiable: gamma's gradient is the sum of gy x^, beta's the sum of gy
            grouped = x.reshape(n, groups, -1)
            var, mu = torch.var_mean(grouped, -1, correction=0, keepdim=True)
            x_hat = ((grouped - mu) * (var + ctx.eps).rsqrt()).reshape(x.shape)
            dims = [0, *range(2, x.dim())]
            gw = (gy * x_hat).sum(dims).to(w.dtype) if want[1] else None
            gb = gy.sum(dims).to(w.dtype) if want[2] else None
        return gx, gw, gb, None, None


@functools.cache
def _group_norm_dtype(device: str, autocast_dtype: torch.dtype, dtype: torch.dtype) -> torch.dtype:
    """The dtype ``F.group_norm`` computes in under autocast to ``autocast_dtype`` for an input of ``dtype`` (CUDA's
    autocast runs it in float32; the CPU's leaves the input's)."""
    with torch.autocast(device, dtype=autocast_dtype):
        return F.group_norm(torch.zeros(1, 1, 2, dtype=dtype, device=device), 1).dtype


class GroupNorm(nn.GroupNorm):
    """``nn.GroupNorm`` (same parameters and state-dict keys) whose derivatives are `_GroupNorm`'s where
    `_recording` holds; ``nn.GroupNorm``'s own forward otherwise."""

    def forward(self, x: Tensor) -> Tensor:
        """Group normalisation of ``x`` ``(N, C, ...)``."""
        w, b = self.weight, self.bias
        if not _recording(x, w, b):
            return super().forward(x)
        device = x.device.type
        if torch.is_autocast_enabled(device):  # in the dtype autocast runs group_norm in
            x = x.to(_group_norm_dtype(device, torch.get_autocast_dtype(device), x.dtype))
        with torch.autocast(device, enabled=False):
            return _GroupNorm.apply(_view(x), _view(w), _view(b), self.num_groups, self.eps)


class _SiLUGrad(torch.autograd.Function):
    """``silu_backward(gy, x) = gy silu'(x)``; its derivatives are ``u silu'(x)`` in ``gy`` and ``u gy silu''(x)`` in
    ``x``."""

    @staticmethod
    def forward(ctx, gy: Tensor, x: Tensor) -> Tensor:
        ctx.save_for_backward(gy, x)
        return torch.ops.aten.silu_backward(gy, x)

    @staticmethod
    def backward(ctx, u: Tensor) -> tuple[Tensor | None, ...]:
        gy, x = ctx.saved_tensors
        g_gy = torch.ops.aten.silu_backward(u, x) if _wanted(ctx, 0) else None
        g_x = None
        if _wanted(ctx, 1):  # u gy s (1 - s) (2 + x (1 - 2 s))
            s = torch.sigmoid(x)
            g_x = torch.ops.aten.sigmoid_backward(u * gy, s).mul_(torch.addcmul(x, x, s, value=-2).add_(2))
        return g_gy, g_x


class _SiLU(torch.autograd.Function):
    """``silu(x)`` whose input gradient is `_SiLUGrad` while the backward pass records a graph."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        return F.silu(x)

    @staticmethod
    def backward(ctx, gy: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        if not torch.is_grad_enabled():
            return torch.ops.aten.silu_backward(gy, x)
        return _SiLUGrad.apply(_view(gy), x)


def silu(x: Tensor) -> Tensor:
    """``x * sigmoid(x)``: with `_SiLU`'s derivatives where `_recording` holds, ``F.silu`` otherwise."""
    if not _recording(x):
        return F.silu(x)
    return _SiLU.apply(_view(x))
