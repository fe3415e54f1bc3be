"""A name -> object registry that refuses duplicates and suggests close matches.

Entries are either objects (``register``) or lazy references ``"package.module:Object"``
(``register_lazy``) that are imported on first use, so that listing names or suggesting a close
match imports nothing. A lazy reference to a class is instantiated once, like
:meth:`Registry.register_class`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar

from depthprobe.probes.base.errors import unknown

T = TypeVar("T")


def _module_of(item: Any) -> str:
    return getattr(item, "__module__", "") or type(item).__module__


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._lazy: dict[str, str] = {}  # name -> "module:object", imported by get()

    def register(self, name: str, item: T) -> T:
        lazy = self._lazy.get(name)
        if name in self._items or (lazy is not None and lazy.partition(":")[0] != _module_of(item)):
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._lazy.pop(name, None)  # the module a lazy entry names may also register its object
        self._items[name] = item
        return item

    def register_class(self, cls: type) -> type:
        """Class decorator: instantiate ``cls`` and register the instance under ``cls.name``."""
        self.register(cls.name, cls())  # type: ignore[attr-defined]  # plugins declare name on the class
        return cls

    def register_lazy(self, entries: Mapping[str, str]) -> None:
        """Add ``name -> "module:object"`` entries, resolved by :meth:`get` on first use."""
        for name, ref in entries.items():
            if name in self._items or name in self._lazy:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            if ref.count(":") != 1:
                raise ValueError(f"{self.kind} {name!r}: reference {ref!r} is not 'module:object'")
            self._lazy[name] = ref

    def get(self, name: str) -> T:
        if name in self._lazy:
            self._resolve(name)
        try:
            return self._items[name]
        except KeyError:
            raise unknown(self.kind, name, self.names()) from None

    def _resolve(self, name: str) -> None:
        module, _, attr = self._lazy[name].partition(":")
        obj = getattr(importlib.import_module(module), attr)
        if name in self._lazy:  # importing the module did not register it itself
            self._lazy.pop(name)
            self._items[name] = obj() if isinstance(obj, type) else obj

    def names(self) -> list[str]:
        return sorted([*self._items, *self._lazy])

    def __contains__(self, name: object) -> bool:
        return name in self._items or name in self._lazy

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items) + len(self._lazy)
