"""CIFAR-10 from a local copy of its binary version: the ``cifar10`` dataset (no download here)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from composable_ebm.data.base import DataConfig, ImageDataset, dataset, resolve_root
from composable_ebm.errors import InvalidInputError


CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def cifar10(root: str | Path, train: bool = True) -> ImageDataset:
    """CIFAR-10 from a local copy of its *binary* version (``cifar-10-batches-bin``).

    The binary version is read directly (1 label byte + 3072 pixel bytes per record), so no
    pickled file from outside is ever loaded. No download happens here.
    """
    root = Path(root)
    folder = root if root.name == "cifar-10-batches-bin" else root / "cifar-10-batches-bin"
    names = [f"data_batch_{i}.bin" for i in range(1, 6)] if train else ["test_batch.bin"]
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise FileNotFoundError(
            f"CIFAR-10 (binary version) not found: {folder} lacks {missing}. These machines download nothing; "
            "fetch 'cifar-10-binary.tar.gz' from the CIFAR-10 page elsewhere and extract it under the root."
        )
    raw = torch.cat([torch.frombuffer(bytearray((folder / n).read_bytes()), dtype=torch.uint8) for n in names])
    if raw.numel() % 3073:
        raise ValueError(f"{folder}: file sizes are not a multiple of the 3073-byte CIFAR-10 record")
    records = raw.view(-1, 3073)
    images = records[:, 1:].reshape(-1, 3, 32, 32).clone()
    labels = {"label": records[:, 0].long().clone()}
    return ImageDataset(images, labels, {"label": CIFAR10_CLASSES}, "cifar10")


@dataset("cifar10")
@dataclass(frozen=True)
class Cifar10Data(DataConfig):
    """Recipe settings of CIFAR-10 (``[data] dataset = "cifar10"``): one attribute, ``label``."""

    root: str = ""
    """the folder holding ``cifar-10-batches-bin`` (relative paths start at the recipe's folder)"""
    train: bool = True
    """the training batches (else the test batch)"""

    def build(self, base: Path | None = None) -> ImageDataset:
        if not self.root:
            raise InvalidInputError("dataset 'cifar10' needs data.root, the folder holding cifar-10-batches-bin")
        return cifar10(resolve_root(self.root, base), self.train)

