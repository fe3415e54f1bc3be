"""A name -> object registry that refuses duplicates and suggests close matches."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

from depthprobe.probes.errors import unknown

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str, item: T) -> T:
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._items[name] = item
        return item

    def register_class(self, cls: type) -> type:
        """Class decorator: instantiate ``cls`` and register the instance under ``cls.name``."""
        self.register(cls.name, cls())
        return cls

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise unknown(self.kind, name, self._items) from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)
