"""A trained model's own sampling defaults: the typed record a model folder's ``config.json`` keeps.

`SamplingDefaults` holds the chain settings a model was trained for (`SamplerConfig`) and what only a model
knows about its place in a composite: its guidance scale and which of its attributes its augmentation leaves
unchanged. The pipeline (`composable_ebm.pipeline`) reads it; no energy carries it.

On disk (``config.json``'s ``"sampler"`` key) and in a recipe's ``[sampling]`` table it is one flat table: the
`SamplerConfig` fields with ``guidance_scale``, ``guidance_interval``, ``guided_alone``, ``augment_preserves`` and
``alone`` beside them.
``alone`` (``[sampling.alone]`` in a recipe) is a table of `SamplerConfig` fields that replace the chain settings
when the model is sampled on its own.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from composable_ebm.configs import check_interval, check_range, config_from_dict, config_to_dict
from composable_ebm.errors import InvalidInputError
from composable_ebm.sampling.runner import with_overrides
from composable_ebm.sampling.transitions import SamplerConfig

_OWN = ("guidance_scale", "guidance_interval", "augment_preserves", "guided_alone", "alone")


@dataclass(frozen=True)
class SamplingDefaults:
    """How a trained model is sampled when the caller does not say."""

    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    """the chain settings the model was trained for"""
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
    """`SamplerConfig` fields that replace ``sampler``'s when the model is sampled on its own (the model, or one
    condition of it, in either form; `alone_sampler`), e.g. a longer first noise level; a composite that holds the
    model runs ``sampler``. A field that is a table (``ladder``) takes the fields given over ``sampler``'s. None:
    ``sampler`` alone too"""
    guidance_interval: tuple[float, float] | None = None
    """the noise levels ``(lo, hi]`` at which `guidance_scale` applies (a noise-conditioned model); at the others the
    model's term counts at scale 1, its plain conditional (`composable_ebm.energy.Guided`). None: every level"""

    def __post_init__(self) -> None:
        if not isinstance(self.sampler, SamplerConfig):
            raise InvalidInputError(f"SamplingDefaults.sampler must be a SamplerConfig, got {type(self.sampler).__name__}")
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

    def alone_sampler(self) -> SamplerConfig:
        """The chain settings of the model sampled on its own: ``sampler`` with `alone`'s fields."""
        if not self.alone:
            return self.sampler
        base = config_to_dict(self.sampler)
        merged = {k: {**base[k], **v} if isinstance(v, Mapping) and isinstance(base.get(k), dict) else v
                  for k, v in self.alone.items()}
        return with_overrides(self.sampler, merged, where=" in alone")

    def to_flat(self) -> dict[str, Any]:
        """The flat table of ``config.json`` and recipes: the sampler's fields, then this record's own."""
        return {**config_to_dict(self.sampler), "guidance_scale": self.guidance_scale,
                **({"guidance_interval": list(self.guidance_interval)} if self.guidance_interval else {}),
                "augment_preserves": list(self.augment_preserves) if self.augment_preserves is not None else None,
                **({"guided_alone": True} if self.guided_alone else {}),
                **({"alone": dict(self.alone)} if self.alone else {})}

    @classmethod
    def from_flat(cls, table: Mapping[str, Any]) -> SamplingDefaults:
        """Parse the flat table; unknown keys and wrong types are one line naming the valid settings."""
        if not isinstance(table, Mapping):
            raise InvalidInputError(f"sampling defaults must be a table of settings, got {type(table).__name__}")
        own = {k: table[k] for k in _OWN if k in table}
        sampler = config_from_dict(SamplerConfig, {k: v for k, v in table.items() if k not in _OWN})
        guidance = own.get("guidance_scale", 1.0)
        if isinstance(guidance, bool) or not isinstance(guidance, (int, float)):
            raise InvalidInputError(f"guidance_scale must be a number, got {guidance!r}")
        return cls(sampler, float(guidance), own.get("augment_preserves"), own.get("guided_alone", False),
                   own.get("alone"), own.get("guidance_interval"))

    def replace(self, **changes: Any) -> SamplingDefaults:
        """A copy with ``changes`` applied: this record's fields, or any `SamplerConfig` field."""
        own = {k: v for k, v in changes.items() if k in ("sampler", *_OWN)}
        rest = {k: v for k, v in changes.items() if k not in own}
        if rest:
            own["sampler"] = dataclasses.replace(own.get("sampler", self.sampler), **rest)
        return dataclasses.replace(self, **own)
