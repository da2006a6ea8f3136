"""Datasets that work offline, one file each, registered by name (`DATASETS`): procedural ``shapes``, scikit-learn's
``digits``, DiceBear's pixel-art ``faces``, real handwritten ``mnist`` digits, image ``folder``s with attribute tables, local ``cifar10``, 2-D ``toy2d`` densities."""

from composable_ebm.data.base import DATASETS, DataConfig, ImageDataset, combination_mask, dataset
from composable_ebm.data.cifar10 import CIFAR10_CLASSES, Cifar10Data, cifar10
from composable_ebm.data.digits import DigitsData, digits
from composable_ebm.data.faces import FACES_ATTRIBUTES, FacesData, faces, render_faces
from composable_ebm.data.folder import FolderData, attribute_folder, read_attribute_table
from composable_ebm.data.mnist import MNIST_ATTRIBUTES, MnistData, mnist, write_mnist
from composable_ebm.data.shapes import SHAPES_ATTRIBUTES, ShapesData, render_shapes, shapes
from composable_ebm.data.toy2d import TOY_DENSITIES, ToyData, sample_toy, toy_log_density

__all__ = [
    "CIFAR10_CLASSES",
    "DATASETS",
    "SHAPES_ATTRIBUTES",
    "TOY_DENSITIES",
    "Cifar10Data",
    "DataConfig",
    "DigitsData",
    "FACES_ATTRIBUTES",
    "FacesData",
    "FolderData",
    "MNIST_ATTRIBUTES",
    "MnistData",
    "ImageDataset",
    "ShapesData",
    "ToyData",
    "attribute_folder",
    "cifar10",
    "combination_mask",
    "dataset",
    "digits",
    "faces",
    "mnist",
    "read_attribute_table",
    "render_faces",
    "render_shapes",
    "sample_toy",
    "shapes",
    "toy_log_density",
    "write_mnist",
]
