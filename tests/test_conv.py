"""`composable_ebm.nets.conv.Conv2d`: its own first and second derivatives equal autograd's, in float64 exactly
enough for gradcheck, in float32 within 1e-5 on the losses that train the shipped networks, and it computes only the
gradients a backward pass asks for."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from composable_ebm.nets import conv as conv_module
from composable_ebm.nets.conv import Conv2d, native_conv_grad, second_derivatives, use_native_conv_grad
from composable_ebm.nets.unet import DenoisingUNetConfig, DenoisingUNetEnergy
from composable_ebm.training.denoising import DenoisingObjective


@pytest.fixture(autouse=True)
def _restore_setting():
    before = conv_module._setting
    yield
    conv_module._setting = before


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
    use_native_conv_grad(True)
    layer = Conv2d(4, 6, 3, **geometry).double()
    geo = conv_module._Geometry(layer.stride, layer.padding, layer.dilation, layer.groups)
    x = torch.randn(2, 4, 7, 7, dtype=torch.float64, requires_grad=True)
    w = layer.weight.detach().clone().requires_grad_(True)
    b = layer.bias.detach().clone().requires_grad_(True)

    def conv(x, w, b):  # the functional form, so gradcheck perturbs the weights and the bias too
        return conv_module._Conv.apply(x.view_as(x), w.view_as(w), b.view_as(b), geo)

    assert torch.autograd.gradcheck(conv, (x, w, b))
    assert torch.autograd.gradgradcheck(conv, (x, w, b))
    # the module's forward is conv2d itself
    assert torch.equal(layer(x), F.conv2d(x, layer.weight, layer.bias, layer.stride, layer.padding, layer.dilation,
                                          layer.groups))


def _denoising_grads(native: bool, dtype: torch.dtype | None = None) -> tuple[float, torch.Tensor]:
    use_native_conv_grad(native)
    torch.manual_seed(0)
    config = DenoisingUNetConfig(image_size=8, channels=(8, 16), embedding=16, groups=4, attributes={"a": ("x", "y")},
                                 null_condition=True)
    model = DenoisingUNetEnergy(config)
    for p in model.parameters():  # FiLM starts at zero: draw the dense layers' weights, so every one has a gradient
        if p.ndim == 2:
            torch.nn.init.normal_(p, std=0.2)
    objective = DenoisingObjective(model)
    x = torch.rand(6, 3, 8, 8)
    labels = {"a": torch.tensor([0, 1, -1, 0, 1, -1])}
    with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
        out = objective(x, labels, torch.Generator().manual_seed(1))
    out.loss.backward()
    return out.loss.item(), torch.cat([p.grad.flatten() for p in model.parameters()])


def test_the_denoising_loss_reaches_autograds_gradients():
    """The denoising loss (an input gradient differentiated again) of a U-Net energy, float32: the same loss, and
    parameter gradients within 1e-5 (relative) of autograd's own formulas."""
    loss_native, grads_native = _denoising_grads(True)
    loss_autograd, grads_autograd = _denoising_grads(False)
    assert loss_native == loss_autograd
    assert _rel(grads_native, grads_autograd) < 1e-5


def test_under_autocast_the_convolution_runs_at_autocasts_dtype():
    """In bfloat16 autocast the convolution's output is bfloat16, as conv2d's is, and the denoising loss's
    gradients agree with autograd's in bfloat16 within 1e-2 (bfloat16's rounding), and are no further from float32's
    than autograd's bfloat16 gradients are."""
    use_native_conv_grad(True)
    layer = Conv2d(3, 4, 3, padding=1)
    x = torch.rand(2, 3, 8, 8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16), second_derivatives():
        assert layer(x).dtype == torch.bfloat16
        assert type(layer(x).grad_fn).__name__ == "_ConvBackward"
    _, native = _denoising_grads(True, torch.bfloat16)
    _, stock = _denoising_grads(False, torch.bfloat16)
    _, full = _denoising_grads(False)
    assert _rel(native, stock) < 1e-2
    assert _rel(native, full) < 1.25 * _rel(stock, full)  # no further from float32 than autograd's bfloat16


def test_taking_only_the_input_gradient_runs_no_weight_gradient(monkeypatch):
    """``autograd.grad`` of the energy in the input alone (as the samplers and the first pass of the denoising loss
    take it) computes no weight gradient; ``backward()`` computes them."""
    use_native_conv_grad(True)
    calls = []
    real = conv_module.conv2d_weight
    monkeypatch.setattr(conv_module, "conv2d_weight", lambda *a, **k: calls.append(1) or real(*a, **k))
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
    use_native_conv_grad(True)
    layer = Conv2d(3, 4, 3, padding=1)
    x = torch.rand(2, 3, 8, 8, requires_grad=True)
    assert type(layer(x).grad_fn).__name__ == "ConvolutionBackward0"
    with second_derivatives():
        assert type(layer(x).grad_fn).__name__ == "_ConvBackward"
    assert type(layer(x).grad_fn).__name__ == "ConvolutionBackward0"


def test_the_setting_defaults_to_the_cpu_and_refuses_other_values():
    """On the CPU only by default; True, False and 'cpu' switch it; anything else is one line naming the choices."""
    use_native_conv_grad("cpu")
    assert native_conv_grad("cpu") and not native_conv_grad("cuda")
    use_native_conv_grad(True)
    assert native_conv_grad("cuda")
    use_native_conv_grad(False)
    assert not native_conv_grad("cpu")
    with pytest.raises(ValueError, match=r"True, False or 'cpu'"):
        use_native_conv_grad("gpu")


def test_an_unknown_environment_setting_is_one_line_naming_the_choices():
    """``CEBM_NATIVE_CONV_GRAD`` other than 0, 1 or cpu stops the import of the networks with one line that names
    them."""
    result = subprocess.run([sys.executable, "-c", "import composable_ebm.nets"], capture_output=True, text=True,
                            env={**os.environ, "CEBM_NATIVE_CONV_GRAD": "yes"}, timeout=120)
    assert result.returncode != 0
    assert "CEBM_NATIVE_CONV_GRAD='yes' is not a valid setting; valid choices: ['0', '1', 'cpu']" in result.stderr


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
    use_native_conv_grad(True)
    stock = torch.nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect")
    ours = Conv2d(3, 4, 3, padding=1, padding_mode="reflect")
    ours.load_state_dict(stock.state_dict())
    x = torch.rand(2, 3, 8, 8, requires_grad=True)
    with second_derivatives() if inside else contextlib.nullcontext():
        assert torch.equal(ours(x), stock(x))
