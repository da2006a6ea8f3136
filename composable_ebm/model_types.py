"""The savable model types, one registry (`MODEL_TYPES`): a class registers once, under the one name that both a
model folder's ``config.json`` (``"model_type"``) and a recipe's ``[model] type`` use::

    @register("unet")
    class UNetEnergy(Pretrained, Energy): ...

A network class may offer named starting configs (``presets``: name -> a function returning its config), which a
recipe picks with ``preset =``. The recipe fills the config fields the data decides, where the config has them:
``attributes`` and ``null_condition`` (label dropout), ``in_channels`` and ``image_size``. A module added to
`composable_ebm.nets` registers itself on the first look-up.

The package's own types are found through the ``composable_ebm.model_types`` entry points (pyproject.toml), so a
saved model loads whichever modules were imported before, and another package adds types the same way. The names
``config.json`` files held before the registries were one (``resnet_energy``, ...) still load (`OLD_NAMES`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from composable_ebm.energy import Energy
from composable_ebm.errors import InvalidInputError, ModelFileError
from composable_ebm.registry import Registry

MODEL_TYPES: Registry[type] = Registry("model type", package="composable_ebm.nets", group="composable_ebm.model_types")
"""Model type name -> its class (a network, or the attribute classifier)."""
OLD_NAMES = {"resnet_energy": "resnet", "mlp_energy": "mlp", "denoising_unet_energy": "denoising-unet",
             "attribute_classifier": "attribute-classifier"}
"""Names saved before the two registries were one -> today's."""

M = TypeVar("M", bound=type)


def register(model_type: str) -> Callable[[M], M]:
    """Class decorator: ``@register("resnet")`` makes the class savable, and buildable by recipes when it is an
    energy, under that name. The class takes one typed config (its ``config_class``, stored as ``self.config``); one
    name per class."""

    def add(cls: M) -> M:
        if not isinstance(getattr(cls, "config_class", None), type):
            raise TypeError(f"{cls.__name__} needs a config_class (the config dataclass its constructor takes)")
        try:
            MODEL_TYPES.register(model_type)(cls)
        except ValueError as err:
            raise ValueError(f"model_type {model_type!r} is taken by {MODEL_TYPES.get(model_type).__name__}") from err
        cls.model_type = model_type
        return cls

    return add


def model_class(model_type: str, where: str = "") -> type:
    """The class registered as ``model_type`` (or as the name it had before, `OLD_NAMES`), importing the module its
    entry point names if need be; a `ModelFileError` naming the known types otherwise."""
    try:
        return MODEL_TYPES.get(OLD_NAMES.get(model_type, model_type))
    except InvalidInputError:
        raise ModelFileError(f"{where}unknown model_type {model_type!r}; known types: {MODEL_TYPES.names()}") from None


def network_class(name: str, where: str = "") -> type:
    """The energy network a recipe's ``[model] type`` names; one line naming the networks otherwise."""
    if name in MODEL_TYPES and issubclass(MODEL_TYPES.get(name), Energy):
        return MODEL_TYPES.get(name)
    raise InvalidInputError(f"{where}unknown network type {name!r}; valid choices: {network_names()}")


def network_names() -> list[str]:
    """The registered types that are energies (what a recipe may build)."""
    return [n for n in MODEL_TYPES.names() if issubclass(MODEL_TYPES.get(n), Energy)]
