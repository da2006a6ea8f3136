"""`composable_ebm.accel.derivatives`: `Conv2d`'s, `GroupNorm`'s and `silu`'s own first and second derivatives
equal autograd's, in float64 exactly enough for gradcheck, in float32 within 1e-5 on the loss that trains the shipped
noise-conditioned networks, and they compute only the gradients a backward pass asks for."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

from composable_ebm.accel import derivatives
from composable_ebm.accel.derivatives import Conv2d, GroupNorm, second_derivatives, silu
from composable_ebm.accel.settings import Speed
from composable_ebm.nets.unet import DenoisingUNetConfig, DenoisingUNetEnergy
from composable_ebm.training.denoising import DenoisingObjective


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("geometry", [
    dict(stride=1, padding=1),
    dict(stride=2, padding=1),
    dict(stride=1, padding=2, dilation=2),
    dict(stride=1, padding=0, groups=2),
])
def test_first_and_second_derivatives_pass_gradcheck(geometry):
    """gradcheck and gradgradcheck (finite differences, float64) of the convolution with its own derivatives, for
    strides, dilation and groups: the input gradient and its derivatives in the input, the weights and the bias."""
    layer = Conv2d(4, 4, 3, **geometry).double()
    geo = derivatives._Geometry(layer.stride, layer.padding, layer.dilation, layer.groups)
    x = torch.randn(2, 4, 5, 5, dtype=torch.float64, requires_grad=True)
    w = layer.weight.detach().clone().requires_grad_(True)
    b = layer.bias.detach().clone().requires_grad_(True)

    def conv(x, w, b):  # the functional form, so gradcheck perturbs the weights and the bias too
        return derivatives._Conv.apply(x.view_as(x), w.view_as(w), b.view_as(b), geo)

    assert torch.autograd.gradcheck(conv, (x, w, b))
    assert torch.autograd.gradgradcheck(conv, (x, w, b))
    # the module's forward is conv2d itself
    assert torch.equal(layer(x), F.conv2d(x, layer.weight, layer.bias, layer.stride, layer.padding, layer.dilation,
                                          layer.groups))


def _denoising_grads(native: bool, dtype: torch.dtype | None = None) -> tuple[float, torch.Tensor]:
    torch.manual_seed(0)
    config = DenoisingUNetConfig(image_size=8, channels=(8, 16), embedding=16, groups=4, attributes={"a": ("x", "y")},
                                 null_condition=True)
    model = DenoisingUNetEnergy(config)
    for p in model.parameters():  # FiLM starts at zero: draw the dense layers' weights, so every one has a gradient
        if p.ndim == 2:
            torch.nn.init.normal_(p, std=0.2)
    for m in model.modules():  # and the normalisations' gains and shifts, so no gain is 1 everywhere
        if isinstance(m, GroupNorm):
            torch.nn.init.normal_(m.weight, 1.0, 0.3)
            torch.nn.init.normal_(m.bias, 0.0, 0.3)
    objective = DenoisingObjective(model, own_derivatives="1" if native else "0")
    x = torch.rand(6, 3, 8, 8)
    labels = {"a": torch.tensor([0, 1, -1, 0, 1, -1])}
    with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
        out = objective(x, labels, torch.Generator().manual_seed(1))
    out.loss.backward()
    return out.loss.item(), torch.cat([p.grad.flatten() for p in model.parameters()])


def test_the_denoising_loss_reaches_autograds_gradients():
    """The denoising loss (an input gradient differentiated again) of a U-Net energy (convolutions, group
    normalisations and SiLUs), float32: the loss within 1e-6 (relative) of autograd's, and parameter gradients within
    1e-5. The loss holds the input gradient, which the two compute with different kernels (the layers' own backward
    against autograd's), so it agrees to float32's rounding (about 1e-7 per operation), not to the bit: 1.1709564924
    against 1.1709566116 on one CPU."""
    loss_native, grads_native = _denoising_grads(True)
    loss_autograd, grads_autograd = _denoising_grads(False)
    assert loss_native == pytest.approx(loss_autograd, rel=1e-6)
    assert _rel(grads_native, grads_autograd) < 1e-5


def test_under_autocast_the_convolution_runs_at_autocasts_dtype():
    """In bfloat16 autocast the convolution's output is bfloat16, as conv2d's is. The denoising loss's gradients in
    bfloat16 are no further from float32's than autograd's bfloat16 gradients are (about 5% here, bfloat16's
    rounding), and differ from those by less than half that distance."""
    layer = Conv2d(3, 4, 3, padding=1)
    x = torch.rand(2, 3, 8, 8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16), second_derivatives():
        assert layer(x).dtype == torch.bfloat16
        assert type(layer(x).grad_fn).__name__ == "_ConvBackward"
    _, native = _denoising_grads(True, torch.bfloat16)
    _, stock = _denoising_grads(False, torch.bfloat16)
    _, full = _denoising_grads(False)
    assert _rel(native, full) < 1.25 * _rel(stock, full)  # no further from float32 than autograd's bfloat16
    assert _rel(native, stock) < 0.5 * _rel(stock, full)


def test_taking_only_the_input_gradient_runs_no_weight_gradient(monkeypatch):
    """``autograd.grad`` of the energy in the input alone (as the samplers and the first pass of the denoising loss
    take it) computes no weight gradient; ``backward()`` computes them."""
    calls = []
    real = derivatives.conv2d_weight
    monkeypatch.setattr(derivatives, "conv2d_weight", lambda *a, **k: calls.append(1) or real(*a, **k))
    layer = Conv2d(3, 4, 3, padding=1)
    x = torch.rand(2, 3, 8, 8, requires_grad=True)
    with second_derivatives():
        (gx,) = torch.autograd.grad(layer(x).pow(2).sum(), x)
        assert not calls
        gx_stock = torch.autograd.grad(F.conv2d(x, layer.weight, layer.bias, padding=1).pow(2).sum(), x)[0]
        assert torch.allclose(gx, gx_stock, atol=1e-6)
        layer(x).pow(2).sum().backward()
    assert len(calls) == 1


def test_outside_second_derivatives_the_convolution_is_conv2d_itself():
    """A sampling chain's evaluations (first derivatives only) record conv2d's own backward node, with no Python-level
    derivatives; inside `second_derivatives()` the layer records its own."""
    layer = Conv2d(3, 4, 3, padding=1)
    x = torch.rand(2, 3, 8, 8, requires_grad=True)
    assert type(layer(x).grad_fn).__name__ == "ConvolutionBackward0"
    with second_derivatives():
        assert type(layer(x).grad_fn).__name__ == "_ConvBackward"
    assert type(layer(x).grad_fn).__name__ == "ConvolutionBackward0"


def test_the_setting_defaults_to_the_cpu_is_read_when_a_run_starts_and_refuses_other_values(monkeypatch):
    """On the CPU only by default; ``CEBM_OWN_DERIVATIVES`` is read when a run starts (`Speed.from_environment`), not
    at import; anything else is one line naming the choices. Inside `second_derivatives` the choice holds, outside it
    nothing records its own."""
    monkeypatch.delenv("CEBM_OWN_DERIVATIVES", raising=False)
    speed = Speed.from_environment()
    assert speed.own_derivatives_on("cpu") and not speed.own_derivatives_on("cuda")
    monkeypatch.setenv("CEBM_OWN_DERIVATIVES", "1")
    assert Speed.from_environment().own_derivatives_on("cuda")
    monkeypatch.setenv("CEBM_OWN_DERIVATIVES", "0")
    assert not Speed.from_environment().own_derivatives_on("cpu")
    monkeypatch.setenv("CEBM_OWN_DERIVATIVES", "yes")
    with pytest.raises(ValueError, match=r"CEBM_OWN_DERIVATIVES='yes' is not a valid setting; valid choices: \['0',"
                                         r" '1', 'cpu'\]"):
        Speed.from_environment()
    layer, x = Conv2d(3, 4, 3, padding=1), torch.rand(2, 3, 8, 8, requires_grad=True)
    with second_derivatives("0"):
        assert type(layer(x).grad_fn).__name__ == "ConvolutionBackward0"
        with second_derivatives("1"):
            assert type(layer(x).grad_fn).__name__ == "_ConvBackward"
        assert type(layer(x).grad_fn).__name__ == "ConvolutionBackward0"  # the outer choice again


def test_the_state_dict_keys_are_nn_conv2ds():
    """A `Conv2d` saves and loads as ``nn.Conv2d`` does, so models saved before it load unchanged."""
    stock = torch.nn.Conv2d(3, 4, 3, padding=1)
    ours = Conv2d(3, 4, 3, padding=1)
    ours.load_state_dict(stock.state_dict(), strict=True)
    x = torch.rand(2, 3, 8, 8)
    assert torch.equal(ours(x), stock(x))


@pytest.mark.parametrize("inside", [False, True])
def test_a_padding_mode_other_than_zeros_convolves_as_nn_conv2d_does(inside):
    """A reflect-padded `Conv2d` gives nn.Conv2d's output, in and out of `second_derivatives()` (it runs nn.Conv2d's
    own forward, which pads the input itself)."""
    stock = torch.nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect")
    ours = Conv2d(3, 4, 3, padding=1, padding_mode="reflect")
    ours.load_state_dict(stock.state_dict())
    x = torch.rand(2, 3, 8, 8, requires_grad=True)
    with second_derivatives() if inside else contextlib.nullcontext():
        assert torch.equal(ours(x), stock(x))


def _group_norm(groups: int):
    def apply(x, w, b):  # the functional form, so gradcheck perturbs the gains and shifts too
        views = [t.view_as(t) if t is not None else None for t in (x, w, b)]
        return derivatives._GroupNorm.apply(*views, groups, 1e-5)
    return apply


@pytest.mark.parametrize("shape, groups, affine", [
    ((2, 6, 3, 3), 3, True),
    ((2, 6, 3, 3), 2, False),
    ((3, 4, 5), 4, True),  # instance norm of a sequence
    ((4, 6), 3, True),  # features without space
])
def test_group_norm_derivatives_pass_gradcheck(shape, groups, affine):
    """gradcheck and gradgradcheck (float64) of group normalisation with its own derivatives, with and without
    gains and shifts, and on inputs other than images; the input's mean far from zero, as a convolution's output may
    be."""
    torch.manual_seed(0)
    x = (torch.randn(shape, dtype=torch.float64) * 2 + 3).requires_grad_(True)
    w = torch.randn(shape[1], dtype=torch.float64, requires_grad=True) if affine else None
    b = torch.randn(shape[1], dtype=torch.float64, requires_grad=True) if affine else None
    inputs = (x, w, b) if affine else (x,)
    fn = _group_norm(groups) if affine else (lambda x: _group_norm(groups)(x, None, None))
    assert torch.autograd.gradcheck(fn, inputs)
    assert torch.autograd.gradgradcheck(fn, inputs)


def test_silu_derivatives_pass_gradcheck():
    """gradcheck and gradgradcheck (float64) of SiLU with its own derivatives, over inputs of both signs."""
    x = torch.linspace(-6, 6, 25, dtype=torch.float64).view(5, 5).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: derivatives._SiLU.apply(x.view_as(x)), (x,))
    assert torch.autograd.gradgradcheck(lambda x: derivatives._SiLU.apply(x.view_as(x)), (x,))


def test_group_norm_and_silu_are_the_stock_layers_outside_and_their_own_inside():
    """Outside `second_derivatives()` (a sampling chain) `GroupNorm` and `silu` record the stock backward nodes;
    inside, their own, with outputs equal to the stock layers'."""
    layer, stock = GroupNorm(2, 4), torch.nn.GroupNorm(2, 4)
    torch.nn.init.normal_(layer.weight)
    stock.load_state_dict(layer.state_dict(), strict=True)
    x = torch.randn(2, 4, 5, 5, requires_grad=True)
    assert type(layer(x).grad_fn).__name__ == "NativeGroupNormBackward0"
    assert type(silu(x).grad_fn).__name__ == "SiluBackward0"
    with second_derivatives():
        assert type(layer(x).grad_fn).__name__ == "_GroupNormBackward"
        assert type(silu(x).grad_fn).__name__ == "_SiLUBackward"
        assert torch.equal(layer(x), stock(x))
        assert torch.equal(silu(x), F.silu(x))
        (gx,) = torch.autograd.grad(silu(layer(x)).pow(2).sum(), x)
    (gx_stock,) = torch.autograd.grad(F.silu(stock(x)).pow(2).sum(), x)
    assert torch.allclose(gx, gx_stock, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_under_autocast_group_norm_runs_in_the_dtype_autocast_gives_it(dtype):
    """Under bfloat16 autocast `GroupNorm` returns the dtype ``nn.GroupNorm`` returns there, for a bfloat16 input
    and for a float32 one, with the same values."""
    layer, stock = GroupNorm(2, 4), torch.nn.GroupNorm(2, 4)
    x = torch.randn(2, 4, 5, 5, dtype=dtype, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = stock(x)
        with second_derivatives():
            out = layer(x)
    assert type(out.grad_fn).__name__ == "_GroupNormBackward"
    assert out.dtype == expected.dtype
    assert torch.equal(out, expected)


def test_group_norm_of_a_channels_last_input_matches_autograds_second_derivatives():
    """A channels-last input (not contiguous in the channels-first layout): the input and gain gradients
    differentiated again, in the input and in the gains and shifts, equal autograd's."""
    torch.manual_seed(0)
    layer = GroupNorm(2, 4).double()
    torch.nn.init.normal_(layer.weight)
    x = torch.randn(3, 4, 5, 5, dtype=torch.float64).contiguous(memory_format=torch.channels_last).requires_grad_(True)

    def grads(own: bool) -> list[torch.Tensor]:
        with second_derivatives("1" if own else "0"):
            gx, gw = torch.autograd.grad(layer(x).sin().sum(), (x, layer.weight), create_graph=True)
            return list(torch.autograd.grad(gx.pow(2).sum() + gw.pow(2).sum(), (x, layer.weight, layer.bias)))

    for own, stock in zip(grads(True), grads(False), strict=True):
        assert torch.allclose(own, stock, atol=1e-10)
