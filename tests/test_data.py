"""Datasets: shapes (determinism, hold-out), digits, CelebA-format folders, CIFAR-10 binary, 2-D toys."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from PIL import Image

from composable_ebm.data import (
    SHAPES_ATTRIBUTES,
    TOY_DENSITIES,
    attribute_folder,
    cifar10,
    digits,
    read_attribute_table,
    sample_toy,
    shapes,
    toy_log_density,
)
from composable_ebm.data.toy2d import grid, kl_on_grid

RED_CIRCLE = {"color": "red", "shape": "circle"}


def test_shapes_are_deterministic_in_the_seed_and_differ_across_seeds():
    a, b, c = shapes(64, 16, seed=3), shapes(64, 16, seed=3), shapes(64, 16, seed=4)
    assert torch.equal(a.images, b.images) and all(torch.equal(a.labels[k], b.labels[k]) for k in a.labels)
    assert not torch.equal(a.images, c.images)


def test_shapes_images_are_all_distinct_and_in_range():
    d = shapes(300, 16, seed=0)
    assert d.images.shape == (300, 3, 16, 16)
    assert d.images.min() >= 0 and d.images.max() <= 1
    flat = d.images.flatten(1)
    dist = torch.cdist(flat, flat) + torch.eye(300) * 1e9
    assert dist.min() > 1e-3  # jitter makes every image unique


def test_shapes_draw_the_labelled_colour_on_the_labelled_side():
    d = shapes(200, 32, seed=1)
    img = d.images
    # the dominant channel of the object pixels is the labelled colour
    obj = (img.max(1).values > 0.3).float().unsqueeze(1)  # (N, 1, H, W)
    mean_rgb = (img * obj).sum((2, 3)) / obj.sum((2, 3))
    assert torch.equal(mean_rgb.argmax(1), d.labels["color"])
    # the object's centre of mass is left of centre for 'left' and right of it for 'right'
    xs = torch.arange(32).float()
    cx = (obj.squeeze(1).sum(1) * xs).sum(1) / obj.sum((1, 2, 3))
    assert torch.equal((cx > 16).long(), d.labels["position"])
    # large objects cover more pixels than small ones of the same shape
    area = obj.sum((1, 2, 3))
    for s in range(3):
        sel = d.labels["shape"] == s
        small, large = area[sel & (d.labels["size"] == 0)], area[sel & (d.labels["size"] == 1)]
        assert small.max() < large.min()


def test_shapes_are_anti_aliased():
    d = shapes(10, 32, seed=0)
    levels = torch.unique((d.images * 255).round())
    assert levels.numel() > 50  # edge pixels take intermediate values, not just object/background


def test_held_out_combinations_never_appear_in_the_training_split():
    train = shapes(2000, 8, seed=0, holdout=[RED_CIRCLE, {"size": "small", "position": "left", "shape": "square"}])
    red, circle = SHAPES_ATTRIBUTES["color"].index("red"), SHAPES_ATTRIBUTES["shape"].index("circle")
    assert not ((train.labels["color"] == red) & (train.labels["shape"] == circle)).any()
    small_left_square = (train.labels["size"] == 0) & (train.labels["position"] == 0) & (train.labels["shape"] == 1)
    assert not small_left_square.any()
    # both parts of the held-out combination are still seen separately
    assert (train.labels["color"] == red).any() and (train.labels["shape"] == circle).any()
    held = shapes(200, 8, seed=0, holdout=[RED_CIRCLE], split="heldout")
    assert ((held.labels["color"] == red) & (held.labels["shape"] == circle)).all()


def test_a_balanced_split_has_every_value_as_often_as_the_whole_data():
    n = 30000
    uniform = shapes(n, 8, seed=1, holdout=[RED_CIRCLE])
    balanced = shapes(n, 8, seed=1, holdout=[RED_CIRCLE], balance=True)
    share = lambda ds, a, v: float((ds.labels[a] == SHAPES_ATTRIBUTES[a].index(v)).float().mean())
    assert abs(share(uniform, "shape", "circle") - 0.25) < 0.02  # 2 of the 8 shape-and-colour combinations
    for a, values in SHAPES_ATTRIBUTES.items():
        for v in values:
            assert abs(share(balanced, a, v) - 1 / len(values)) < 0.015, (a, v)
    red_circles = (balanced.labels["color"] == 0) & (balanced.labels["shape"] == 0)
    assert not red_circles.any()  # still held out
    with pytest.raises(ValueError, match="cannot be balanced"):
        shapes(10, holdout=[{"shape": "circle"}], balance=True)
    from composable_ebm.errors import InvalidInputError
    from composable_ebm.recipes import data_config

    with pytest.raises(InvalidInputError, match=r"unknown DigitsData setting\(s\) \['balance'\]"):
        data_config({"dataset": "digits", "balance": True})


def test_bad_holdout_names_the_valid_choices():
    with pytest.raises(ValueError, match="valid values"):
        shapes(10, holdout=[{"color": "purple"}])
    with pytest.raises(ValueError, match="valid attributes"):
        shapes(10, holdout=[{"hue": "red"}])
    from composable_ebm.recipes import data_config

    with pytest.raises(ValueError, match=r"ShapesData.holdout: no attribute 'hue'; valid attributes"):
        data_config({"dataset": "shapes", "holdout": [{"hue": "red"}]})
    with pytest.raises(ValueError, match="valid choices"):
        shapes(10, split="test")


def test_digits_are_real_handwriting_upsampled_with_labels():
    d = digits(size=16)
    assert d.images.shape == (1797, 1, 16, 16)
    assert d.images.min() >= 0 and d.images.max() <= 1
    assert torch.equal(torch.unique(d.labels["digit"]), torch.arange(10))
    assert d.attributes["digit"][3] == "3"
    zeros, ones = d.images[d.labels["digit"] == 0].mean(0), d.images[d.labels["digit"] == 1].mean(0)
    # a mean zero is a ring (dark centre), a mean one is a vertical stroke (bright centre)
    assert zeros[0, 6:10, 6:10].mean() < ones[0, 6:10, 6:10].mean()


def _write_celeba_folder(root, rows):
    names = "5_o_Clock_Shadow Male Smiling Young Wavy_Hair"
    lines = [str(len(rows)), names]
    for i, (values, color) in enumerate(rows):
        fname = f"{i:06d}.jpg"
        Image.new("RGB", (40, 50), color).save(root / fname)
        lines.append(f"{fname} " + " ".join(values))
    (root / "list_attr_celeba.txt").write_text("\n".join(lines) + "\n")


def test_attribute_folder_reads_celeba_format_and_derives_binary_attributes(tmp_path):
    rows = [
        (["-1", "1", "1", "-1", "1"], (255, 0, 0)),
        (["1", "-1", "-1", "1", "-1"], (0, 255, 0)),
        (["-1", "-1", "1", "1", "1"], (0, 0, 255)),
    ]
    _write_celeba_folder(tmp_path, rows)
    files, table = read_attribute_table(tmp_path / "list_attr_celeba.txt")
    assert files == ["000000.jpg", "000001.jpg", "000002.jpg"] and table["Male"] == ["1", "-1", "-1"]
    columns = {"female": "-Male", "smiling": "Smiling", "young": "Young", "wavy_hair": "Wavy_Hair"}
    d = attribute_folder(tmp_path, "list_attr_celeba.txt", columns, image_size=16)
    assert d.images.shape == (3, 3, 16, 16) and d.images.dtype == torch.uint8
    assert d.labels["female"].tolist() == [0, 1, 1]  # negated Male
    assert d.labels["smiling"].tolist() == [1, 0, 1]
    assert d.labels["young"].tolist() == [0, 1, 1]
    assert d.labels["wavy_hair"].tolist() == [1, 0, 1]
    assert d.attributes["female"] == ("no", "yes")
    assert d.images[0, 0].float().mean() > 200 and d.images[1, 1].float().mean() > 200  # red, then green


def test_attribute_folder_errors_name_the_problem(tmp_path):
    _write_celeba_folder(tmp_path, [(["-1", "1", "1", "-1", "1"], (0, 0, 0))])
    with pytest.raises(ValueError, match="no column 'Bald'; columns"):
        attribute_folder(tmp_path, "list_attr_celeba.txt", {"bald": "Bald"})
    with pytest.raises(ValueError, match="no column '-Male'"):  # one minus negates; a second is not read as one
        attribute_folder(tmp_path, "list_attr_celeba.txt", {"male": "--Male"})
    (tmp_path / "000000.jpg").unlink()
    with pytest.raises(FileNotFoundError, match="000000.jpg"):
        attribute_folder(tmp_path, "list_attr_celeba.txt")
    (tmp_path / "list_attr_celeba.txt").write_text("2\nMale\na.jpg 1\n")
    with pytest.raises(ValueError, match="header says 2"):
        read_attribute_table(tmp_path / "list_attr_celeba.txt")


def test_cifar10_reads_the_binary_version_and_explains_a_missing_copy(tmp_path):
    with pytest.raises(FileNotFoundError, match="cifar-10-binary"):
        cifar10(tmp_path, train=False)
    folder = tmp_path / "cifar-10-batches-bin"
    folder.mkdir()
    labels = torch.tensor([3, 7], dtype=torch.uint8)
    pixels = torch.randint(0, 256, (2, 3072), dtype=torch.uint8)
    (folder / "test_batch.bin").write_bytes(torch.cat([labels[:, None], pixels], 1).numpy().tobytes())
    d = cifar10(tmp_path, train=False)
    assert d.labels["label"].tolist() == [3, 7] and d.attributes["label"][3] == "cat"
    assert torch.equal(d.images.flatten(1), pixels)


@pytest.mark.parametrize("name", TOY_DENSITIES)
def test_toy_samplers_match_their_densities(name):
    """A histogram of samples is much closer (in KL) to the stated density than a flat model is."""
    points, _ = grid(40)
    x = sample_toy(name, 200_000, torch.Generator().manual_seed(0))
    hist = torch.histogramdd(x.double(), bins=[40, 40], range=[-4.0, 4.0, -4.0, 4.0]).hist.T.flatten()
    log_p = toy_log_density(name, points)
    fit = kl_on_grid(log_p, torch.log(hist + 1e-3))
    flat = kl_on_grid(log_p, torch.zeros_like(log_p))
    assert fit < 0.25 * flat, (fit, flat)


def _write_table(root, header, rows, make_images=True, mode="RGB"):
    lines = [str(len(rows)), " ".join(header)]
    for name, *values in rows:
        if make_images:
            Image.new(mode, (16, 16), 128 if mode == "L" else (128, 64, 32)).save(root / name)
        lines.append(" ".join([name, *values]))
    (root / "list_attr_celeba.txt").write_text("\n".join(lines) + "\n")


def test_a_folder_reads_words_as_a_multi_valued_attribute_and_every_column_by_default(tmp_path):
    """A column of words is one attribute with those values (numbers in numeric order); 1/-1 columns are binary."""
    rows = [("a.png", "red", "1", "10"), ("b.png", "black", "-1", "2"), ("c.png", "red", "-1", "2")]
    _write_table(tmp_path, ["hair", "smiling", "digit"], rows)
    d = attribute_folder(tmp_path, image_size=8)
    assert d.attributes == {"hair": ("black", "red"), "smiling": ("no", "yes"), "digit": ("2", "10")}
    assert d.labels["hair"].tolist() == [1, 0, 1] and d.labels["smiling"].tolist() == [1, 0, 0]
    assert d.labels["digit"].tolist() == [1, 0, 0]
    with pytest.raises(ValueError, match="'-hair' negates column 'hair', which is not a 1/-1 column"):
        attribute_folder(tmp_path, columns={"h": "-hair"}, image_size=8)


def test_a_grey_folder_stays_grey_and_16_bit_grey_is_scaled_not_clipped(tmp_path):
    rows = [("a.png", "1"), ("b.png", "-1")]
    _write_table(tmp_path, ["smiling"], rows, mode="L")
    d = attribute_folder(tmp_path, image_size=8)
    assert d.images.shape == (2, 1, 8, 8) and int(d.images[0, 0, 0, 0]) == 128
    assert attribute_folder(tmp_path, image_size=8, channels=3).images.shape == (2, 3, 8, 8)
    Image.fromarray(np.full((16, 16), 32768, dtype=np.uint16)).save(tmp_path / "a.png")  # half of 16-bit white
    assert abs(int(attribute_folder(tmp_path, image_size=8).images[0, 0, 0, 0]) - 128) <= 1


def test_a_folder_holds_out_combinations_and_refuses_rows_outside_it(tmp_path):
    rows = [("a.png", "1", "1"), ("b.png", "1", "-1"), ("c.png", "-1", "1"), ("d.png", "-1", "-1")]
    _write_table(tmp_path, ["smiling", "glasses"], rows)
    d = attribute_folder(tmp_path, image_size=8, holdout=[{"smiling": "yes", "glasses": "yes"}])
    assert len(d) == 3 and not ((d.labels["smiling"] == 1) & (d.labels["glasses"] == 1)).any()
    with pytest.raises(ValueError, match="attribute 'glasses' has no value 'maybe'"):
        attribute_folder(tmp_path, image_size=8, holdout=[{"glasses": "maybe"}])
    outside = tmp_path / "outside.png"
    Image.new("RGB", (16, 16)).save(outside)
    inner = tmp_path / "inner"
    inner.mkdir()
    for name in ("a.png", "b.png"):
        Image.new("RGB", (16, 16)).save(inner / name)
    for row in ("../outside.png", str(outside)):
        _write_table(inner, ["smiling"], [("a.png", "1"), (row, "-1")], make_images=False)
        with pytest.raises(ValueError, match="lies outside .*inner; rows name files inside the image folder"):
            attribute_folder(inner, image_size=8)


@pytest.mark.parametrize("table, words", [
    ("2\nSmiling Smiling\na.png 1 1\nb.png -1 -1\n", "column 'Smiling' is named twice"),
    ("2\nSmiling\na.png 1\na.png -1\n", "'a.png' is listed again (first on line 3)"),
])
def test_a_table_with_a_column_or_a_file_twice_is_one_line(tmp_path, table, words):
    (tmp_path / "list_attr_celeba.txt").write_text(table)
    with pytest.raises(ValueError, match=re.escape(words)):
        read_attribute_table(tmp_path / "list_attr_celeba.txt")


def test_a_tiny_image_is_refused_rather_than_blown_up(tmp_path):
    _write_table(tmp_path, ["smiling"], [("a.png", "1")])
    Image.new("RGB", (1, 1)).save(tmp_path / "a.png")
    with pytest.raises(ValueError, match=r"a.png: 1x1 pixels, too small for size 8"):
        attribute_folder(tmp_path, image_size=8)


def test_a_recipes_relative_data_root_starts_at_the_recipes_folder(tmp_path, monkeypatch):
    from composable_ebm.recipes import build_dataset, load_recipe

    (tmp_path / "recipes").mkdir()
    (tmp_path / "data").mkdir()
    _write_table(tmp_path / "data", ["smiling"], [("a.png", "1"), ("b.png", "-1")])
    recipe = tmp_path / "recipes" / "r.toml"
    recipe.write_text('[model]\nname = "r"\nblocks = [{ channels = 8, down = true }]\nmultiscale = false\n'
                      '[data]\ndataset = "folder"\nroot = "../data"\nsize = 8\nattributes = ["smiling"]\n')
    monkeypatch.chdir(tmp_path / "data")  # the working directory plays no part
    spec = load_recipe(recipe)
    data = build_dataset(spec.data, spec.folder)
    assert len(data) == 2 and data.attributes == {"smiling": ("no", "yes")}
