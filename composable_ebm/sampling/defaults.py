"""A trained model's own sampling defaults: the typed record a model folder's ``config.json`` keeps.

`SamplingDefaults` holds the chain settings a model was trained for (a `SamplerConfig` for an energy without noise
levels, a `LadderConfig` for a noise-conditioned one) and what only a model knows about its place in a composite:
its guidance scale and which of its attributes its augmentation leaves unchanged. The pipeline
(`composable_ebm.pipeline`) reads it; no energy carries it.

On disk (``config.json``'s ``"sampler"`` key) and in a recipe's ``[sampling]`` table it is one flat table: the chain
settings' fields with ``guidance_scale``, ``guidance_interval``, ``guided_alone``, ``augment_preserves`` and
``alone`` beside them. Which of the two the fields are is the model's family, never the table's: a ladder's table
names no chain field, and the other way round.
``alone`` (``[sampling.alone]`` in a recipe) is a table of the same fields that replace the chain settings when the
model is sampled on its own.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from composable_ebm.configs import check_interval, check_range, config_from_dict, config_to_dict, kind_of
from composable_ebm.errors import InvalidInputError
from composable_ebm.sampling.annealed import LadderConfig
from composable_ebm.sampling.chain import Chain, with_overrides
from composable_ebm.sampling.langevin import SamplerConfig

_OWN = ("guidance_scale", "guidance_interval", "augment_preserves", "guided_alone", "alone")
# a chain's fields that a ladder's table saved before the two were separate held at these values, which the ladder
# ignored: dropped when such a config.json is read
_OLD_NEUTRAL = {"noise": (None, "exact"), "rounds": (1,), "augment": (None,), "init_scale": (1,), "clamp": (True, False)}


@dataclass(frozen=True)
class SamplingDefaults:
    """How a trained model is sampled when the caller does not say."""

    sampler: Chain = field(default_factory=SamplerConfig)
    """the chain settings the model was trained for: a `LadderConfig` for a noise-conditioned model"""
    guidance_scale: float = 1.0
    """in a guided composite the model's term ``E(x | c) - E(x | 0)`` is multiplied by this on top of the weight
    written in the expression (classifier-free guidance's scale); alone, only with `guided_alone`"""
    augment_preserves: tuple[str, ...] | None = None
    """which of the model's attributes ``sampler.augment`` leaves unchanged; a composite keeps an augmentation only
    when every term's bound attributes are among its model's. None: not recorded, so a composite with this model
    runs no augmentation"""
    guided_alone: bool = False
    """the model conditioned on its own is sampled in the guided form too, ``E(x | 0) + s (E(x | c) - E(x | 0))``
    with ``s`` its guidance scale (classifier-free guidance), where ``form="auto"``; False: as written"""
    alone: Mapping[str, Any] | None = None
    """fields of ``sampler`` that replace its own when the model is sampled on its own (the model, or one condition
    of it, in either form; `alone_sampler`), e.g. a longer first noise level; a composite that holds the model runs
    ``sampler``. None: ``sampler`` alone too"""
    guidance_interval: tuple[float, float] | None = None
    """the noise levels ``(lo, hi]`` at which `guidance_scale` applies (a noise-conditioned model); at the others the
    model's term counts at scale 1, its plain conditional (`composable_ebm.energy.Guided`). None: every level"""

    def __post_init__(self) -> None:
        if not isinstance(self.sampler, (SamplerConfig, LadderConfig)):
            raise InvalidInputError("SamplingDefaults.sampler must be a SamplerConfig or a LadderConfig, got"
                                    f" {type(self.sampler).__name__}")
        check_range("SamplingDefaults", "guidance_scale", self.guidance_scale, 0.0, 100.0, low_open=True)
        object.__setattr__(self, "guidance_interval", check_interval(self.guidance_interval))
        if not isinstance(self.guided_alone, bool):
            raise InvalidInputError(f"guided_alone must be true or false, got {self.guided_alone!r}")
        if self.alone is not None:
            if not isinstance(self.alone, Mapping):
                raise InvalidInputError(f"alone must be a table of sampler settings, got {self.alone!r}")
            object.__setattr__(self, "alone", dict(self.alone))
            self.alone_sampler()  # an unknown or bad setting is one line now, not at the first sample
        kept = self.augment_preserves
        if kept is not None:
            if isinstance(kept, str) or not all(isinstance(a, str) for a in kept):
                raise InvalidInputError(f"augment_preserves must be a list of attribute names, got {kept!r}")
            object.__setattr__(self, "augment_preserves", tuple(kept))

    def __hash__(self) -> int:  # `alone` is a table (a dict): hashed by its JSON text
        alone = json.dumps(self.alone, sort_keys=True) if self.alone else None
        return hash((self.sampler, self.guidance_scale, self.guidance_interval, self.augment_preserves,
                     self.guided_alone, alone))

    def alone_sampler(self) -> Chain:
        """The chain settings of the model sampled on its own: ``sampler`` with `alone`'s fields."""
        return with_overrides(self.sampler, self.alone, where=" in alone") if self.alone else self.sampler

    def to_flat(self) -> dict[str, Any]:
        """The flat table of ``config.json`` and recipes: the sampler's fields, then this record's own."""
        return {**config_to_dict(self.sampler), "guidance_scale": self.guidance_scale,
                **({"guidance_interval": list(self.guidance_interval)} if self.guidance_interval else {}),
                "augment_preserves": list(self.augment_preserves) if self.augment_preserves is not None else None,
                **({"guided_alone": True} if self.guided_alone else {}),
                **({"alone": dict(self.alone)} if self.alone else {})}

    @classmethod
    def from_flat(cls, table: Mapping[str, Any], *, ladder: bool, saved: bool = False) -> SamplingDefaults:
        """Parse the flat table of a noise-conditioned model (``ladder``: its fields are a `LadderConfig`'s) or of
        another (a `SamplerConfig`'s); unknown keys, the other family's and wrong types are one line naming the valid
        settings. ``saved``: a ``config.json``, which may be in the form written before the two were separate (a
        nested ``ladder`` table and the chain's neutral values), read as its `LadderConfig`."""
        if not isinstance(table, Mapping):
            raise InvalidInputError(f"sampling defaults must be a table of settings, got {type(table).__name__}")
        if saved:
            table = _upgrade(table)
        own = {k: table[k] for k in _OWN if k in table}
        kind = LadderConfig if ladder else SamplerConfig
        fields = {k: v for k, v in table.items() if k not in _OWN}
        mine = {f.name for f in dataclasses.fields(kind)}
        other = sorted((set(fields) - mine) & {f.name for f in dataclasses.fields(SamplerConfig if ladder else LadderConfig)})
        if other:
            family = ("a noise-conditioned model samples down a noise ladder (LadderConfig)" if ladder
                      else "a model without noise levels samples by a chain (SamplerConfig)")
            valid = sorted(mine | set(_OWN))
            raise InvalidInputError(f"sampler setting(s) {other} belong to the other family: {family}; valid"
                                    f" settings: {valid}")
        sampler = config_from_dict(kind, fields)
        guidance = own.get("guidance_scale", 1.0)
        if isinstance(guidance, bool) or not isinstance(guidance, (int, float)):
            raise InvalidInputError(f"guidance_scale must be a number, got {guidance!r}")
        return cls(sampler, float(guidance), own.get("augment_preserves"), own.get("guided_alone", False),
                   own.get("alone"), own.get("guidance_interval"))

    def replace(self, **changes: Any) -> SamplingDefaults:
        """A copy with ``changes`` applied: this record's fields, or any field of ``sampler``."""
        own = {k: v for k, v in changes.items() if k in ("sampler", *_OWN)}
        rest = {k: v for k, v in changes.items() if k not in own}
        if rest:
            own["sampler"] = dataclasses.replace(own.get("sampler", self.sampler), **rest)
        return dataclasses.replace(self, **own)


def _upgrade(table: Mapping[str, Any]) -> dict[str, Any]:
    """A saved table in today's form: a nested ``ladder`` table (in ``alone`` too) becomes the table's own fields, the
    chain's neutral values beside it are dropped, ``ladder: null`` (a chain's) is dropped, ``noise: null`` is
    ``"exact"`` and ``predictor: true`` (false) is ``"ancestral"`` (``"none"``). Each old field's shape is checked
    before it is read: one the old form did not hold is one line naming it."""
    out = dict(table)
    nested = out.pop("ladder", None)
    if nested is not None:
        nested = _old_table(nested, "ladder", "noise-ladder settings")
        for key, neutral in _OLD_NEUTRAL.items():
            if key in out and out[key] in neutral:
                del out[key]
        out = {**out, **nested}
        if out.get("alone") is not None:
            alone = dict(_old_table(out["alone"], "alone", "sampler settings"))
            inner = _old_table(alone.pop("ladder", None) or {}, "alone.ladder", "noise-ladder settings")
            out["alone"] = {**alone, **inner}
    if "noise" in out and out["noise"] is None:
        out["noise"] = "exact"
    if isinstance(out.get("predictor"), bool):  # saved when the ladder's predictor was on or off
        out["predictor"] = "ancestral" if out["predictor"] else "none"
    return out


def _old_table(value: Any, where: str, what: str) -> Mapping[str, Any]:
    """``value`` if it is a table, as the old nested form's ``where`` was; else one line naming it."""
    if not isinstance(value, Mapping):
        raise InvalidInputError(f"sampler.{where} must be a table of {what} (the form saved before chains and ladders"
                                f" were separate), got {kind_of(value)}; valid: a table such as"
                                ' {"levels": 10, "sigma_max": 80}, or its settings in the sampler table itself')
    return value
