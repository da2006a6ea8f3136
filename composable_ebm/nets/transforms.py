"""Named input transforms: what a network's towers see of an image, recorded by name in its config.

A transform is an ``nn.Module`` mapping a batch ``(B, C, H, W)`` to one of the same shape, differentiable in the
pixels (a chain's gradient flows through it). A network config lists transforms by name
(``ResNetConfig.input_transforms``); loading a model builds them again from the registry, so a transform holds no
saved weights. What one dataset needs is registered in that dataset's own file::

    @TRANSFORMS.register("my-transform")
    class MyTransform(nn.Module): ...

and found through the ``composable_ebm.input_transforms`` entry points (pyproject.toml) without being imported first.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from composable_ebm.registry import Registry

TRANSFORMS: Registry[type[nn.Module]] = Registry("input transform", group="composable_ebm.input_transforms")
"""Input transforms by name: each entry builds its module with no arguments."""


def build_transforms(names: Sequence[str]) -> nn.Sequential:
    """The named transforms, applied in order (an empty list: the image as it is)."""
    return nn.Sequential(*(TRANSFORMS.get(name)() for name in names))


def apply(transforms: nn.Sequential, x: Tensor) -> Tensor:
    """``x`` through ``transforms`` (the identity when there are none)."""
    return transforms(x) if len(transforms) else x
