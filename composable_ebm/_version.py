"""The package version, on its own so that any module can name it without importing the package."""

__version__ = "0.2.0"
