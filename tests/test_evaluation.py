"""Evaluation: classifier and compositional accuracy, AUROC, FID closed forms, IS, plots, model save/load."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from composable_ebm import GaussianEnergy, MLPConfig, MLPEnergy, ResNetEnergy
from composable_ebm.data import shapes
from composable_ebm.errors import ModelFileError
from composable_ebm.evaluation import (
    AttributeClassifier,
    ClassifierConfig,
    InceptionV3Features,
    attribute_accuracy,
    auroc,
    compositional_accuracy,
    fid,
    frechet_distance,
    gaussian_stats,
    inception_score_from_probs,
    ood_auroc,
    plot_training_health,
    train_classifier,
)
from composable_ebm.models import load_model, save_model
from composable_ebm.images import save_image_grid
from composable_ebm.sampling import AugmentConfig
from tests.conftest import settings, tiny_config


@pytest.fixture(scope="module")
def trained_classifier():
    train = shapes(3000, 16, seed=0, split="all")
    torch.manual_seed(0)
    clf = AttributeClassifier(ClassifierConfig(name="shapes-classifier", image_size=16, width=16, attributes=train.attributes))
    train_classifier(clf, train.images, train.labels, steps=200, batch_size=64)
    return clf.eval()  # shared by several tests: none of them changes it


@pytest.mark.learning
def test_attribute_classifier_exceeds_98_percent_on_unseen_shapes_images(trained_classifier):
    test = shapes(1000, 16, seed=1, split="all")
    acc = attribute_accuracy(trained_classifier, test.images, test.labels)
    assert min(acc.values()) > 0.98, acc


@pytest.fixture(scope="module")
def bundled_classifier():
    """The bundled Shapes classifier: reads 16-px Shapes, no training needed."""
    from composable_ebm.models import load_model

    return load_model("shapes-classifier")


def test_compositional_accuracy_counts_attributes_and_joint_hits(bundled_classifier):
    red_circles = shapes(100, 16, seed=5, holdout=[{"color": "red", "shape": "circle"}], split="heldout")
    score = compositional_accuracy(red_circles.images, bundled_classifier, {"color": "red", "shape": "circle"})
    assert score.per_attribute["color"] > 0.95 and score.per_attribute["shape"] > 0.95 and score.joint > 0.9
    blue_circles = compositional_accuracy(red_circles.images, bundled_classifier, {"color": "blue", "shape": "circle"})
    assert blue_circles.per_attribute["color"] < 0.05 and blue_circles.joint < 0.05
    assert blue_circles.per_attribute["shape"] > 0.95
    with pytest.raises(ValueError, match="valid values"):
        compositional_accuracy(red_circles.images, bundled_classifier, {"color": "pink"})


def test_classifier_round_trips_through_config_and_safetensors(bundled_classifier, tmp_path):
    save_model(bundled_classifier, tmp_path / "clf")
    loaded = load_model(tmp_path / "clf")
    x = shapes(20, 16, seed=9).images
    torch.testing.assert_close(loaded(x)["shape"], bundled_classifier(x)["shape"])
    assert json.loads((tmp_path / "clf" / "config.json").read_text())["model_type"] == "attribute-classifier"


def test_auroc_of_perfect_random_and_inverted_scorers():
    assert auroc(torch.tensor([2.0, 3.0, 4.0]), torch.tensor([0.0, 1.0])) == 1.0
    assert auroc(torch.tensor([0.0, 1.0]), torch.tensor([2.0, 3.0, 4.0])) == 0.0
    assert auroc(torch.ones(5), torch.ones(7)) == 0.5  # all ties
    g = torch.Generator().manual_seed(0)
    random = auroc(torch.rand(4000, generator=g), torch.rand(4000, generator=g))
    assert abs(random - 0.5) < 0.03
    # separated Gaussians: AUROC = Phi(d / sqrt(2))
    a, b = torch.randn(20000, generator=g) + 1.0, torch.randn(20000, generator=g)
    assert auroc(a, b) == pytest.approx(0.5 * (1 + math.erf(1.0 / 2)), abs=0.01)


def test_ood_auroc_uses_minus_energy():
    energy = GaussianEnergy(torch.zeros(2), torch.eye(2))
    g = torch.Generator().manual_seed(0)
    x_in, x_out = torch.randn(500, 2, generator=g), torch.randn(500, 2, generator=g) * 0.1 + 6.0
    assert ood_auroc(energy, x_in, x_out) == 1.0
    assert ood_auroc(energy, x_out, x_in) == 0.0


def test_fid_of_identical_sets_is_zero_and_shifted_gaussians_give_the_closed_form():
    g = torch.Generator().manual_seed(0)
    f = torch.randn(5000, 8, generator=g, dtype=torch.float64)
    m, c = gaussian_stats(f)
    assert abs(frechet_distance(m, c, m, c)) < 1e-8
    shift = torch.tensor([1.0, -2.0, 0, 0, 0, 0, 0, 0.5], dtype=torch.float64)
    assert frechet_distance(m, c, m + shift, c) == pytest.approx(float(shift.pow(2).sum()), abs=1e-8)
    # diagonal covariances: sum (sqrt(a) - sqrt(b))^2 on top of the mean term
    ca, cb = torch.diag(torch.tensor([1.0, 4.0, 9.0])), torch.diag(torch.tensor([4.0, 1.0, 1.0]))
    expected = 1.0 + 1.0 + 4.0
    assert frechet_distance(torch.zeros(3), ca, torch.zeros(3), cb) == pytest.approx(expected, abs=1e-8)


def test_fid_with_a_pluggable_feature_network_is_zero_for_the_same_images_and_grows_with_difference():
    torch.manual_seed(0)
    feat = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.AdaptiveAvgPool2d(2), torch.nn.Flatten())
    a = shapes(200, 16, seed=0).images
    b = shapes(200, 16, seed=1).images
    noise = torch.rand(200, 3, 16, 16)
    same = fid(a, a, feat)
    near, far = fid(a, b, feat), fid(a, noise, feat)
    assert abs(same) < 1e-6 and near < far


def test_inception_score_bounds():
    k = 10
    confident_uniform = torch.eye(k).repeat(50, 1)  # each image sure, classes balanced: IS = K
    assert inception_score_from_probs(confident_uniform, splits=5)[0] == pytest.approx(k, rel=1e-6)
    assert inception_score_from_probs(torch.full((100, k), 1 / k), splits=5)[0] == pytest.approx(1.0)


def test_inception_features_need_weights_and_load_them_strictly(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    with pytest.raises(FileNotFoundError, match="Inception v3 weights"):
        InceptionV3Features()
    from torchvision.models import inception_v3

    torch.manual_seed(0)
    net = inception_v3(weights=None, aux_logits=False, init_weights=False)
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, tmp_path / "inception.safetensors")
    features = InceptionV3Features(tmp_path / "inception.safetensors")
    with torch.no_grad():
        f = features(torch.rand(2, 3, 32, 32))
        p = features.probabilities(torch.rand(2, 3, 32, 32))
    assert f.shape == (2, 2048) and p.shape == (2, 1000)
    torch.testing.assert_close(p.sum(1), torch.ones(2))
    state = {k: v.contiguous() for k, v in net.state_dict().items() if not k.startswith("fc.")}
    save_file(state, tmp_path / "partial.safetensors")
    with pytest.raises(RuntimeError, match="Missing key"):
        InceptionV3Features(tmp_path / "partial.safetensors")


def test_training_health_plot_and_image_grid_are_written(tmp_path):
    log = tmp_path / "log.jsonl"
    records = [{"step": s, "e_diff": 0.1 * s, "grad_norm_cd": 1.0 + s, "grad_norm_kl": 0.5} for s in range(1, 20)]
    records.insert(5, {"event": "fault", "step": 6, "reason": "non-finite loss", "action": "rollback"})
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = plot_training_health(tmp_path, tmp_path / "health.png")
    with Image.open(out) as im:
        assert im.size[0] > 300 and im.size[1] > 300
    images = shapes(16, 8, seed=0).images
    grid = save_image_grid(images, tmp_path / "grid.png", nrow=4)
    with Image.open(grid) as im:  # 8-pixel images upscaled 8 times by default, each pixel a block
        assert im.size == (4 * 64 + 5 * 2, 4 * 64 + 5 * 2)
        block = torch.tensor(np.asarray(im.crop((2, 2, 2 + 64, 2 + 64)))).view(8, 8, 8, 8, 3)
        assert bool((block == block[:, :1, :, :1]).all())  # nearest neighbour: constant within each block
    with Image.open(save_image_grid(images, tmp_path / "grid1.png", nrow=4, scale=1)) as im:
        assert im.size == (4 * 8 + 5 * 2, 4 * 8 + 5 * 2)
    with pytest.raises(ValueError, match="no training records"):
        (tmp_path / "empty").mkdir()
        (tmp_path / "empty" / "log.jsonl").write_text("")
        plot_training_health(tmp_path / "empty", tmp_path / "x.png")


def test_training_health_plot_of_a_short_run_ticks_whole_steps(tmp_path, monkeypatch):
    from composable_ebm.evaluation import plots

    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, out: figures.append(fig) or out)
    (tmp_path / "log.jsonl").write_text("".join(json.dumps({"step": s, "e_diff": 0.1 / s, "grad_norm_cd": 2.0,
                                                            "grad_norm_kl": 0.01}) + "\n" for s in (4, 6)))
    plot_training_health(tmp_path, tmp_path / "health.png")
    ticks = [t for t in figures[0].axes[1].get_xticks() if 4 <= t <= 6]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_energy_models_round_trip_with_their_sampler_settings(tmp_path):
    model = ResNetEnergy(tiny_config(name="color", attributes={"color": ("red", "green")}, null_condition=True))
    model.sampling_defaults = settings(step_size=7.0, steps=9, augment=AugmentConfig(crop_scale=(0.3, 1.0)))
    save_model(model, tmp_path / "m")
    loaded = load_model(tmp_path / "m")
    assert loaded.config == model.config and loaded.sampling_defaults == model.sampling_defaults
    x = torch.rand(3, 3, 8, 8)
    torch.testing.assert_close(loaded(x), model.eval()(x))
    # strict loading: a missing tensor is an error, not a silent default
    from safetensors.torch import load_file

    weights = load_file(tmp_path / "m" / "model.safetensors")
    weights.pop(next(iter(weights)))
    save_file(weights, tmp_path / "m" / "model.safetensors")
    with pytest.raises(ModelFileError, match="weights do not match config.json .missing: "):
        load_model(tmp_path / "m")
    mlp = MLPEnergy(MLPConfig())
    save_model(mlp, tmp_path / "mlp")
    assert load_model(tmp_path / "mlp").sampling_defaults is None


def test_realism_scores_fresh_renders_near_the_floor_and_noise_far_above_it():
    """FID ratio ~1 and HF ratio ~1 for real images; speckled images score far higher on both."""
    from composable_ebm.evaluation.realism import contact_sheet, high_frequency_energy, realism
    from composable_ebm.models import load_model

    classifier = load_model("shapes-classifier").eval()
    reference = shapes(400, 16, seed=10, split="all").images
    real = shapes(4 * 64, 16, seed=11, split="all").images
    fresh = shapes(64, 16, seed=12, split="all").images
    same = realism(fresh, real, reference, classifier.features)
    assert 0.3 < same.fid_ratio < 3.0 and 0.8 < same.hf_ratio < 1.25
    speckled = (fresh.float() / 255 if fresh.dtype == torch.uint8 else fresh) + 0.15 * torch.randn(fresh.shape)
    noisy = realism(speckled.clamp(0, 1), real, reference, classifier.features)
    # the classifier's features barely see pixel noise (so the HF ratio is measured beside FID) ...
    assert noisy.fid_ratio > same.fid_ratio and noisy.hf_ratio > 3
    # ... but they see content: 64 images of one colour against renders of every colour
    green = shapes(2000, 16, seed=13, split="all")
    one_colour = green.images[green.labels["color"] == 1][:64]
    assert realism(one_colour, real, reference, classifier.features).fid_ratio > 5 * same.fid_ratio
    assert float(high_frequency_energy(torch.full((2, 3, 8, 8), 0.4)).abs().max()) == 0.0
    with pytest.raises(ValueError, match="whole multiple"):
        realism(fresh, real[:100], reference, classifier.features)
    sheet = contact_sheet([(fresh, real), (fresh, real)], per_row=4, scale=2)
    assert sheet.shape[0] == 3 and sheet.shape[1] == 2 * 2 * 17 and sheet.min() >= 0 and sheet.max() <= 1


def test_the_blind_training_mix_is_the_training_split_seen_without_colour():
    from benchmarks.realism import blind_training_mix

    attributes = {"shape": ("circle", "square", "triangle"), "color": ("red", "green", "blue"),
                  "size": ("small", "large"), "position": ("left", "right")}
    # red circles held out: 2 of the 8 shape-and-colour combinations are circles, whatever the size
    mix = blind_training_mix("size", 1, attributes, seed=0)
    assert set(mix) == {"shape", "color", "position"}
    assert abs(mix["shape"]["circle"] - 0.25) < 0.02 and abs(mix["shape"]["square"] - 0.375) < 0.02
    assert mix["color"] == {"red": 1 / 3, "green": 1 / 3, "blue": 1 / 3}  # a channel-blind model cannot prefer one
    # a colour stands for every colour: red's mix is the whole split's, with its circles
    red = blind_training_mix("color", 0, attributes, seed=0)
    assert "color" not in red and abs(red["shape"]["circle"] - 0.25) < 0.02
    circle = blind_training_mix("shape", 0, attributes, seed=0)
    assert abs(circle["size"]["small"] - 0.5) < 0.05 and circle["color"]["red"] == 1 / 3


@pytest.mark.learning
def test_the_digits_benchmark_reads_digits_and_splits_each_digit_into_a_floor_and_a_disjoint_reference():
    pytest.importorskip("sklearn")
    from benchmarks.digits import digit_sets, digits_classifier
    from composable_ebm.data.digits import digits

    data = digits(16, 1)
    for index in range(10):
        real, reference = digit_sets(data, index, 64)
        assert real.shape == (64, 1, 16, 16) and reference.shape[0] == int((data.labels["digit"] == index).sum()) - 64
        pool = data.images[data.labels["digit"] == index].flatten(1)  # every image of the digit, no other
        for part in (real, reference):
            assert bool((torch.cdist(part.flatten(1), pool).min(dim=1).values == 0).all())
        assert float(torch.cdist(real.flatten(1), reference.flatten(1)).min()) > 0  # disjoint (no duplicates here)
    with pytest.raises(SystemExit, match="too few"):
        digit_sets(data, 0, 100)
    classifier, held_out = digits_classifier(data, seed=0, steps=300)
    assert held_out > 0.9 and classifier.config.in_channels == 1  # grey stays grey


@pytest.mark.learning
def test_the_digits_benchmark_measures_every_digit_of_every_model_given(tmp_path, monkeypatch):
    pytest.importorskip("sklearn")
    from benchmarks import digits as bench

    model = ResNetEnergy(tiny_config(name="digits", image_size=16, in_channels=1, null_condition=True,
                                     attributes={"digit": tuple(str(d) for d in range(10))}))
    model.sampling_defaults = settings(step_size=10.0, noise=0.005, steps=2)
    save_model(model, tmp_path / "a")
    save_model(model, tmp_path / "b")
    argv = ["digits", "--models", str(tmp_path / "a"), str(tmp_path / "b"), "--n", "8", "--classifier-steps", "30",
            "--out", str(tmp_path / "out"), "--no-doc", "--threads", "1"]
    monkeypatch.setattr(sys, "argv", [*argv, "--names", "one", "two", "--scale", "2"])
    bench.main()
    report = json.loads((tmp_path / "out" / "digits.json").read_text())
    assert set(report["models"]) == {"one", "two"}
    for name in ("one", "two"):
        rows = report["models"][name]["rows"]
        assert [r["digit"] for r in rows] == [str(d) for d in range(10)]
        assert all(0 <= r["accuracy"] <= 1 and r["fid_ratio"] > 0 and r["n"] == 8 for r in rows)
        assert (tmp_path / "out" / f"digits-{name}.png").is_file()
    # the same weights and seeds give the same rows under either name
    assert report["models"]["one"]["rows"] == report["models"]["two"]["rows"]
    monkeypatch.setattr(sys, "argv", [*argv, "--names", "one"])
    with pytest.raises(SystemExit, match="1 names for 2 models"):
        bench.main()


def test_an_interrupted_faces_table_shard_resumes_with_its_rows_and_refuses_other_settings(tmp_path):
    from benchmarks.faces import _paths, _resumed, _save_shard

    table, tensors = _paths(tmp_path, "t", (1, 2))
    settings = {"models": "bundled", "classifier": "faces-classifier", "n": 8, "scales": None, "ladder": {},
                "only": "alone"}
    rows = [{"index": 1, "joint": 1.0}, {"index": 3, "joint": 0.5}]
    samples = {"1": torch.rand(2, 3, 4, 4), "3": torch.rand(2, 3, 4, 4)}
    _save_shard(table, tensors, rows, samples, 2.5, settings)
    got, got_samples, minutes = _resumed(table, tensors, settings)
    assert got == rows and minutes == 2.5 and set(got_samples) == {"1", "3"}
    torch.testing.assert_close(got_samples["3"], samples["3"])
    assert _resumed(tmp_path / "none.json", tensors, settings) == ([], {}, 0.0)  # nothing saved: start afresh
    with pytest.raises(SystemExit, match=r"other settings \(n 8, now 64\)"):
        _resumed(table, tensors, {**settings, "n": 64})
    # a row whose samples were not saved with it is measured again
    _save_shard(table, tensors, rows, {"1": samples["1"]}, 2.5, settings)
    assert [r["index"] for r in _resumed(table, tensors, settings)[0]] == [1]
    assert not list(tmp_path.glob(".*.tmp"))  # each file was replaced whole


def test_the_faces_gap_floor_is_zero_for_the_whole_split_and_shrinks_with_more_samples():
    """An exact sampler of the training split that draws all of a value's renders reads its mix exactly (gap 0); at
    a few samples it reads gaps, larger at 8 samples than at 64."""
    from types import SimpleNamespace

    from benchmarks.faces import ATTRIBUTES, HELD_OUT, gap_floor
    from composable_ebm.data import FACES_ATTRIBUTES, combination_mask

    g = torch.Generator().manual_seed(0)
    labels = {a: torch.randint(len(FACES_ATTRIBUTES[a]), (2000,), generator=g) for a in ATTRIBUTES}
    data = SimpleNamespace(images=torch.zeros(2000, 3, 4, 4, dtype=torch.uint8), labels=labels)
    reader = SimpleNamespace(predict=lambda x: labels)  # reads every render right
    trained = ~combination_mask(labels, FACES_ATTRIBUTES, [HELD_OUT])
    pools = {(a, v): int(((labels[a] == i) & trained).sum()) for a in ATTRIBUTES
             for i, v in enumerate(FACES_ATTRIBUTES[a])}
    smallest = min(pools, key=pools.get)
    whole = gap_floor(data, reader, [pools[smallest]], draws=3)
    assert float(whole[(*smallest, pools[smallest])].abs().max()) < 1e-6  # all its training renders: the exact mix
    floor = gap_floor(data, reader, [8, 64], draws=40)
    assert len(floor) == 2 * len(pools)
    for a in ATTRIBUTES:
        for v in FACES_ATTRIBUTES[a]:
            assert float(floor[a, v, 8].median()) > float(floor[a, v, 64].median()) > 0
    with pytest.raises(SystemExit, match="more than the"):
        gap_floor(data, reader, [5000], draws=1)


def test_the_faces_alone_table_gives_each_rows_floor_when_every_row_has_one():
    from benchmarks.faces import alone_table, largest_gaps

    def row(value: str, floor: list[float] | None) -> dict:
        r = {"want": {"hat": [value]}, "joint": 1.0, "fid_ratio": 3.0, "hf_ratio": 0.9,
             "gaps": {"hair": 0.3, "smiling": 0.1}, "gaps_training": {"hair": 0.2, "smiling": 0.05}}
        return r if floor is None else {**r, "gap_floor": floor}

    rows = [row("no", [0.1] * 19 + [0.25, 0.4]), row("yes", [0.2] * 21)]  # 21 draws: the 95th percentile is one
    lines = alone_table(rows)
    assert lines[0].endswith("| to the training split | an exact sampler's (median / 95th percentile) |")
    assert all(line.count("|") == 9 for line in lines)
    assert lines[2].endswith("| hair 0.30 | hair 0.20 | 0.10 / 0.25 |")
    assert largest_gaps(rows).endswith("0.20 to the training split (an exact sampler of it: 0.20 / 0.25, median /"
                                       " 95th percentile)")
    # rows measured before the floor existed (a resumed shard): no column, no floor in the sentence
    old = [row("no", None), rows[1]]
    assert all(line.count("|") == 8 for line in alone_table(old))
    assert largest_gaps(old).endswith("0.20 to the training split")


def test_the_faces_alone_table_gives_each_rows_fid_ratio_over_its_repeats_and_refuses_repeats_elsewhere(monkeypatch):
    from benchmarks.faces import alone_table, main, repeats_sentence, sampler_report

    def row(value: str, repeats: list[float] | None) -> dict:
        r = {"kind": "alone", "want": {"hair": [value]}, "joint": 1.0, "fid_ratio": 3.0, "hf_ratio": 0.9,
             "gaps": {"hat": 0.3}, "gaps_training": {"hat": 0.2}}
        return r if repeats is None else {**r, "fid_ratio": repeats[0], "fid_ratio_repeats": repeats}

    rows = [row("blond", [2.0, 3.0, 4.0]), row("brown", [6.6, 3.7, 5.6])]
    lines = alone_table(rows)
    assert "| FID ratio | FID ratio over 3 seeds: mean (range) | HF ratio |" in lines[0]
    assert all(line.count("|") == 9 for line in lines)
    assert "| 2.0 | 3.0 (2.0-4.0) | 0.90 |" in lines[2] and "| 6.6 | 5.3 (3.7-6.6) | 0.90 |" in lines[3]
    assert repeats_sentence(rows) == (" Over 3 seeds per row (the row's own, then plus 1000, 2000, ...), the rows'"
                                      " mean FID ratio: median 4.2, worst 5.3 (`hair=brown`, which reads 3.7-6.6"
                                      " across them).")
    text = sampler_report(rows, "seeds3", 64, 1.0, "bundled", {})
    assert "`python -m benchmarks.faces --models bundled --only alone --repeats 3 --n 64 --label seeds3`" in text
    assert "1 CPU-minutes" in text
    on_gpu = sampler_report(rows, "seeds3", 64, 12.0, "bundled", {}, device="cuda")  # the command and time name it
    assert "`python -m benchmarks.faces --models bundled --device cuda --only alone --repeats 3 --n 64" in on_gpu
    assert "12 minutes of processes sharing one cuda" in on_gpu and "CPU-minutes" not in on_gpu
    # a row with one draw (a run without --repeats): no column, no sentence
    single = [row("blond", None), rows[1]]
    assert all(line.count("|") == 8 for line in alone_table(single)) and repeats_sentence(single) == ""
    for argv in (["--repeats", "3"], ["--repeats", "0", "--only", "alone"], ["--repeats", "2", "--only", "guided"]):
        monkeypatch.setattr(sys, "argv", ["faces", *argv])
        with pytest.raises(SystemExit, match="more than 1 only with --only alone"):
            main()


def test_the_faces_table_refuses_a_device_this_machine_lacks_in_one_line(monkeypatch):
    from benchmarks.faces import main

    for device, message in (("gpu", "'gpu' is not a device name"), ("cuda:99", "no such CUDA device")):
        monkeypatch.setattr(sys, "argv", ["faces", "--device", device, "--only", "alone"])
        with pytest.raises(SystemExit, match=message):
            main()


def test_the_faces_realism_floor_takes_whole_sets_of_the_samples_as_the_fresh_renders_hold():
    """A value a quarter of the fresh renders have holds fewer than 4 sets of 256: the floor averages over the whole
    sets it holds (the table at --n 256 stopped at its first hair row before), and fewer renders than samples are
    refused by `realism` in one line."""
    from benchmarks.faces import floor_sets
    from composable_ebm.evaluation.realism import realism

    pool = torch.rand(992, 3, 4, 4)
    assert floor_sets(pool, 256).shape[0] == 768 and floor_sets(pool, 64).shape[0] == 256  # 3 sets; at most 4
    assert floor_sets(pool[:200], 256).shape[0] == 0
    with pytest.raises(ValueError, match="whole multiple of the 256 samples in real images, got 0"):
        realism(torch.rand(256, 3, 4, 4), floor_sets(pool[:200], 256), pool[:300], lambda x: x.flatten(1))


def test_the_faces_tables_guidance_intervals_parse_or_are_refused_in_one_line():
    from benchmarks.faces import _intervals

    assert _intervals(None) is None
    assert _intervals("smiling=0:0.3,hair=0.1:0.6") == {"smiling": (0.0, 0.3), "hair": (0.1, 0.6)}
    for bad in ("smiling=0.3:0.1", "beard=0:0.3", "smiling=0.3", "smiling=a:b"):
        with pytest.raises(SystemExit, match="write ATTRIBUTE=LO:HI"):
            _intervals(bad)


def test_faces_tables_give_both_judges_and_list_the_rows_they_read_apart():
    from benchmarks.faces import JUDGES_APART, alone_table, judges_sentence, screen_report

    def alone(value: str, first: float, second: float | None) -> dict:
        r = {"kind": "alone", "want": {"hat": [value]}, "joint": first, "fid_ratio": 3.0, "hf_ratio": 0.9,
             "gaps": {"hair": 0.3}, "gaps_training": {"hair": 0.2}}
        return r if second is None else {**r, "judge": {"joint": second, "per_attribute": {"hat": second}}}

    def triple(first: float, second: float, held: bool) -> dict:
        return {"kind": "conjunction", "arity": 3, "form": "guided", "held_out": held, "fid_ratio": 2.0,
                "want": {"smiling": ["yes"], "glasses": ["yes"], "hat": ["yes"]}, "joint": first,
                "judge": {"joint": second}}

    rows = [alone("no", 1.0, 0.98), alone("yes", 0.95, 0.80)]
    lines = alone_table(rows)
    assert "| accuracy | second judge |" in lines[0] and lines[3].startswith("| faces-hat | yes | 0.950 | 0.800 |")
    assert len({line.count("|") for line in lines}) == 1
    guided = [triple(0.9, 0.9 - JUDGES_APART / 2, False), triple(0.9, 0.8, True)]
    text = judges_sentence(rows + guided)
    assert "hat=yes alone 0.950 / 0.800; guided smiling=yes + glasses=yes + hat=yes 0.900 / 0.800." in text
    assert "hat=no alone" not in text and "faces-judge" in text  # within 0.05: not listed
    assert "none." in judges_sentence([alone("no", 1.0, 0.99)])
    assert judges_sentence([alone("no", 1.0, None)]) == ""  # read by one judge: nothing to compare
    assert all(line.count("|") == 8 for line in alone_table([alone("no", 1.0, None)]))
    screen = screen_report([{**g, "arity": a} for a, g in zip((2, 3), guided)], "x", 8, 1.0, "bundled", None)
    table = [line for line in screen.splitlines() if line.startswith("|")]
    assert len({line.count("|") for line in table}) == 1 and "| 0.900 | 0.800 | 2.0 |" in table[-1]


def test_every_faces_report_names_the_settings_its_run_was_given_in_its_command():
    from benchmarks.faces import given_settings, sampler_report, screen_report

    assert given_settings() == ("", [])
    flags, words = given_settings({"levels": 30, "first_steps": 0}, "smiling=2", "smiling=0:0.3")
    assert flags == " --levels 30 --first-steps 0 --scales smiling=2 --intervals smiling=0:0.3"
    assert words == ["levels 30", "first steps 0", "guidance scales smiling=2", "guidance intervals smiling=0:0.3"]
    guided = [{"kind": "conjunction", "arity": a, "held_out": False, "joint": 1.0, "fid_ratio": 2.0} for a in (2, 3)]
    alone = [{"kind": "alone", "expression": "faces-hat[hat=yes]", "want": {"hat": ["yes"]}, "joint": 1.0,
              "fid_ratio": 2.0, "hf_ratio": 1.0, "gaps": {"smiling": 0.1}, "gaps_training": {"smiling": 0.1}}]
    for text in (screen_report(guided, "x", 8, 1.0, "bundled", "smiling=2", "smiling=0:0.3",
                               {"levels": 30, "first_steps": 0}),
                 sampler_report(alone, "x", 8, 1.0, "bundled", {"levels": 30, "first_steps": 0}, "smiling=2",
                                "smiling=0:0.3")):
        command = text.split("`")[1]
        assert flags in command and command.endswith("--n 8 --label x")
        assert "levels 30, first steps 0" in text or "levels 30 and first steps 0" in text


@pytest.mark.compile
@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None,
                    reason="torch.compile on the CPU needs a C++ compiler")
def test_compiled_chain_matches_eager_and_restores():
    """benchmarks/throughput.py --compile: the compiled chain evaluation gives the eager input gradient (within float32
    rounding), leaves the parameters trainable, keeps the differentiable step eager, and restores the eager energy."""
    from benchmarks.throughput import compiled_chain

    model = MLPEnergy(MLPConfig(name="toy", hidden=16, depth=2))
    x = torch.randn(8, 2)
    energies, grads = model.energy_and_grad(x)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    restore = compiled_chain(model)
    compiled_energies, compiled_grads = model.energy_and_grad(x)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # compiled, not a silent eager fallback
    torch.testing.assert_close(compiled_grads, grads, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(compiled_energies, energies, rtol=1e-4, atol=1e-6)
    assert all(p.requires_grad for p in model.parameters())
    assert "energy" not in vars(model)  # the compiled energy is set for the call only

    def parameter_grads() -> list[torch.Tensor]:  # through the last, differentiable step
        model.zero_grad(set_to_none=True)
        _, differentiable = model.energy_and_grad(x.clone().requires_grad_(True), create_graph=True)
        differentiable.pow(2).sum().backward()
        return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in model.parameters()]

    through_compiled = parameter_grads()
    restore()
    assert "energy_and_grad" not in vars(model)
    eager = parameter_grads()
    assert any(g.abs().sum() > 0 for g in eager)
    for a, b in zip(through_compiled, eager, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.compile
def test_compiled_denoising_loss_is_one_graph_with_the_eager_loss_and_gradients():
    """benchmarks/throughput.py --compile, a denoising recipe: the loss compiled whole (the input gradient by
    torch.func.grad inside the graph) draws the eager batch's loss and parameter gradients, as one graph."""
    from benchmarks.throughput import CompiledDenoising
    from composable_ebm.training.denoising import DenoisingObjective
    from tests.test_diffusion import tiny_unet
    from tests.test_energy import randomize

    model = randomize(tiny_unet())
    x = torch.rand(6, *model.input_shape)
    labels = {"color": torch.tensor([0, 1, -1, 1, 0, -1])}

    def run(objective) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        out = objective(x, labels, torch.Generator().manual_seed(3))
        out.loss.backward()
        return out.loss.detach(), [p.grad.clone() for p in model.parameters()]

    loss, grads = run(DenoisingObjective(model))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled_loss, compiled_grads = run(CompiledDenoising(model, backend="aot_eager"))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1  # whole, not a silent eager fallback
    assert not torch._dynamo.utils.counters["graph_break"]
    torch.testing.assert_close(compiled_loss, loss, rtol=1e-4, atol=1e-6)
    assert any(g.abs().sum() > 0 for g in grads)
    for a, b in zip(compiled_grads, grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)


def test_faces_speed_reads_a_setting_as_its_fields_read_it():
    from benchmarks.faces_speed import parse_setting

    assert parse_setting("fast:levels=8,step_size=0.1,predictor=heun,denoise=false") == (
        "fast", {"levels": 8, "step_size": 0.1, "predictor": "heun", "denoise": False})
    with pytest.raises(SystemExit, match="is not field=value"):
        parse_setting("fast:levels")


def test_a_flatten_classifier_reads_where_a_feature_is_and_round_trips(tmp_path):
    """``pooling = "flatten"``: the heads read the whole last feature map (every position's features), and learn a
    mark that differs only in where it is (a dot in the left or the right half); the config round-trips, and an
    unknown pooling is one line naming the choices."""
    from composable_ebm.errors import InvalidInputError
    from composable_ebm.evaluation.classifier import AttributeClassifier, ClassifierConfig, train_classifier

    g = torch.Generator().manual_seed(0)
    side = torch.randint(2, (512,), generator=g)
    images = torch.full((512, 3, 16, 16), 0.5)
    rows = torch.randint(4, 12, (512,), generator=g)
    for i in range(512):  # a dark 2x2 dot at columns 3-4 (left) or 11-12 (right), at a random height
        col = 3 if side[i] == 0 else 11
        images[i, :, rows[i]:rows[i] + 2, col:col + 2] = 0.0
    config = ClassifierConfig(name="dots", image_size=16, attributes={"side": ("left", "right")}, pooling="flatten")
    torch.manual_seed(0)
    classifier = AttributeClassifier(config)
    assert classifier.heads["side"].in_features == 128 * 2 * 2  # width 32 doubled twice, at 16 / 8 = 2 a side
    train_classifier(classifier, images[:384], {"side": side[:384]}, steps=150, batch_size=32, seed=0)
    assert float((classifier.predict(images[384:])["side"] == side[384:]).float().mean()) > 0.95
    save_model(classifier, tmp_path / "dots")
    again = load_model(tmp_path / "dots")
    assert again.config.pooling == "flatten" and torch.equal(again.predict(images[384:])["side"],
                                                              classifier.predict(images[384:])["side"])
    with pytest.raises(InvalidInputError, match="pooling must be one of mean, flatten, got 'max'"):
        ClassifierConfig(name="x", attributes={"side": ("left", "right")}, pooling="max")


def test_a_residual_classifier_learns_what_a_plain_one_does_and_round_trips(tmp_path):
    """``architecture = "residual"`` (a second judge's network): another body, the same heads and features; it learns
    a colour told apart by the mean over positions, the config round-trips, and an unknown one is one line."""
    from composable_ebm.errors import InvalidInputError
    from composable_ebm.evaluation.classifier import AttributeClassifier, ClassifierConfig, train_classifier

    g = torch.Generator().manual_seed(1)
    red = torch.randint(2, (384,), generator=g)
    images = torch.rand(384, 3, 16, 16, generator=g) * 0.5
    images[:, 0] += 0.4 * red.view(-1, 1, 1)  # the red ones are redder everywhere
    config = ClassifierConfig(name="reds", image_size=16, width=8, attributes={"red": ("no", "yes")},
                              architecture="residual")
    torch.manual_seed(0)
    classifier = AttributeClassifier(config)
    plain = AttributeClassifier(dataclasses.replace(config, architecture="plain"))
    assert {type(m).__name__ for m in classifier.body.modules()} != {type(m).__name__ for m in plain.body.modules()}
    assert classifier.features(images[:2]).shape == (2, classifier.feature_dim)
    train_classifier(classifier, images[:256], {"red": red[:256]}, steps=80, batch_size=32, seed=0)
    assert float((classifier.predict(images[256:])["red"] == red[256:]).float().mean()) > 0.95
    save_model(classifier, tmp_path / "reds")
    again = load_model(tmp_path / "reds")
    assert again.config.architecture == "residual"
    assert torch.equal(again.predict(images[256:])["red"], classifier.predict(images[256:])["red"])
    with pytest.raises(InvalidInputError, match="architecture must be one of plain, residual, got 'vit'"):
        ClassifierConfig(name="x", attributes={"red": ("no", "yes")}, architecture="vit")


def test_the_faces_table_of_each_style_covers_its_models_values_and_its_held_out_triple():
    """benchmarks.faces measures either style's whole table: every value of each of its four models alone, and every
    pair and triple of its three composed attributes in both forms, the held-out triple marked (from its recipes)."""
    from benchmarks.faces import TABLES, jobs
    from composable_ebm.data.faces import STYLES

    for style, table in TABLES.items():
        values = STYLES[style].attributes
        rows = jobs(table)
        alone = [r for r in rows if r["kind"] == "alone"]
        assert [next(iter(r["want"].items())) for r in alone] == [(a, [v]) for a in values for v in values[a]]
        named = {m for r in rows for m in re.findall(r"([\w-]+)\[", r["expression"])}
        assert named == {f"{table.prefix}-{a}" for a in values}
        conj = [r for r in rows if r["kind"] == "conjunction"]
        assert len(conj) == 2 * (3 * 4 + 8)  # two forms: 3 pairs of 4 value combinations, 8 triples
        held = [r for r in conj if r["held_out"]]
        assert [r["form"] for r in held] == ["plain", "guided"]
        assert held[0]["target"] == dict.fromkeys(table.composed, "yes") == table.held_out
    assert TABLES["lorelei"].composed == ("smiling", "glasses", "beard")
    screened = [r for r in jobs(TABLES["lorelei"]) if set(r["want"]) <= {"glasses", "beard"}]
    assert {r["expression"] for r in screened if r["kind"] == "conjunction" and r["form"] == "guided"} == {
        f"guided(faces64-glasses[glasses={g}] + faces64-beard[beard={b}])" for g in ("no", "yes") for b in ("no", "yes")}


def test_the_algebra_tables_keep_their_rows_seeds_and_name_only_models_of_their_family():
    """benchmarks.algebra's 64-px table is its own (`--table faces64`): its rows come after the 16-px and Shapes rows,
    so every older row keeps its index (its seed), and each row names only faces64 models, read by their classifier."""
    from benchmarks.algebra import CLASSIFIER, TABLES, rows, table_rows

    every = rows()
    assert [r["index"] for r in every] == list(range(len(every)))
    both, latent = table_rows("both"), table_rows("faces64")
    assert [r["index"] for r in both] == list(range(len(both))) and len(both) + len(latent) == len(every)
    for r in latent:
        assert {m.split("-")[0] for m in re.findall(r"([\w-]+)\[", r["expression"])} == {"faces64"}
    assert {"OR", "NOT", "AND with OR"} <= {r["operator"] for r in latent}
    assert TABLES["faces64"] == ("faces64",) and CLASSIFIER["faces64"] == "faces64-classifier"


def test_the_autoencoder_measure_finds_the_cell_where_an_attribute_is_erased():
    """`benchmarks.autoencoder.worst_cells`: the value of an attribute, and of another, under which reconstructions
    keep it least (a smile kept everywhere but inside a beard)."""
    import torch

    from benchmarks.autoencoder import worst_cells

    beard = torch.tensor([0, 1] * 48)
    smiling = torch.tensor([0, 0, 1, 1] * 24)
    read = {"smiling": smiling, "beard": beard}
    erased = (smiling == 1) & (beard == 1) & (torch.arange(96) % 8 == 3)  # half of the 24 smiling bearded faces
    agree = {"smiling": ~erased, "beard": torch.ones(96, dtype=torch.bool)}
    cells = worst_cells(agree, read)
    assert cells["smiling"] == ["yes", "beard", "yes", 0.5] and cells["beard"][3] == 1.0
