"""OR as a mixture: ``a | b`` is sampled as the mixture of its parts' normalised distributions, each chain drawn from
one part with probability its share, in every form and inside sums and guided forms (`composable_ebm.energy.branches`,
`composable_ebm.pipeline`)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import composable_ebm as cebm
from composable_ebm import Disjunction, GaussianEnergy, Guided, SamplerConfig, WeightedSum, either
from composable_ebm.energy import MAX_BRANCHES, branches
from composable_ebm.errors import InvalidInputError
from composable_ebm.expression import Or, parse_expression, parse_tree
from composable_ebm.pipeline import plan, sample
from composable_ebm.studio.terms import expression_to_terms
from tests.test_diffusion import tiny_unet

NARROW = GaussianEnergy(torch.tensor([-4.0, 0.0]), 0.0625 * torch.eye(2), name="narrow")
WIDE = GaussianEnergy(torch.tensor([4.0, 0.0]), torch.eye(2), name="wide")
CHAIN = SamplerConfig(step_size=0.05, noise="exact", steps=300, method="mala")


def test_a_weighted_disjunctions_energy_is_the_mixture_of_its_parts_unnormalised_densities():
    x = torch.randn(16, 2)
    mixed = either(NARROW, WIDE, weights=[3, 1])
    expected = -torch.logsumexp(torch.stack([-NARROW(x) + math.log(3), -WIDE(x)], 1), 1)
    torch.testing.assert_close(mixed(x), expected)
    assert mixed.shares == (0.75, 0.25)
    nested = Disjunction([mixed, NARROW], [2, 1])  # a part's weight multiplies its own parts'
    assert nested.weights == (6.0, 2.0, 1.0) and len(nested.terms) == 3
    with pytest.raises(InvalidInputError, match="a disjunction's weight must be a positive number"):
        either(NARROW, WIDE, weights=[1, 0])


def test_an_or_samples_each_part_as_often_as_its_share_whatever_the_parts_normalisers():
    """The narrow part's unnormalised density holds 1/16 of the wide one's mass, so a chain on the logsumexp energy
    lands on it about 6% of the time; the mixture draws it at its share, and each part's chains reach that part's
    distribution."""
    for weights, share in (([1, 1], 0.5), ([3, 1], 0.75)):
        result = sample(either(NARROW, WIDE, weights=weights), 4000, CHAIN, seed=0)
        left = result.samples[:, 0] < 0
        assert abs(float(left.float().mean()) - share) < 0.03, weights
        assert abs(float(result.samples[left, 0].mean()) + 4) < 0.03 and abs(float(result.samples[~left, 0].mean()) - 4) < 0.1
        assert abs(float(result.samples[left].var(0).mean()) - 0.0625) < 0.01
        assert abs(float(result.samples[~left].var(0).mean()) - 1.0) < 0.1
    chain_on_energy = cebm.sampling.sample(NARROW | WIDE, 4000, CHAIN, seed=0).samples  # the energy as written
    assert float((chain_on_energy[:, 0] < 0).float().mean()) < 0.15


def test_a_mixtures_draw_repeats_with_its_seed_and_keeps_its_chains_in_order():
    mixed = NARROW | WIDE
    first = sample(mixed, 64, CHAIN, seed=3, keep_every=100)
    again = sample(mixed, 64, CHAIN, seed=3, keep_every=100)
    torch.testing.assert_close(first.samples, again.samples)
    assert first.chain.shape == (4, 64, 2) and torch.equal(first.chain[-1], first.samples)
    assert first.diagnostics.acceptance.shape == (300,) and first.config == CHAIN
    x0 = torch.zeros(8, 2)
    assert sample(mixed, None, CHAIN, seed=0, x0=x0).samples.shape == (8, 2)
    with pytest.raises(ValueError, match="n=4 disagrees with x0's batch of 8"):
        sample(mixed, 4, CHAIN, seed=0, x0=x0)


def test_a_sum_distributes_over_its_disjunctions_and_a_negated_one_is_one_line():
    a, b, c = NARROW, WIDE, GaussianEnergy(torch.zeros(2), torch.eye(2), name="c")
    split = branches(c + (a | b))
    assert [s for s, _ in split] == [0.5, 0.5]
    assert [e.expression() for _, e in split] == ["(c + narrow)", "(c + wide)"]
    assert [s for s, _ in branches((a | b) + (a | c))] == [0.25] * 4
    doubled = branches(2 * (a | b))
    assert all(isinstance(e, WeightedSum) and e.weights == (2.0,) for _, e in doubled)
    assert len(branches(c + a)) == 1
    with pytest.raises(InvalidInputError, match=r"negates a disjunction .*valid choices: negate each part"):
        branches(c - (a | b))
    wide = c
    for _ in range(9):  # 2^9 = 512 branches
        wide = wide + (a | b)
    with pytest.raises(InvalidInputError, match=f"512 branches .*; at most {MAX_BRANCHES}"):
        branches(wide)
    assert len(sample(c + (a | b), 32, CHAIN, seed=0).samples) == 32


def test_or_inside_a_guided_form_is_the_mixture_of_guided_branches():
    model = tiny_unet(attributes={"color": ("red", "green", "blue"), "size": ("small", "large")})
    model.eval()
    red, green = model.condition(color="red"), model.condition(color="green")
    large = model.condition(size="large")
    form = cebm.guided(large + (red | green))
    assert isinstance(form, Disjunction) and all(isinstance(t, Guided) for t in form.terms)
    assert form.shares == (0.5, 0.5)
    via_pipeline = plan(large + (red | green)).energy
    assert isinstance(via_pipeline, Disjunction) and all(isinstance(t, Guided) for t in via_pipeline.terms)
    with pytest.warns(UserWarning, match="plain form"):
        plain = plan(large + (red | green), "plain")
    assert all(isinstance(t, WeightedSum) for t in plain.energy.terms)
    out = sample(large + (red | green), 6, seed=0, levels=3, steps=1)
    assert out.samples.shape == (6, 3, 8, 8) and torch.isfinite(out.samples).all()


def test_the_plain_form_of_a_sum_of_label_dropout_models_warns_that_the_guided_form_composes():
    model = tiny_unet(attributes={"color": ("red", "green"), "size": ("small", "large")})
    total = model.condition(color="red") + model.condition(size="large")
    with pytest.warns(UserWarning, match="plain form: its models were trained with a null condition"):
        plan(total, "plain")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan(total)  # the guided form: nothing to say
        plan(model.condition(color="red"), "plain")  # one model: no sum


def test_an_expression_gives_each_part_of_a_disjunction_its_weight():
    tree = parse_tree("3 : a[x=1] | b")
    assert isinstance(tree, Or) and tree.weights == (3.0, 1.0)
    assert parse_tree("a | b").weights is None
    loaded = {"narrow": NARROW, "wide": WIDE}
    energy = parse_expression("3 : narrow | wide", loaded.__getitem__)
    assert isinstance(energy, Disjunction) and energy.shares == (0.75, 0.25)
    assert energy.expression() == "(3.0 : narrow | wide)"
    with pytest.raises(InvalidInputError, match=r"a part's weight \(N : \.\.\.\) belongs to a disjunction"):
        parse_tree("3 : a")
    with pytest.raises(InvalidInputError, match=r"a part's weight \(N : \.\.\.\) is its share of the samples, a number in \(0, 1e\+06\]"):
        parse_tree("0 : a | b")
    assert expression_to_terms("3 : a[x=1] | b") is None  # the studio's controls have no weight per part
    assert expression_to_terms("a[x=1] | b") is not None
