"""Energy networks: the contract over every config and composite, multiscale, paper sizes, JSON configs."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import json

import pytest
import torch
import torch.nn.functional as F

from composable_ebm import Energy, GaussianEnergy, MLPConfig, MLPEnergy, ResNetConfig, ResNetEnergy
from composable_ebm.energy import NULL
from composable_ebm.nets.resnet import PAPER_32_BLOCKS, tower_blocks
from tests.conftest import tiny_config
from tests.test_energy import randomize

NETWORK_CONFIGS = {
    "resnet-multiscale": tiny_config(),
    "resnet-single": tiny_config(multiscale=False),
    "resnet-conditional": tiny_config(attributes={"color": ("red", "green"), "size": ("small", "large")},
                                      null_condition=True),
    "resnet-spectral": tiny_config(spectral_norm=True),
    "resnet-instance-ws": tiny_config(norm="instance", weight_standardization=True),
    "resnet-no-norm-gray": tiny_config(norm="none", in_channels=1),
    "resnet-channel-sort": tiny_config(input_transforms=("channel-sort",), attributes={"shape": ("circle", "square")},
                                       null_condition=True),
    "resnet-pixel-set-head": tiny_config(input_transforms=("channel-sort",), condition_head="pixel_set",
                                         null_condition=True, attributes={"color": ("red", "green", "blue")}),
    "resnet-pixel-attention": tiny_config(condition_head="pixel_set", null_condition=True,
                                          attributes={"color": ("red", "green", "blue")}, pixel_pool="attention"),
    "resnet-palette": tiny_config(input_transforms=("shapes-palette-order", "channel-sort"), condition_head="pixel_set",
                                  null_condition=True, attributes={"color": ("red", "green", "blue")},
                                  pixel_pool="attention"),
    "resnet-late-film": tiny_config(attributes={"shape": ("circle", "square")}, null_condition=True, film_blocks=1),
    "resnet-projection": tiny_config(attributes={"shape": ("circle", "square")}, null_condition=True,
                                     condition_head="projection"),
    "mlp": MLPConfig(hidden=16, depth=2),
    "mlp-conditional": MLPConfig(hidden=16, depth=2, attributes={"digit": ("0", "1")}),
}


def build(config) -> Energy:
    return ResNetEnergy(config) if isinstance(config, ResNetConfig) else MLPEnergy(config)


def composites() -> dict[str, Energy]:
    torch.manual_seed(1)
    color = randomize(ResNetEnergy(tiny_config(name="color", attributes={"color": ("red", "green", "blue")})))
    shape = randomize(ResNetEnergy(tiny_config(name="shape", attributes={"shape": ("circle", "square")})))
    plain = ResNetEnergy(tiny_config(name="plain", multiscale=False))
    red, blue, circle = color.condition(color="red"), color.condition(color="blue"), shape.condition(shape="circle")
    return {
        "sum": red + circle,
        "weighted": red + 2.0 * circle,
        "negation": red - 0.5 * circle,
        "disjunction": red | blue,
        "temperature": (red + circle) / 2.0,
        "nested": (red | blue) + 0.5 * (circle - plain),
        "sum-builtin": sum([red, circle, plain]),
        "chained-condition": ResNetEnergy(
            tiny_config(name="joint", attributes={"color": ("red", "green"), "shape": ("circle", "square")})
        )
        .condition(color="red")
        .condition(shape="square"),
    }


def contract_cases():
    cases = [pytest.param(lambda c=c: build(c), id=name) for name, c in NETWORK_CONFIGS.items()]
    cases += [pytest.param(lambda n=n: composites()[n], id=f"composite-{n}") for n in composites()]
    cases.append(pytest.param(lambda: GaussianEnergy(torch.zeros(2), torch.eye(2)), id="gaussian"))
    return cases


@pytest.mark.parametrize("make", contract_cases())
def test_energy_contract(make):
    """(B, *input_shape) -> finite (B,), input gradient of the input's shape, batch-independent values."""
    energy = make().eval()  # eval: spectral norm's power iteration would change values between calls
    assert isinstance(energy, Energy)
    lo, hi = energy.value_range or (-2.0, 2.0)
    x = lo + (hi - lo) * torch.rand(5, *energy.input_shape)
    e = energy(x)
    assert e.shape == (5,) and torch.isfinite(e).all()
    e2, g = energy.energy_and_grad(x)
    assert g.shape == x.shape and torch.isfinite(g).all()
    torch.testing.assert_close(e2, e.detach())
    # each item's energy does not depend on the rest of the batch
    torch.testing.assert_close(energy(x[:2]), energy(x)[:2], rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="expects a batch of shape"):
        energy(torch.zeros(2, *energy.input_shape[:-1], energy.input_shape[-1] + 1))


def test_multiscale_energy_equals_explicit_sum_of_towers():
    model = randomize(ResNetEnergy(tiny_config(attributes={"color": ("red", "green")})))
    x = torch.rand(3, 3, 8, 8)
    labels = {"color": torch.tensor([0, 1, 1])}
    cond = F.one_hot(labels["color"], 2).float()
    towers = model.towers
    explicit = towers[0](x, cond) + towers[1](F.avg_pool2d(x, 2), cond) + towers[2](F.avg_pool2d(x, 4), cond)
    torch.testing.assert_close(model(x, labels), explicit)
    torch.testing.assert_close(model.scale_energies(x, labels).sum(1), explicit)


def test_coarser_towers_drop_the_first_down_sampling_blocks():
    full = tower_blocks(PAPER_32_BLOCKS, 0)
    half = tower_blocks(PAPER_32_BLOCKS, 1)
    quarter = tower_blocks(PAPER_32_BLOCKS, 2)
    assert len(full) - len(half) == 1 and len(full) - len(quarter) == 2
    assert [b for b in full if b.down][1:] == [b for b in half if b.down]
    assert [b for b in full if b.down][2:] == [b for b in quarter if b.down]
    # every tower ends at the same spatial size (2x2 for the 32x32 network)
    model = ResNetEnergy(ResNetConfig.paper_32())
    assert [t.num_downs for t in model.towers] == [4, 3, 2]


@pytest.mark.parametrize(
    ("factory", "multiscale", "expected"),
    [
        (ResNetConfig.paper_32, True, 8_568_054),
        (ResNetConfig.paper_32, False, 2_930_130),
        (ResNetConfig.paper_128, True, 33_097_158),
        (ResNetConfig.paper_128, False, 11_180_354),
    ],
)
def test_paper_architecture_parameter_counts(factory, multiscale, expected):
    model = ResNetEnergy(factory(multiscale=multiscale))
    assert sum(p.numel() for p in model.parameters()) == expected


def test_paper_architectures_map_images_to_one_energy_each():
    for config in (ResNetConfig.paper_32(), ResNetConfig.paper_128()):
        model = ResNetEnergy(config)
        x = torch.rand(2, 3, config.image_size, config.image_size)
        with torch.no_grad():
            assert model(x).shape == (2,)
            assert model.scale_energies(x).shape == (2, 3)


def test_image_size_that_does_not_fit_the_table_is_rejected():
    with pytest.raises(ValueError, match="does not fit the table"):
        ResNetEnergy(ResNetConfig.paper_32(image_size=24))


@pytest.mark.parametrize("name", sorted(NETWORK_CONFIGS))
def test_config_json_round_trip(name):
    config = NETWORK_CONFIGS[name]
    text = json.dumps(config.to_dict())
    restored = type(config).from_dict(json.loads(text))
    assert restored == config
    torch.manual_seed(0)
    a = build(config)
    torch.manual_seed(0)
    b = build(restored)
    a.load_state_dict(b.state_dict(), strict=True)


def test_unknown_config_keys_are_rejected_with_the_valid_ones():
    data = ResNetConfig.paper_32().to_dict()
    data["multiscal"] = False
    with pytest.raises(ValueError, match=r"unknown ResNetConfig setting\(s\) \['multiscal'\].*multiscale"):
        ResNetConfig.from_dict(data)
    data = ResNetConfig.paper_32().to_dict()
    data["norm"] = "batch"
    with pytest.raises(ValueError, match="must be one of"):
        ResNetConfig.from_dict(data)


def test_channel_sort_makes_the_energy_invariant_to_permuting_the_colour_channels():
    model = randomize(ResNetEnergy(tiny_config(input_transforms=("channel-sort",),
                                               attributes={"shape": ("circle", "square")})))
    x = torch.rand(6, 3, 8, 8)
    labels = {"shape": torch.tensor([0, 1, 0, 1, 0, 1])}
    e = model(x, labels)
    for perm in ([1, 0, 2], [2, 0, 1], [0, 2, 1]):
        torch.testing.assert_close(model(x[:, perm], labels), e)
    plain = randomize(ResNetEnergy(tiny_config(attributes={"shape": ("circle", "square")})))
    assert not torch.allclose(plain(x[:, [1, 0, 2]], labels), plain(x, labels))  # the property is the option's


def test_palette_towers_cannot_tell_which_palette_colour_an_object_has():
    """Through shapes-palette-order, renders that differ only in their objects' colour (anti-aliased edges included)
    have the same unconditional energy, and the pixel-set head still tells them apart."""
    from composable_ebm.data import render_shapes

    config = tiny_config(input_transforms=("shapes-palette-order", "channel-sort"), condition_head="pixel_set",
                         null_condition=True, pixel_pool="attention", attributes={"color": ("red", "green", "blue")})
    model = randomize(ResNetEnergy(config))
    g = torch.Generator().manual_seed(0)
    labels = {"shape": torch.randint(0, 3, (6,), generator=g), "size": torch.randint(0, 2, (6,), generator=g),
              "position": torch.randint(0, 2, (6,), generator=g)}
    images = [render_shapes({**labels, "color": torch.full((6,), c)}, 8, torch.Generator().manual_seed(1))
              for c in range(3)]
    null, red = {"color": torch.full((6,), -1)}, {"color": torch.zeros(6, dtype=torch.long)}
    for x in images[1:]:
        assert (x - images[0]).abs().max() > 0.5  # other colours
        torch.testing.assert_close(model(x, null), model(images[0], null))
        assert not torch.allclose(model(x, red), model(images[0], red))
    plain = randomize(ResNetEnergy(dataclasses.replace(config, input_transforms=("channel-sort",))))  # the transform's
    assert not torch.allclose(plain(images[1], null), plain(images[0], null))
    speckled = images[1].clone()  # a second palette colour inside an object stays a second colour to the towers
    speckled[:, :, 3:5, 3:5] = torch.tensor([0.90, 0.12, 0.12])[:, None, None]  # red on green objects
    assert not torch.allclose(model(speckled, null), model(images[1], null))
    noisy = images[0] + 0.05 * torch.randn(6, 3, 8, 8, generator=g)  # noise: seen, and differentiable
    x = noisy.clone().requires_grad_(True)
    model(x, null).sum().backward()
    assert x.grad.abs().sum() > 0 and not torch.allclose(model(noisy, null), model(images[0], null))


def test_an_unknown_input_transform_is_one_line_naming_the_registered_ones():
    with pytest.raises(ValueError, match=r"unknown input transform 'sepia'; valid choices: .*'channel-sort'"):
        ResNetEnergy(tiny_config(input_transforms=("sepia",)))
    with pytest.raises(ValueError, match="must be a list of transform names"):
        tiny_config(input_transforms="channel-sort")


@pytest.mark.subprocess
def test_a_transform_is_found_by_name_without_its_module_imported_first():
    """A saved model lists its transforms by name; the registry finds the Shapes ones through their entry points."""
    code = ("import sys; from composable_ebm.nets.transforms import TRANSFORMS; "
            "assert 'composable_ebm.data.shapes' not in sys.modules; "
            "print(TRANSFORMS.get('shapes-palette-order').__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ShapesPaletteOrder"


@pytest.mark.parametrize("pool", ["mean", "attention"])
def test_pixel_set_head_condition_is_blind_to_where_the_pixels_are(pool):
    """With the pixel-set head, E(x | c) - E(x | 0) is unchanged when the pixels are shuffled."""
    model = randomize(ResNetEnergy(tiny_config(input_transforms=("channel-sort",), condition_head="pixel_set",
                                               null_condition=True, attributes={"color": ("red", "green", "blue")},
                                               pixel_pool=pool)))
    x = torch.rand(4, 3, 8, 8)
    shuffled = x.flatten(2)[:, :, torch.randperm(64)].view_as(x)
    for value in range(3):
        c, null = {"color": torch.full((4,), value)}, {"color": torch.full((4,), -1)}
        torch.testing.assert_close(model(shuffled, c) - model(shuffled, null), model(x, c) - model(x, null))
    assert not torch.allclose(model(shuffled, null), model(x, null))  # the towers do see where pixels are


def test_attention_pooled_head_reads_a_small_object_like_a_large_one_where_a_mean_does_not():
    """Attention pooling is an average over the pixels the head attends to: with its score on the object's colour,
    the logits of a small and a large object of one colour agree; the mean's grow with the object's area."""
    attributes = {"color": ("red", "green", "blue")}
    x = torch.full((2, 3, 16, 16), 0.08)
    x[0, :, 6:9, 6:9] = torch.tensor([0.9, 0.12, 0.12])[:, None, None]  # small red square
    x[1, :, 3:13, 3:13] = torch.tensor([0.9, 0.12, 0.12])[:, None, None]  # large red square
    logits = {}
    for pool in ("mean", "attention"):
        torch.manual_seed(0)
        model = randomize(ResNetEnergy(tiny_config(condition_head="pixel_set", null_condition=True,
                                                   attributes=attributes, pixel_pool=pool)))
        if pool == "attention":
            with torch.no_grad():  # a score that singles out bright red pixels: weight on the red input's features
                model.head.score.weight.zero_()
                model.head.score.bias.zero_()
                model.head.pixel[0].weight.zero_()
                model.head.pixel[0].weight[0, 0, 0, 0] = 50.0
                model.head.pixel[0].bias.fill_(-10.0)
                model.head.pixel[2].weight.copy_(torch.eye(8)[:, :, None, None])  # features pass through
                model.head.pixel[2].bias.zero_()
                model.head.score.weight[0, 0, 0, 0] = 10.0
        logits[pool] = model.head(x)
    torch.testing.assert_close(logits["attention"][0], logits["attention"][1], rtol=1e-3, atol=1e-3)
    assert not torch.allclose(logits["mean"][0], logits["mean"][1], rtol=1e-2, atol=1e-2)


def test_unknown_pixel_pool_names_the_choices():
    with pytest.raises(ValueError, match=r"pixel_pool 'max'.*\['attention', 'mean'\]"):
        tiny_config(pixel_pool="max")


def test_unknown_condition_head_names_the_choices():
    with pytest.raises(ValueError, match=r"condition_head 'cross'.*\['film', 'pixel_set', 'projection'\]"):
        tiny_config(condition_head="cross")


@pytest.mark.compile
@pytest.mark.parametrize("name", ["resnet-conditional", "resnet-late-film", "unet", "unet-without-null"])
def test_torch_compile_traces_a_conditional_network_whole_and_checks_its_labels_as_it_runs(name):
    """The label checks that read indices back to the host are skipped while torch.compile traces (as during a CUDA
    graph capture): the network compiles as one graph, draws the eager energies, and an index out of range still
    fails in one line naming the attribute, now as the compiled graph runs."""
    from tests.test_diffusion import tiny_unet

    if name.startswith("unet"):
        model = tiny_unet(null_condition=name == "unet")
    else:
        model = build(NETWORK_CONFIGS[name])
    model = randomize(model).eval()
    attr, values = next(iter(model.attributes.items()))
    x = torch.rand(4, *model.input_shape)
    labels = {attr: torch.tensor([0, 1, 1, 0])}
    torch._dynamo.reset()
    explained = torch._dynamo.explain(lambda y, lab: model(y, lab))(x, labels)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    compiled = torch.compile(model, backend="aot_eager", dynamic=False)
    torch.testing.assert_close(compiled(x, labels), model(x, labels))
    with pytest.raises(RuntimeError, match=rf"labels\['{attr}'\] holds an index outside 0..{len(values) - 1}"):
        compiled(x, {attr: torch.tensor([0, len(values), 1, 0])})
    if not model.has_null_condition:
        with pytest.raises(RuntimeError, match=r"trained without a null condition"):
            compiled(x, {attr: torch.tensor([0, NULL, 1, 0])})
