"""The trainer's settings (`TrainerConfig`, with its objective's: `ContrastiveConfig` or `DenoisingConfig`), what
training data is, and how two settings differ (for resume)."""

from __future__ import annotations

import math
from collections.abc import Mapping
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from torch import Tensor

from composable_ebm.configs import JSONConfig, check_range, check_size, config_from_dict, config_to_dict
from composable_ebm.errors import InvalidInputError
from composable_ebm.sampling import AugmentConfig, SamplerConfig
from composable_ebm.accel.precision import PRECISIONS
from composable_ebm.training.posthoc import gamma_of

# settings a resume may change without being asked: how long to train, how often to log or save, and the arithmetic
RESUMABLE_CHANGES = frozenset({"steps", "log_every", "checkpoint_every", "posthoc_every", "precision"})
# settings removed from TrainerConfig, with the value that behaves as the trainer does now: a checkpoint that saved
# that value resumes as if the setting had never been there
REMOVED_SETTINGS = {"negative_labels": "positives"}
LR_SCHEDULES = ("constant", "cosine")
WEIGHTINGS = ("noise", "edm")
"""How the denoising loss may weigh its noise levels (`DenoisingConfig.loss_weighting`)."""


@dataclass(frozen=True)
class ContrastiveConfig(JSONConfig):
    """Algorithm 1's objective (improved contrastive divergence): the training chains, their replay buffer and the
    loss terms. Defaults follow the paper (32x32), or the authors' code where the paper is silent."""

    sampler: SamplerConfig = field(default_factory=lambda: SamplerConfig(step_size=500.0, noise=0.001, steps=40))
    """The training chains: `steps` K (Langevin steps per iteration), step size and noise; Langevin only."""
    chain_steps_max: int | None = None
    """Each iteration's chains run a number of steps drawn uniformly from ``sampler.steps`` to this (inclusive), so
    the model learns samples that look like its data however long a chain has run, not only after exactly K steps
    (short-run chains trained at one length draw another mix of objects ten steps either side of it). None: K."""
    chain_augment: AugmentConfig | None = field(default_factory=lambda: AugmentConfig(crop_scale=(0.02, 1.0)))
    """Augmentation of chain starts drawn from the buffer; `false` in a recipe turns it off."""
    label_weight: float = 0.0
    """L_label: positives under another value as negatives (not in the paper; 0: off)"""
    buffer_size: int = 10000
    """Replay buffer capacity (samples)."""
    buffer_policy: Literal["reservoir", "fifo"] = "reservoir"
    """Which samples the full buffer keeps: a uniform `reservoir` sample of all, or the newest (`fifo`)."""
    reinit_prob: float = 0.001
    """chain starts from fresh noise (experiments: 0.1%; Algorithm 1: 1%)"""
    data_start_prob: float = 0.0
    """Probability that a chain starts from a training image drawn independently of its positive (so
    usually of other attribute values) and runs under the positive's condition: the model learns to
    edit its attribute into an image whose other attributes it keeps. Not in the paper; 0: off."""
    cd_l2: float = 1.0
    """alpha of the L2 energy regulariser (authors' code)"""
    kl_opt: bool = True
    """L_opt: energy of samples through the last Langevin step"""
    opt_weight: float = 1.0
    """Weight of L_opt."""
    kl_ent: bool = True
    """L_ent: nearest-neighbour entropy against past samples"""
    ent_weight: float = 0.3
    """authors' code"""
    ent_bank: int = 100
    """|X|, past samples for the nearest-neighbour distance (paper: 100)"""
    ent_min_buffer: int = 100
    """L_ent starts once the buffer holds this many samples"""
    max_energy_diff: float = 1e4
    """|mean E(x+) - mean E(x-)| above this is a fault"""

    def __post_init__(self) -> None:
        owner = "ContrastiveConfig"
        if not isinstance(self.sampler, SamplerConfig):
            raise InvalidInputError(f"{owner}.sampler must be a SamplerConfig, got {type(self.sampler).__name__}")
        if self.sampler.total_steps < 1:
            raise ValueError("training needs at least one Langevin step per iteration (sampler.steps >= 1)")
        if self.sampler.method != "langevin":
            raise ValueError(
                f"training chains use method 'langevin' (the KL loss differentiates through a Langevin step),"
                f" got {self.sampler.method!r}; MALA is for sampling"
            )
        if self.sampler.augment is not None:
            raise InvalidInputError(
                "the training chain's sampler.augment is set, but a training chain takes one augmentation:"
                " chain_augment, of its start ([trainer.chain_augment] in a recipe); move the setting there"
                " ([sampling.augment] is the sampling chains')")
        check_range(owner, "reinit_prob", self.reinit_prob, 0.0, 1.0)
        check_range(owner, "data_start_prob", self.data_start_prob, 0.0, 1.0)
        for name in ("cd_l2", "opt_weight", "ent_weight", "label_weight"):
            check_range(owner, name, getattr(self, name), 0.0)
        check_range(owner, "max_energy_diff", self.max_energy_diff, 0.0, low_open=True)
        check_size(owner, "buffer_size", self.buffer_size, low=0, high=1 << 24)
        check_size(owner, "ent_bank", self.ent_bank, high=1 << 20)
        check_size(owner, "ent_min_buffer", self.ent_min_buffer, low=0, high=1 << 24)
        if self.buffer_policy not in ("reservoir", "fifo"):
            raise InvalidInputError(f"unknown {owner}.buffer_policy {self.buffer_policy!r}; valid choices:"
                                    " ['reservoir', 'fifo']")
        if self.chain_steps_max is not None:  # from sampler.steps up, within the sampler's own bound on steps
            check_size(owner, "chain_steps_max", self.chain_steps_max, low=self.sampler.steps, high=1 << 24)
            if self.sampler.rounds != 1:
                raise InvalidInputError(f"{owner}.chain_steps_max needs sampler.rounds = 1 (one round of steps)")


@dataclass(frozen=True)
class DenoisingConfig(JSONConfig):
    """Denoising score matching's objective, for noise-conditioned models (`composable_ebm.training.denoising`)."""

    loss_weighting: Literal["noise", "edm"] = "noise"
    """How the loss weighs its noise levels: `noise`, the squared error of the predicted noise at every level alike
    (Ho et al. 2020); `edm`, that error times ``1 + sigma^2 / sigma_data^2``, which is Karras et al. 2022's weighting
    of the denoised image's error (the high levels, where an image's layout and colours are decided, count more),
    scaled to a mean of 1 over the levels trained on. `edm` needs a model that states its ``sigma_data``."""
    levels: Literal["log-uniform", "log-normal"] = "log-uniform"
    """How each item's noise level is drawn within the model's ``noise_range``: `log-uniform`, every octave alike;
    `log-normal`, ``ln sigma`` from a normal of mean ``level_mean`` and std ``level_std`` truncated to the range
    (Karras et al. 2022's training distribution: iterations spent where the loss can still fall, the middle levels,
    instead of the highest and lowest)."""
    level_mean: float = -1.2
    """The mean of ``ln sigma`` under `log-normal` levels (Karras et al. 2022's -1.2, for data of std 0.5)."""
    level_std: float = 1.2
    """The std of ``ln sigma`` under `log-normal` levels (Karras et al. 2022's 1.2)."""
    classifier_weight: float = 0.0
    """Weight of the implicit classifier's cross-entropy (0: off): at each noised training point, for each attribute,
    ``softmax_c(-E(x_sigma, sigma | c) + log p(c))`` over the attribute's values (``p(c)``: their shares of the
    training labels) should read the value the point was drawn from. Denoising trains only an energy's gradient;
    this term also fixes its level per condition, so that ``E(x | a) - E(x | b)`` is the log-odds of ``b`` over
    ``a`` at that level and a disjunction's ``-logsumexp`` weighs its parts as their densities (as in joint energy
    models, Grathwohl et al. 2020, and diffusion classifiers). One extra forward and backward pass per value of each
    attribute, on the items not dropped to the null condition."""
    precision: Literal["float32", "bfloat16"] = "float32"
    """Arithmetic of the loss: `bfloat16` runs it under autocast (matrix products and convolutions in bfloat16;
    weights, optimiser, EMA and the loss in float32). Falls back to float32, with a warning, on a GPU without
    bfloat16. Speed and what it changes: docs/benchmarks.md."""

    def __post_init__(self) -> None:
        if self.loss_weighting not in WEIGHTINGS:
            raise InvalidInputError(f"unknown loss_weighting {self.loss_weighting!r}; valid choices: {list(WEIGHTINGS)}")
        if self.precision not in PRECISIONS:
            raise InvalidInputError(f"unknown precision {self.precision!r}; valid choices: {list(PRECISIONS)}")
        check_range("DenoisingConfig", "classifier_weight", self.classifier_weight, 0.0)
        check_range("DenoisingConfig", "level_mean", self.level_mean, -20.0, 20.0)
        check_range("DenoisingConfig", "level_std", self.level_std, 0.0, 20.0, low_open=True)


ObjectiveConfig = ContrastiveConfig | DenoisingConfig
"""The settings of a training objective: contrastive divergence (a model of clean data) or denoising score matching
(a noise-conditioned model)."""


@dataclass(frozen=True)
class TrainerConfig(JSONConfig):
    """What every training run has, whichever its objective: data, optimiser, schedule, EMA, faults, checkpoints and
    logging, and the objective's own settings (`objective`).

    In a recipe's ``[trainer]`` table and in a checkpoint the objective's fields sit beside these in one flat table
    (`to_dict`, `from_flat`); the model's family decides which objective's they are."""

    steps: int = 10000
    """training iterations"""
    batch_size: int = 16
    """Positives (and chains) per iteration and rank."""
    lr: float = 2e-4
    """Adam (authors' code); the peak of `lr_schedule`"""
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """How the learning rate moves over the run (`learning_rate`): ``constant`` keeps `lr`; ``cosine`` lowers it
    from `lr` to `lr_min` along a half cosine (Loshchilov & Hutter 2017) by the run's last step (``--steps``, or
    `steps`); a run resumed with another total continues on the new curve from its step"""
    lr_min: float = 0.0
    """where the cosine schedule ends"""
    warmup_steps: int = 0
    """the first this many steps raise the learning rate linearly from ``lr / warmup_steps`` to the schedule's"""
    betas: tuple[float, float] = (0.0, 0.9)
    """Adam betas (authors' code)"""
    grad_clip: float | None = 0.5
    """max global gradient norm (authors' code); None: no clipping"""
    ema_decay: float = 0.9999
    """paper; the authors' code uses 0.99"""
    ema_warmup: bool = True
    """decay min(ema_decay, (1 + t) / (10 + t)) at step t, so the EMA is useful early. The warm-up is below 0.999
    until step 8,990: there it is a power-function average of relative std 0.09 (as `posthoc_ema` counts them)"""
    posthoc_ema: tuple[float, ...] = ()
    """Relative stds of power-function averages of the weights kept beside the EMA and written to ``RUN/ema/``
    every `posthoc_every` steps, from which ``cebm export RUN --ema-std S`` makes the average of any relative std
    in (0, 0.28] after training (`composable_ebm.training.posthoc`; Karras et al. 2024 keep 0.05 and 0.10). Empty:
    none"""
    posthoc_every: int = 100
    """Write the post-hoc averages every this many steps (and at the run's last step). The made average is as good
    as they are dense: 20-30 written over the run rebuild relative stds 0.03-0.25 to within a few percent of their
    distance from the last weights (tests/test_posthoc.py)"""
    data_augment: AugmentConfig | None = None
    """augmentation of the positives (changes only what the model ignores)"""
    label_dropout: float = 0.0
    """Probability that a positive (and the chain paired with it) runs under the null condition, every
    attribute unbound: trains the model's unconditional energy, which guided composition needs
    (Composable Diffusion, Liu et al. 2022, and Du et al. 2023 use 5-10%). 0: off."""
    dequantize: bool = True
    """x * 255/256 + U(0, 1/256) for data in [0, 1] (authors' code)"""
    on_fault: Literal["rollback", "stop"] = "rollback"
    """On a non-finite or exploding step: `rollback` to the last checkpoint with a new seed, or `stop`."""
    max_rollbacks: int = 5
    """Rollbacks allowed before the run stops."""
    log_every: int = 10
    """JSONL (and TensorBoard) record every this many steps, with gradient norms"""
    checkpoint_every: int = 100
    """Write the full training state every this many steps."""
    seed: int = 0
    """Seeds the network's initialisation, the data order, chains and augmentations."""
    objective: ContrastiveConfig | DenoisingConfig | None = None
    """The objective's settings: a `ContrastiveConfig` (a model of clean data) or a `DenoisingConfig` (a
    noise-conditioned model); None: the defaults of the model's family (`for_model`)."""

    def __post_init__(self) -> None:
        owner = "TrainerConfig"
        if self.objective is not None and not isinstance(self.objective, (ContrastiveConfig, DenoisingConfig)):
            raise InvalidInputError(f"{owner}.objective must be a ContrastiveConfig or a DenoisingConfig, got"
                                    f" {type(self.objective).__name__}")
        check_range(owner, "ema_decay", self.ema_decay, 0.0, 1.0, high_open=True)
        for std in self.posthoc_ema:
            gamma_of(std)  # one line naming the valid range
        if len(set(self.posthoc_ema)) != len(self.posthoc_ema):
            raise InvalidInputError(f"{owner}.posthoc_ema lists a std twice: {list(self.posthoc_ema)}")
        check_size(owner, "posthoc_every", self.posthoc_every, low=1, high=1 << 40)
        check_size(owner, "seed", self.seed, low=0, high=2**62)  # rollbacks and ranks add offsets to it
        check_range(owner, "label_dropout", self.label_dropout, 0.0, 1.0, high_open=True)
        check_range(owner, "lr", self.lr, 0.0, low_open=True)
        if self.lr_schedule not in LR_SCHEDULES:
            raise InvalidInputError(f"unknown TrainerConfig.lr_schedule {self.lr_schedule!r}; valid choices:"
                                    f" {list(LR_SCHEDULES)}")
        check_range(owner, "lr_min", self.lr_min, 0.0, self.lr)
        check_size(owner, "warmup_steps", self.warmup_steps, low=0, high=1 << 40)
        for i, beta in enumerate(self.betas):
            check_range(owner, f"betas[{i}]", beta, 0.0, 1.0, high_open=True)
        if self.grad_clip is not None:
            check_range(owner, "grad_clip", self.grad_clip, 0.0, low_open=True)
        check_size(owner, "batch_size", self.batch_size, high=1 << 20)
        check_size(owner, "max_rollbacks", self.max_rollbacks, low=0, high=1000)
        check_size(owner, "steps", self.steps, low=0, high=1 << 40)
        check_size(owner, "log_every", self.log_every, high=1 << 40)
        check_size(owner, "checkpoint_every", self.checkpoint_every, high=1 << 40)
        if self.on_fault not in ("rollback", "stop"):
            raise InvalidInputError(f"unknown on_fault {self.on_fault!r}; valid choices: ['rollback', 'stop']")

    def for_model(self, denoising: bool) -> TrainerConfig:
        """This config with its objective: the one it holds, checked against the model's family (``denoising``: a
        noise-conditioned model), or that family's defaults. Another family's objective is one line."""
        kind = DenoisingConfig if denoising else ContrastiveConfig
        if self.objective is None:
            return dataclasses.replace(self, objective=kind())
        if not isinstance(self.objective, kind):
            raise InvalidInputError(f"{_FAMILY[kind]}, not with a {type(self.objective).__name__}; valid choices:"
                                    f" TrainerConfig(objective={kind.__name__}(...)), or none (its defaults)")
        return self

    def with_objective(self, **changes: Any) -> TrainerConfig:
        """This config with fields of its objective changed (``sampler=...``, ``precision=...``)."""
        if self.objective is None:
            raise InvalidInputError("this TrainerConfig has no objective yet; valid choices: for_model(...) first, or"
                                    " TrainerConfig(objective=...)")
        return dataclasses.replace(self, objective=dataclasses.replace(self.objective, **changes))

    def to_dict(self) -> dict[str, Any]:
        """One flat table, as a recipe's ``[trainer]`` and a checkpoint hold it: these fields and the objective's."""
        own = {k: v for k, v in config_to_dict(self).items() if k != "objective"}
        return {**own, **(config_to_dict(self.objective) if self.objective is not None else {})}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainerConfig:
        """`from_flat`, the family read from the objective fields the table names (none: no objective)."""
        return cls.from_flat(data)

    @classmethod
    def from_flat(cls, table: Mapping[str, Any], denoising: bool | None = None) -> TrainerConfig:
        """Parse a flat ``[trainer]`` table: this class's fields, and the objective's of the model's family
        (``denoising``: a noise-conditioned model's `DenoisingConfig`, else a `ContrastiveConfig`; None: the family
        whose fields the table names). A field of the other family's objective, or of none, is one line naming the
        valid ones."""
        if not isinstance(table, Mapping):
            raise InvalidInputError(f"TrainerConfig expects a table of settings, got {type(table).__name__}")
        shared = {f.name for f in dataclasses.fields(cls)} - {"objective"}
        names = {kind: {f.name for f in dataclasses.fields(kind)} for kind in (ContrastiveConfig, DenoisingConfig)}
        rest = {k: v for k, v in table.items() if k not in shared}
        if denoising is None:
            named = [kind for kind, fields in names.items() if set(rest) & fields]
            kind = named[0] if named else None
            if len(named) > 1:
                raise InvalidInputError(f"TrainerConfig settings {sorted(set(rest) & names[DenoisingConfig])} are"
                                        " denoising score matching's and"
                                        f" {sorted(set(rest) & names[ContrastiveConfig])} contrastive divergence's;"
                                        " a run trains by one objective")
        else:
            kind = DenoisingConfig if denoising else ContrastiveConfig
        other = ContrastiveConfig if kind is DenoisingConfig else DenoisingConfig
        foreign = sorted(set(rest) & names[other])
        if foreign:
            raise InvalidInputError(f"[trainer] setting(s) {foreign} are {_OBJECTIVE_NAME[other]}'s:"
                                    f" {_FAMILY[kind]}; valid settings: {sorted(shared | names[kind])}")
        unknown = sorted(set(rest) - (names[kind] if kind is not None else set()))
        if unknown:
            valid = sorted(shared | (names[kind] if kind is not None else names[ContrastiveConfig] | names[DenoisingConfig]))
            raise InvalidInputError(f"unknown TrainerConfig setting(s) {unknown}; valid settings: {valid}")
        objective = config_from_dict(kind, rest) if kind is not None else None
        base = config_from_dict(cls, {k: v for k, v in table.items() if k in shared})
        return dataclasses.replace(base, objective=objective)


_OBJECTIVE_NAME = {ContrastiveConfig: "contrastive divergence", DenoisingConfig: "denoising score matching"}
_FAMILY = {ContrastiveConfig: "a model of clean data trains by contrastive divergence (ContrastiveConfig)",
           DenoisingConfig: "a noise-conditioned model trains by denoising score matching (DenoisingConfig)"}


def learning_rate(config: TrainerConfig, step: int, total: int) -> float:
    """The learning rate of iteration ``step`` (from 0) of a run of ``total`` iterations under ``config``'s
    `lr_schedule` and `warmup_steps`."""
    if config.lr_schedule == "cosine":
        progress = min(step / max(total - 1, 1), 1.0)
        rate = config.lr_min + 0.5 * (config.lr - config.lr_min) * (1.0 + math.cos(math.pi * progress))
    else:
        rate = config.lr
    if step < config.warmup_steps:
        rate *= (step + 1) / config.warmup_steps
    return rate


class TrainingData(Protocol):
    """In-memory training data: ``images`` ``(N, *input_shape)`` (float in the value range, or
    uint8 scaled by 1/255) and ``labels``: attribute -> value indices ``(N,)``."""

    images: Tensor
    labels: Mapping[str, Tensor]


def config_differences(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> dict[str, tuple[Any, Any]]:
    """Dotted keys whose values differ between two nested settings dicts: ``key -> (old, new)``."""
    out: dict[str, tuple[Any, Any]] = {}
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out.update(config_differences(a, b, f"{prefix}{key}."))
        elif a != b:
            out[f"{prefix}{key}"] = (a, b)
    return out


def with_defaults(saved: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``saved`` with every key it lacks taken from ``defaults`` (recursively into nested settings)."""
    out = dict(saved)
    for key, value in defaults.items():
        if key not in out:
            out[key] = value
        elif isinstance(out[key], Mapping) and isinstance(value, Mapping):
            out[key] = with_defaults(out[key], value)
    return out
