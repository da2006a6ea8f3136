"""What makes a network class a model that saves, loads and publishes itself: the `Pretrained` mixin, with the names
of huggingface_hub's ``ModelHubMixin`` (``save_pretrained``, ``from_pretrained``, ``push_to_hub``).

The networks (`composable_ebm.nets`, the attribute classifier) mix it in; its methods are `composable_ebm.models`'s,
imported when called, so importing a network imports neither the Hub, the cards nor the folder format. Nothing that
`composable_ebm.models` imports imports this module, so the call closes no import cycle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import torch

P = TypeVar("P", bound="Pretrained")


class Pretrained:
    """``save_pretrained`` / ``from_pretrained`` / ``push_to_hub`` for a registered class
    (`composable_ebm.model_types.register`): each is `composable_ebm.models`'s, imported when called.

    An energy among them carries ``sampling_defaults`` (`composable_ebm.energy.Energy.sampling_defaults`): the
    settings it was trained for, saved in its ``config.json`` and read by the sampling pipeline.
    """

    card: str | None = None  # the README.md it was loaded with, which a push keeps
    hub_task: str | None = None
    """the Hub's pipeline task a model of this class claims on its card (None: none); an energy's is decided by what
    it generates (`composable_ebm.model_cards.pipeline_tag`)"""

    def save_pretrained(self, folder: str | Path, card: str | None = None) -> Path:
        """Save as ``config.json`` + ``model.safetensors`` with a model card (default: the card it was loaded with,
        else a generated one): `composable_ebm.models.save_pretrained`."""
        from composable_ebm.models import save_pretrained

        return save_pretrained(self, folder, card)

    def push_to_hub(self, repo_id: str, revision: str | None = None, private: bool = False,
                    token: str | None = None, commit_message: str | None = None) -> str:
        """Publish to the Hugging Face Hub (`composable_ebm.models.push_to_hub`); returns the commit URL."""
        from composable_ebm.models import push_to_hub

        return push_to_hub(self, repo_id, revision=revision, private=private, token=token,
                           commit_message=commit_message)

    @classmethod
    def from_pretrained(cls: type[P], name_or_path: str | Path, revision: str | None = None,
                        device: torch.device | str | None = None, **options: Any) -> P:
        """Load a saved model of this class: a folder, a bundled name or ``org/name[@revision]``
        (`composable_ebm.models.from_pretrained`, which names the Hub options it takes)."""
        from composable_ebm.models import from_pretrained

        return from_pretrained(cls, name_or_path, revision, device, **options)
