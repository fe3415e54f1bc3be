"""A name -> object registry that refuses duplicates and suggests close matches.

Entries are either objects (``register``) or lazy references ``"package.module:Object"``
(``register_lazy``) that are imported on first use, so that listing names or suggesting a close
match imports nothing. A lazy reference to a class is instantiated once, like
:meth:`Registry.register_class`, and must give an instance of the registry's ``base`` when it has one.

Registering a name again from the module that registered it replaces the entry, so that re-running a
notebook cell or reloading a module needs no restart; from another module it is refused.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar

from depthprobe.probes.base.errors import ProbeError, unknown

T = TypeVar("T")


def _one_line(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _module_of(item: Any) -> str:
    return getattr(item, "__module__", "") or type(item).__module__


class Registry(Generic[T]):
    def __init__(self, kind: str, base: type | None = None) -> None:
        self.kind = kind
        self.base = base  # what a lazy entry must resolve to (checked on first use)
        self._items: dict[str, T] = {}
        self._lazy: dict[str, str] = {}  # name -> "module:object", imported by get()
        self._origins: dict[str, str] = {}  # name -> where an entry from outside the library comes from

    def register(self, name: str, item: T) -> T:
        """Add ``item`` under ``name``; the same name from the same module replaces the old item."""
        lazy = self._lazy.get(name)
        owner = _module_of(self._items[name]) if name in self._items else lazy and lazy.partition(":")[0]
        if owner and owner != _module_of(item):
            raise ValueError(f"{self.kind} {name!r} is already registered by module {owner}; pick another name")
        self._lazy.pop(name, None)  # the module a lazy entry names may also register its object
        self._items[name] = item
        return item

    def register_class(self, cls: type) -> type:
        """Class decorator: instantiate ``cls`` and register the instance under ``cls.name``."""
        self.register(cls.name, cls())  # type: ignore[attr-defined]  # plugins declare name on the class
        return cls

    def register_lazy(self, entries: Mapping[str, str], origins: Mapping[str, str] | None = None) -> None:
        """Add ``name -> "module:object"`` entries, resolved by :meth:`get` on first use.
        ``origins``: entries from outside the library (what each is called, e.g. "entry point
        m:C of pkg"); one that fails to import is a :class:`ProbeError` naming it, not an
        internal error."""
        self._origins.update(origins or {})
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
        try:
            obj = getattr(importlib.import_module(module), attr)
        except (Exception, SystemExit) as exc:
            if name not in self._origins:  # the library's own entry: an internal error
                raise
            why = f"it called sys.exit({exc.code!r})" if isinstance(exc, SystemExit) else _one_line(exc)
            raise ProbeError(
                f"{self.kind} {name!r} ({self._origins[name]}) failed to load: {why}; "
                "fix or reinstall that package, or uninstall it"
            ) from None
        if name in self._lazy:  # importing the module did not register it itself
            item = obj() if isinstance(obj, type) else obj
            if self.base is not None and not isinstance(item, self.base):
                ref, base = self._lazy[name], self.base.__name__
                raise ProbeError(f"{self.kind} {name!r} ({ref}) is not a {base} subclass; point its entry at one")
            self._lazy.pop(name)
            self._items[name] = item

    def names(self) -> list[str]:
        return sorted([*self._items, *self._lazy])

    def __contains__(self, name: object) -> bool:
        return name in self._items or name in self._lazy

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items) + len(self._lazy)
