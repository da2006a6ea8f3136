"""Energy networks by the name a recipe's ``[model] type =`` gives (`NETWORKS`).

A network is a registered, savable energy class (`composable_ebm.persistence.register`) with a typed
``config_class``; registering it here as well lets recipes build it::

    @NETWORKS.register("unet")
    @register("unet_energy")
    class UNetEnergy(Pretrained, Energy): ...

A class may offer named starting configs (``presets``: name -> a function returning its config), which a recipe
picks with ``preset =``. The recipe fills the config fields the data decides, where the config has them:
``attributes`` and ``null_condition`` (label dropout), ``in_channels`` and ``image_size``.
"""

from __future__ import annotations

from composable_ebm.registry import Registry

NETWORKS: Registry[type] = Registry("network type", package="composable_ebm.nets", group="composable_ebm.networks")
