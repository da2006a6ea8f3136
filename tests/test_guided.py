"""The null condition (label dropout) and guided composition E_0 + sum_i w_i (E_i(x|c_i) - E_i(x|0))."""

from __future__ import annotations

import pytest
import torch

from composable_ebm import NULL, ContrastiveConfig, Guided, ResNetEnergy, Trainer, TrainerConfig, guided, shapes
from composable_ebm.errors import InvalidInputError
from composable_ebm.expression import parse_expression
from composable_ebm.pipeline import composed, default_settings
from composable_ebm.sampling import SamplerConfig, SamplingDefaults
from tests.conftest import tiny_config
from tests.test_energy import randomize


def model(name: str, attribute: str, values: tuple[str, ...], null: bool = True) -> ResNetEnergy:
    return randomize(ResNetEnergy(tiny_config(name=name, attributes={attribute: values}, null_condition=null)))


@pytest.fixture
def color():
    return model("color", "color", ("red", "green", "blue"))


@pytest.fixture
def shape():
    return model("shape", "shape", ("circle", "square", "triangle"))


def test_guided_energy_is_the_null_energy_plus_weighted_conditional_differences(color, shape):
    x = torch.rand(5, 3, 8, 8)
    null = torch.full((5,), NULL)
    g = guided(color.condition(color="red") + shape.condition(shape="circle") - 0.5 * shape.condition(shape="square"))
    e_null_color, e_null_shape = color(x, {"color": null}), shape(x, {"shape": null})
    want = (
        (e_null_color + e_null_shape + e_null_shape) / 3  # the mean of the three terms' unconditional energies
        + (color(x, {"color": torch.zeros(5, dtype=torch.long)}) - e_null_color)
        + (shape(x, {"shape": torch.zeros(5, dtype=torch.long)}) - e_null_shape)
        - 0.5 * (shape(x, {"shape": torch.ones(5, dtype=torch.long)}) - e_null_shape)
    )
    torch.testing.assert_close(g(x), want, rtol=1e-5, atol=1e-6)
    assert isinstance(g, Guided) and g.expression() == "guided(color[red] + shape[circle] - 0.5 * shape[square])"


def test_an_unbound_model_is_its_unconditional_energy(color):
    x = torch.rand(3, 3, 8, 8)
    torch.testing.assert_close(color(x), color(x, {"color": torch.full((3,), NULL)}))


def test_each_guided_term_is_one_network_call_on_a_doubled_batch(color, shape):
    calls: list[int] = []
    for m in (color, shape):
        m.register_forward_hook(lambda mod, args, out: calls.append(args[0].shape[0]))
    guided(color.condition(color="red") + shape.condition(shape="circle"))(torch.rand(4, 3, 8, 8))
    assert calls == [8, 8]


def test_a_pixel_set_head_model_runs_its_towers_once_per_guided_term(shape):
    """Its towers are unconditional, so E(x | c) and E(x | 0) share one tower pass on B images, and the
    guided energy equals the explicit formula."""
    color = randomize(ResNetEnergy(tiny_config(name="color", attributes={"color": ("red", "green", "blue")},
                                               null_condition=True, input_transforms=("channel-sort",),
                                               condition_head="pixel_set")))
    x, null = torch.rand(4, 3, 8, 8), torch.full((4,), NULL)
    g = guided(color.condition(color="blue") + shape.condition(shape="circle"))
    e_null, e_null_shape = color(x, {"color": null}), shape(x, {"shape": null})
    want = (e_null + e_null_shape) / 2 + (color(x, {"color": torch.full((4,), 2)}) - e_null) + (
        shape(x, {"shape": torch.zeros(4, dtype=torch.long)}) - e_null_shape)
    batches: list[int] = []
    heads: list[int] = []
    color.towers[0].register_forward_hook(lambda mod, args, out: batches.append(args[0].shape[0]))
    color.head.register_forward_hook(lambda mod, args, out: heads.append(args[0].shape[0]))
    torch.testing.assert_close(g(x), want, rtol=1e-5, atol=1e-6)
    assert batches == [4] and heads == [4]


@pytest.mark.parametrize("late", [{"film_blocks": 1}, {"condition_head": "projection"}], ids=["late-film", "projection"])
def test_a_late_conditioned_model_runs_its_shared_blocks_once_per_guided_term(color, late):
    """FiLM in the last block only, or a projection head: the blocks before the condition run once on B images,
    the rest on 2B, and the guided energy equals the explicit formula."""
    shape = randomize(ResNetEnergy(tiny_config(name="shape", attributes={"shape": ("circle", "square", "triangle")},
                                               null_condition=True, **late)))
    x, null = torch.rand(4, 3, 8, 8), torch.full((4,), NULL)
    g = guided(color.condition(color="blue") + shape.condition(shape="circle"))
    e_null_color, e_null = color(x, {"color": null}), shape(x, {"shape": null})
    assert not torch.allclose(shape(x, {"shape": torch.zeros(4, dtype=torch.long)}), e_null)  # the condition acts
    want = (e_null_color + e_null) / 2 + (color(x, {"color": torch.full((4,), 2)}) - e_null_color) + (
        shape(x, {"shape": torch.zeros(4, dtype=torch.long)}) - e_null)
    first, last = [], []
    shape.towers[0].blocks[0].register_forward_hook(lambda mod, args, out: first.append(args[0].shape[0]))
    shape.towers[0].blocks[-1].register_forward_hook(lambda mod, args, out: last.append(args[0].shape[0]))
    torch.testing.assert_close(g(x), want, rtol=1e-5, atol=1e-6)
    assert first == [4] and last == ([8] if "film_blocks" in late else [4])


def test_film_blocks_beyond_the_residual_blocks_is_one_clear_error():
    with pytest.raises(InvalidInputError, match="film_blocks must be an integer from 0"):
        tiny_config(attributes={"shape": ("circle", "square")}, film_blocks=9)


def test_a_models_guidance_scale_multiplies_its_terms_weight_in_the_guided_form(color, shape):
    """The pipeline builds guided(red + circle) with the shape model's guidance_scale 2 as guided(red + 2 * circle)
    with scale 1; the node's energy depends only on what it was built with."""
    x = torch.rand(4, 3, 8, 8)
    red, circle = color.condition(color="red"), shape.condition(shape="circle")
    shape.sampling_defaults = SamplingDefaults(SamplerConfig(steps=3))
    doubled = composed(red + 2 * circle)(x)
    shape.sampling_defaults = SamplingDefaults(SamplerConfig(steps=3), guidance_scale=2.0)
    scaled = composed(red + circle)
    assert scaled.scales == (1.0, 2.0) and guided(red + circle).scales == (1.0, 1.0)
    torch.testing.assert_close(scaled(x), doubled)
    assert not torch.allclose(composed(red + 2 * circle)(x), doubled)
    assert default_settings(scaled).guidance_scale == 1.0  # it acts in the term, not the chain
    shape.sampling_defaults = None
    torch.testing.assert_close(scaled(x), doubled)  # built with its scales: later changes to the model do not reach it


def test_guided_alone_samples_one_conditioned_model_with_classifier_free_guidance_at_its_scale(color):
    x = torch.rand(4, 3, 8, 8)
    red = color.condition(color="red")
    color.sampling_defaults = SamplingDefaults(SamplerConfig(steps=3), guidance_scale=3.0)
    assert composed(red) is red  # by default a model on its own is sampled as written
    color.sampling_defaults = SamplingDefaults(SamplerConfig(steps=3), guidance_scale=3.0, guided_alone=True)
    alone = composed(red)
    assert isinstance(alone, Guided) and alone.scales == (3.0,)
    null = color(x, {"color": torch.full((4,), NULL)})
    torch.testing.assert_close(alone(x), null + 3.0 * (red(x) - null))
    assert composed(red, "plain") is red
    torch.testing.assert_close(red.sample(2, seed=1), guided(red, lambda t: 3.0).sample(2, seed=1))
    flat = color.sampling_defaults.to_flat()
    assert flat["guided_alone"] is True and SamplingDefaults.from_flat(flat, ladder=False) == color.sampling_defaults
    assert "guided_alone" not in SamplingDefaults().to_flat()  # configs written before the setting stay as they were
    with pytest.raises(InvalidInputError, match="guided_alone must be true or false, got 'yes'"):
        SamplingDefaults.from_flat({**flat, "guided_alone": "yes"}, ladder=False)


def test_a_weight_or_temperature_on_a_model_drawn_guided_alone_scales_its_guidance(color):
    """``red / T`` of a model sampled guided on its own is its guided form with the guidance over ``T``,
    ``E(x | 0) + (s / T) (E(x | red) - E(x | 0))``, as a weight scales a term's guidance in a guided sum: ``T > 1``
    draws nearer the model's unconditional samples, ``T < 1`` pulls harder to the condition. The plain form stays
    as written."""
    x = torch.rand(4, 3, 8, 8)
    red = color.condition(color="red")
    color.sampling_defaults = SamplingDefaults(SamplerConfig(steps=3), guidance_scale=3.0, guided_alone=True)
    null = color(x, {"color": torch.full((4,), NULL)})
    for energy, w in ((red / 2, 0.5), (2 * red, 2.0), (red / 0.5, 2.0)):
        torch.testing.assert_close(composed(energy)(x), null + 3.0 * w * (red(x) - null))
        torch.testing.assert_close(composed(energy, "plain")(x), w * red(x))
    assert composed(-red, "auto") is not None and not isinstance(composed(-red), Guided)  # no floor: refused later


def test_a_plain_difference_that_negates_a_model_with_a_null_condition_is_one_line_naming_the_guided_form(color, shape):
    blue, square = color.condition(color="blue"), shape.condition(shape="square")
    for energy in (blue - square, blue - 0.5 * square, blue + shape.condition(shape="circle") - 2 * square):
        with pytest.raises(InvalidInputError, match=r"negates shape\[square\] in the plain form.*valid choices: form"
                                                    r" 'auto' or 'guided'"):
            energy.sample(2, seed=0, steps=1, form="plain")
        energy.sample(2, seed=0, steps=1)  # the default, guided form negates only what the model says about squares
    plain = model("shape", "shape", ("circle", "square", "triangle"), null=False)
    (blue - 0.5 * plain.condition(shape="square")).sample(2, seed=0, steps=1, form="plain")  # no guided form: as written


def test_a_model_without_a_null_condition_refuses_to_be_sampled_unbound_or_guided():
    plain = model("color", "color", ("red", "green", "blue"), null=False)
    with pytest.raises(InvalidInputError, match=r"without a null condition.*color\[color=\.\.\.\]"):
        plain.sample(2, seed=0, steps=1)
    with pytest.raises(ValueError, match="null condition"):
        guided(plain.condition(color="red"))
    with pytest.raises(InvalidInputError, match="null condition"):
        parse_expression("guided(color[color=red])", lambda name: plain)
    plain.condition(color="red").sample(2, seed=0, steps=1)  # bound: fine


def test_guided_expression_parses_weights_and_negation(color, shape):
    models = {"color": color, "shape": shape}
    e = parse_expression("guided(color[color=blue] - 0.5 * shape[shape=square])", models.__getitem__)
    assert isinstance(e, Guided) and e.weights == (1.0, -0.5)
    assert e.expression() == "guided(color[blue] - 0.5 * shape[square])"
    # guided composites sample like any energy
    color.sampling_defaults = SamplingDefaults(SamplerConfig(step_size=1.0, steps=2))
    assert e.sample(2, seed=0).shape == (2, 3, 8, 8)


def test_label_dropout_unbinds_that_fraction_of_positives_and_their_chains():
    data = shapes(400, size=8, seed=0).select_attributes(["color"])
    energy = ResNetEnergy(tiny_config(attributes=data.attributes, null_condition=True))
    config = TrainerConfig(steps=1, batch_size=4000, label_dropout=0.1,
                           objective=ContrastiveConfig(sampler=SamplerConfig(step_size=1.0, steps=1)))
    trainer = Trainer(energy, data, config)
    _, labels = trainer.positives(4000)
    dropped = float((labels["color"] == NULL).float().mean())
    assert 0.08 < dropped < 0.12
    _, chain_labels = trainer.objective._chain_starts(4000, labels)
    assert torch.equal(chain_labels["color"], labels["color"])


def test_the_guided_energy_does_not_depend_on_the_order_of_its_terms(color, shape):
    x = torch.rand(4, 3, 8, 8)
    red, circle = color.condition(color="red"), shape.condition(shape="circle")
    torch.testing.assert_close(guided(red + circle)(x), guided(circle + red)(x))


def test_a_model_sampled_on_its_own_runs_its_alone_settings_and_a_composite_its_shared_ones(color, shape):
    """``SamplingDefaults.alone`` replaces sampler fields for the model on its own, conditioned or not, plain or
    guided; a composite that holds it runs the shared settings."""
    from composable_ebm.pipeline import plan
    from composable_ebm.sampling import LadderConfig

    ladder = LadderConfig(levels=4, sigma_min=0.1, sigma_max=1.0, first_steps=5, steps=3, step_size=0.5)
    color.sampling_defaults = SamplingDefaults(ladder, guided_alone=True, alone={"steps": 7, "first_steps": 20})
    shape.sampling_defaults = SamplingDefaults(SamplerConfig(steps=2))
    red, circle = color.condition(color="red"), shape.condition(shape="circle")
    for alone in (color, red, 2 * red, guided(red)):
        for form in ("auto", "plain"):
            config = plan(alone, form).config
            assert (config.steps, config.step_size, config.first_steps, config.levels) == (7, 0.5, 20, 4)
    for composite in (red + circle, guided(red + circle), red + color.condition(color="blue")):
        config = plan(composite).config
        assert (config.steps, config.first_steps) == (3, 5)  # the first term's shared settings
    assert plan(circle + red).config.steps == 2 and isinstance(plan(circle + red).config, SamplerConfig)
    assert plan(red, steps=9).config.steps == 9  # a caller's override still wins
    flat = color.sampling_defaults.to_flat()
    assert flat["alone"] == {"steps": 7, "first_steps": 20}
    assert SamplingDefaults.from_flat(flat, ladder=True) == color.sampling_defaults
    assert hash(SamplingDefaults.from_flat(flat, ladder=True)) == hash(color.sampling_defaults)  # a hashable record
    assert "alone" not in SamplingDefaults().to_flat()  # configs written before the setting stay as they were
    with pytest.raises(InvalidInputError, match=r"unknown sampler setting\(s\) \['stepz'\] in alone; valid settings"):
        SamplingDefaults.from_flat({**flat, "alone": {"stepz": 7}}, ladder=True)
    with pytest.raises(InvalidInputError, match="alone must be a table of sampler settings, got 7"):
        SamplingDefaults.from_flat({**flat, "alone": 7}, ladder=True)
    with pytest.raises(InvalidInputError, match="steps"):
        SamplingDefaults.from_flat({**flat, "alone": {"steps": "many"}}, ladder=True)
