"""Named registries: the one extension mechanism for samplers, datasets, networks and input transforms.

Adding one is one new file and one decorator::

    @SAMPLERS.register("hmc")
    def hmc_step(energy, state, config, generator, labels=None): ...

A registry finds its entries three ways, in this order: what was registered by an imported module; the
modules of its own package (``package=``), imported on the first look-up, so a new file in that folder
registers itself; and the ``entry_points`` group named by ``group=``, so another installed package adds
entries without touching this one. An unknown name is one line naming the valid ones.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from composable_ebm.errors import InvalidInputError

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> object, filled by the `register` decorator, a package's modules and an entry-point group.

    Args:
        kind: what the entries are, for messages (``"sampler"``).
        package: a package whose modules are imported on the first look-up (they register themselves).
        group: an ``importlib.metadata`` entry-point group (``name = "module:object"``).
    """

    def __init__(self, kind: str, package: str | None = None, group: str | None = None) -> None:
        self.kind = kind
        self.package = package
        self.group = group
        self._entries: dict[str, T] = {}
        self._loaded = False

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: ``@REGISTRY.register("name")`` adds the decorated object under ``name`` (once)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} name must be a non-empty string, got {name!r}")

        def add(obj: T) -> T:
            known = self._entries.get(name)
            if known is not None and getattr(known, "__qualname__", None) != getattr(obj, "__qualname__", object()):
                raise ValueError(f"{self.kind} {name!r} is taken by {getattr(known, '__qualname__', known)!r}")
            self._entries[name] = obj
            return obj

        return add

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        if self.package is not None:
            package = importlib.import_module(self.package)
            for info in pkgutil.iter_modules(package.__path__):
                if not info.name.startswith("_"):
                    importlib.import_module(f"{self.package}.{info.name}")

    def get(self, name: str, where: str = "") -> T:
        """The entry registered as ``name``; an `InvalidInputError` names the valid ones otherwise."""
        if name not in self._entries:
            self._load()
        if name not in self._entries and self.group is not None:
            for point in entry_points(group=self.group):
                if point.name == name:
                    point.load()  # the module registers its entries as it is imported
                    if name not in self._entries:
                        self._entries[name] = point.load()
        if name not in self._entries:
            raise InvalidInputError(f"{where}unknown {self.kind} {name!r}; valid choices: {self.names()}")
        return self._entries[name]

    def names(self) -> list[str]:
        """Every name this registry can give, sorted."""
        self._load()
        names = set(self._entries)
        if self.group is not None:
            names |= {point.name for point in entry_points(group=self.group)}
        return sorted(names)

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        if name not in self._entries:
            self._load()
        return name in self._entries or name in self.names()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
