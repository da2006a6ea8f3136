"""The Energy contract and its algebra: identities on values and on input gradients."""

from __future__ import annotations

import math

import pytest
import torch

from composable_ebm import Disjunction, Energy, GaussianEnergy, MLPConfig, MLPEnergy, ResNetEnergy, WeightedSum
from tests.conftest import tiny_config


def randomize(model: torch.nn.Module) -> torch.nn.Module:
    """Give every parameter random values so zero-initialised parts (FiLM, attention gain) matter."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


@pytest.fixture
def parts():
    a = randomize(MLPEnergy(MLPConfig(name="a", hidden=16, depth=2)))
    b = randomize(MLPEnergy(MLPConfig(name="b", hidden=16, depth=2)))
    c = GaussianEnergy(torch.tensor([1.0, -1.0]), torch.eye(2), name="c")
    return a, b, c


def values_and_grads(energy: Energy, x: torch.Tensor):
    e, g = energy.energy_and_grad(x)
    return e, g


def test_sum_weights_negation_temperature_match_explicit_values_and_gradients(parts):
    """Every operator equals the explicit formula, for values and for dE/dx."""
    a, b, c = parts
    x = torch.randn(7, 2)
    ea, ga = values_and_grads(a, x)
    eb, gb = values_and_grads(b, x)
    ec, gc = values_and_grads(c, x)
    cases = {
        "a + b": (a + b, ea + eb, ga + gb),
        "2.5 * a": (2.5 * a, 2.5 * ea, 2.5 * ga),
        "a * -0.5": (a * -0.5, -0.5 * ea, -0.5 * ga),
        "a - b": (a - b, ea - eb, ga - gb),
        "a - 0.3 * b": (a - 0.3 * b, ea - 0.3 * eb, ga - 0.3 * gb),
        "-a": (-a, -ea, -ga),
        "a / 4": (a / 4, ea / 4, ga / 4),
        "sum": (sum([a, b, c]), ea + eb + ec, ga + gb + gc),
        "nested": ((a + b) + 2 * (c - b), ea + eb + 2 * ec - 2 * eb, ga + gb + 2 * gc - 2 * gb),
    }
    for label, (energy, e_ref, g_ref) in cases.items():
        assert isinstance(energy, Energy), label
        e, g = energy.energy_and_grad(x)
        torch.testing.assert_close(e, e_ref, msg=label)
        torch.testing.assert_close(g, g_ref, msg=label)


def test_disjunction_is_negative_logsumexp_and_its_gradient_is_the_softmin_mixture(parts):
    a, b, c = parts
    x = torch.randn(9, 2)
    ea, ga = values_and_grads(a, x)
    eb, gb = values_and_grads(b, x)
    e, g = (a | b).energy_and_grad(x)
    torch.testing.assert_close(e, -torch.logaddexp(-ea, -eb))
    w = torch.softmax(torch.stack([-ea, -eb], 1), dim=1)  # responsibilities
    torch.testing.assert_close(g, w[:, :1] * ga + w[:, 1:] * gb)
    # nested disjunctions flatten and equal the three-way logsumexp
    ec, _ = values_and_grads(c, x)
    abc = (a | b) | c
    assert isinstance(abc, Disjunction) and len(abc.terms) == 3
    torch.testing.assert_close(abc(x), -torch.logsumexp(-torch.stack([ea, eb, ec], 1), 1))


def test_disjunction_of_identical_energies_shifts_by_log2(parts):
    a, _, _ = parts
    x = torch.randn(5, 2)
    torch.testing.assert_close((a | a)(x), a(x) - math.log(2.0))


def test_nested_sums_flatten_into_one_node(parts):
    a, b, c = parts
    expr = (a + b) + 2.0 * (c - 0.5 * b)
    assert isinstance(expr, WeightedSum)
    assert expr.num_models == 4
    assert expr.weights == (1.0, 1.0, 2.0, -1.0)
    assert all(not isinstance(t, WeightedSum) for t in expr.terms)


def test_composites_print_their_expression(color_model, shape_model):
    red = color_model.condition(color="red")
    circle = shape_model.condition(shape="circle")
    assert repr(red + 2.0 * circle) == "(color[red] + 2.0 * shape[circle])"
    assert repr(red - 0.5 * circle) == "(color[red] - 0.5 * shape[circle])"
    assert repr(red | circle) == "(color[red] | shape[circle])"
    assert repr(red / 2) == "(0.5 * color[red])"


def test_condition_binds_attribute_and_matches_per_item_labels(color_model):
    randomize(color_model)
    x = torch.rand(4, 3, 8, 8)
    blue = color_model.condition(color="blue")
    by_index = color_model.condition(color=2)
    per_item = color_model(x, {"color": torch.tensor([2, 2, 2, 2])})
    torch.testing.assert_close(blue(x), per_item)
    torch.testing.assert_close(by_index(x), per_item)
    # different values give different energies once FiLM is non-trivial
    assert not torch.allclose(color_model.condition(color="red")(x), blue(x))
    # per-item conditioning through condition() with a tensor
    labels = torch.tensor([0, 1, 2, 0])
    torch.testing.assert_close(color_model.condition(color=labels)(x), color_model(x, {"color": labels}))
    assert blue.attributes == {}


def test_condition_errors_name_the_valid_choices(color_model):
    with pytest.raises(ValueError, match=r"valid attributes: \['color'\]"):
        color_model.condition(shape="circle")
    with pytest.raises(ValueError, match=r"valid values: \['red', 'green', 'blue'\]"):
        color_model.condition(color="purple")
    with pytest.raises(ValueError, match="out of range"):
        color_model.condition(color=3)
    with pytest.raises(ValueError, match="outside 0..2"):
        color_model(torch.rand(2, 3, 8, 8), {"color": torch.tensor([0, 5])})
    unconditional = ResNetEnergy(tiny_config())
    with pytest.raises(ValueError, match="not conditional"):
        unconditional.condition(color="red")


def test_composing_different_input_shapes_names_both_shapes(parts, color_model):
    a, _, _ = parts
    with pytest.raises(ValueError, match=r"\(2,\).*\(3, 8, 8\)"):
        a + color_model
    with pytest.raises(ValueError, match="different input shapes"):
        a | color_model
    with pytest.raises(ValueError, match="different input shapes"):
        a - 0.5 * color_model


def test_wrong_input_and_output_shapes_are_reported():
    class Bad(Energy):
        def energy(self, x, labels):
            return x.sum(dim=1, keepdim=True)  # (B, 1): wrong

    bad = Bad((2,), value_range=None)
    with pytest.raises(ValueError, match=r"must return energies of shape \(3,\).*got \(3, 1\)"):
        bad(torch.zeros(3, 2))
    good = GaussianEnergy(torch.zeros(2), torch.eye(2))
    with pytest.raises(ValueError, match=r"expects a batch of shape \(B, 2\), got \(3, 5\)"):
        good(torch.zeros(3, 5))


def test_invalid_weights_and_temperatures_are_rejected(parts):
    a, _, _ = parts
    with pytest.raises(ValueError, match="temperature"):
        a / 0
    with pytest.raises(ValueError, match="temperature"):
        a / -1.0
    with pytest.raises(ValueError, match="finite"):
        a * float("nan")
    with pytest.raises(TypeError):
        a + 1.0  # adding a constant is not an energy operation


def test_score_is_minus_grad_and_leaves_parameter_grads_untouched(color_model):
    randomize(color_model)
    x = torch.rand(3, 3, 8, 8)
    flags = [p.requires_grad for p in color_model.parameters()]
    s = color_model.score(x)
    assert all(p.grad is None for p in color_model.parameters())
    assert [p.requires_grad for p in color_model.parameters()] == flags
    # finite-difference check of one coordinate
    eps = 1e-3
    d = torch.zeros_like(x)
    d[0, 1, 2, 3] = eps
    with torch.no_grad():
        fd = (color_model(x + d) - color_model(x - d))[0] / (2 * eps)
    assert abs(float(-s[0, 1, 2, 3]) - float(fd)) < 1e-2 * max(1.0, abs(float(fd)))


def test_score_works_inside_no_grad(parts):
    a, _, _ = parts
    x = torch.randn(4, 2)
    with torch.no_grad():
        s = a.score(x)
    torch.testing.assert_close(s, -a.energy_and_grad(x)[1])


def test_device_follows_parameters_or_buffers_and_defaults_to_cpu(parts):
    a, _, c = parts
    assert a.device == next(a.parameters()).device  # parameters
    assert c.device == c.mean.device  # buffers only
    assert (a + c).device == a.device  # composites see their parts' tensors

    class Empty(Energy):
        def energy(self, x, labels):
            return x.sum(1)

    assert Empty((2,), value_range=None).device == torch.device("cpu")


class _Means(Energy):
    """A conditional energy with no network: ``|x - mean[color]|^2 / 2``."""

    def __init__(self) -> None:
        super().__init__((2,), value_range=None, attributes={"color": ("red", "green", "blue")})
        self.register_buffer("means", torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 0.0]]))

    def energy(self, x, labels):
        return 0.5 * ((x - self.means[labels["color"].clamp(min=0)]) ** 2).sum(dim=1)


def _read_backs(monkeypatch) -> list[int]:
    """A counter of the values read back from tensors to Python (on a GPU, each waits for the device)."""
    count = [0]

    def counted(read):
        def wrapper(self):
            count[0] += 1
            return read(self)
        return wrapper

    for name in ("tolist", "item", "__int__", "__float__"):
        monkeypatch.setattr(torch.Tensor, name, counted(getattr(torch.Tensor, name)))
    return count


@pytest.mark.parametrize("steps", [5, 25])
def test_a_chain_checks_its_labels_once_not_at_every_step(monkeypatch, steps):
    """The label indices' range check reads a labels tensor back once: a chain of 5 steps and one of 25 read the
    same number of values back (before, every energy evaluation read the smallest and largest index)."""
    from composable_ebm.sampling import SamplerConfig, algorithm2

    energy, labels = _Means(), {"color": torch.tensor([0, 1, 2, 1])}
    count = _read_backs(monkeypatch)
    algorithm2(energy, torch.zeros(4, 2), SamplerConfig(step_size=0.1, noise=0.01, steps=steps, clamp=False),
              torch.Generator().manual_seed(0), labels)
    assert count[0] == 1


def test_a_labels_tensor_changed_in_place_after_its_check_is_checked_again():
    energy, labels = _Means(), torch.tensor([0, 1, 2, 1])
    x = torch.zeros(4, 2)
    energy(x, {"color": labels})
    labels[2] = 3  # the same tensor, now out of range
    with pytest.raises(ValueError, match=r"outside 0..2.*valid values: \['red', 'green', 'blue'\]"):
        energy(x, {"color": labels})
    for bad in (5, torch.tensor(5), torch.tensor([0, -2, 1, 1])):  # an integer, a 0-d tensor, below the null index
        with pytest.raises(ValueError, match="outside 0..2"):
            energy(x, {"color": bad})
    torch.testing.assert_close(energy(x, {"color": 1}), energy(x, {"color": torch.tensor(1)}))
