"""Datasets that work offline: procedural shapes, bundled digits, attribute folders, local CIFAR-10, 2-D toys."""

from composable_ebm.data.datasets import (
    CELEBA_COMPOSITION_ATTRIBUTES,
    CIFAR10_CLASSES,
    SHAPES_ATTRIBUTES,
    ImageDataset,
    attribute_folder,
    cifar10,
    digits,
    read_attribute_table,
    render_shapes,
    shapes,
)
from composable_ebm.data.toy2d import TOY_DENSITIES, sample_toy, toy_log_density

__all__ = [
    "CELEBA_COMPOSITION_ATTRIBUTES",
    "CIFAR10_CLASSES",
    "SHAPES_ATTRIBUTES",
    "TOY_DENSITIES",
    "ImageDataset",
    "attribute_folder",
    "cifar10",
    "digits",
    "read_attribute_table",
    "render_shapes",
    "sample_toy",
    "shapes",
    "toy_log_density",
]
