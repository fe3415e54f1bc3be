"""Reading `key=value` strings (CLI options, model specs) into typed dataclass fields."""

from __future__ import annotations

import ast
import dataclasses
import math
import typing
from typing import Any

from depthprobe.probes.base.errors import ProbeError, suggest

_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


def annotation_text(typ: Any) -> str:
    """An annotation as source text, whether the declaring module uses ``from __future__ import
    annotations`` (a string) or not (the type itself): ``int`` -> ``int``,
    ``typing.Optional[typing.Literal['a']]`` -> ``Literal['a'] | None``."""
    text = typ.__name__ if isinstance(typ, type) else str(typ).strip().replace("typing.", "")
    if text.startswith("Optional[") and text.endswith("]"):
        text = text[len("Optional[") : -1] + " | None"
    return text


def choices(typ: Any) -> tuple[Any, ...] | None:
    """The values of a ``Literal[...]`` annotation (as a string), or None for any other type."""
    text = annotation_text(typ)
    if not text.startswith("Literal["):
        return None
    values = ast.literal_eval("(" + text[len("Literal[") : -1] + ",)")
    return tuple(values)


def _either(names: list[str]) -> str:
    """['a', 'b', 'c'] -> 'a, b or c'."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def check_choices(obj: Any, where: str) -> Any:
    """Fail with one line naming the choices when a ``Literal[...]`` field of the dataclass ``obj``
    holds another value (for dataclasses built directly in Python, not through :func:`coerce`)."""
    for name, text in field_types(obj).items():
        allowed = choices(text.removesuffix("| None").strip())
        value = getattr(obj, name)
        if allowed is not None and not (value is None and text.endswith("| None")):
            check_choice(value, allowed, where, name)
    return obj


def check_choice(value: Any, allowed: tuple[Any, ...], where: str, key: str = "", flag: str = "") -> Any:
    """``value`` if it is one of ``allowed``; else one line with a close match and the choices
    (written as ``FLAG KEY=choice`` when a ``flag`` such as ``-O`` is given)."""
    if value in allowed and not (isinstance(value, bool) and not any(isinstance(a, bool) for a in allowed)):
        return value
    names = [str(a) for a in allowed]
    fix = " or ".join(f"{flag} {key}={n}" for n in names) if flag and key else _either(names)
    raise ProbeError(f"{where}: unknown {key or 'value'} {value!r}{suggest(str(value), names)}; use {fix}")


def coerce(value: Any, typ: Any, where: str, key: str = "", flag: str = "") -> Any:
    """Read ``value`` as the (string) annotation ``typ``: bool, int, float, tuple[...], X | None,
    Literal[...] (the value must be one of the choices, whoever gives it).

    Other non-strings pass through unchanged (Python callers give typed values)."""
    text = annotation_text(typ)
    optional = text.endswith("| None")
    allowed = choices(text.removesuffix("| None").strip())
    if allowed is not None:
        if optional and (value is None or (isinstance(value, str) and value.lower() == "none")):
            return None
        return check_choice(value, allowed, where, key, flag)
    if not isinstance(value, str):
        return value
    kinds = [k.strip() for k in text.split("|")]
    base = kinds[0]
    try:
        if value.lower() == "none" and "None" in kinds:
            return None
        if base == "bool":
            if value.lower() not in _TRUE + _FALSE:
                raise ValueError
            return value.lower() in _TRUE
        if base == "int":
            return int(value)
        if base == "float":
            return float(value)
        if base.startswith("tuple["):
            inner = base[len("tuple[") :].split(",")[0].strip()
            cast = {"int": int, "float": float}.get(inner, str)
            return tuple(cast(p.strip()) for p in value.split(",") if p.strip())
    except ValueError:
        raise ProbeError(f"{where}: cannot read {value!r} as {typ}") from None
    return value


def parse_pairs(spec: str, kind: str, keys: list[str], example: str) -> dict[str, str]:
    """``kind:k=v,k=v`` -> {k: v}; unknown keys fail with a close-match suggestion.

    Dashes in keys read as underscores (``attn-only`` = ``attn_only``)."""
    body = spec.split(":", 1)[1] if ":" in spec else ""
    pairs: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in body.split(","))):
        if "=" not in part:
            raise ProbeError(f"{kind} spec: expected key=value, got {part!r} (e.g. {example})")
        key, value = (s.strip() for s in part.split("=", 1))
        key = key.replace("-", "_")
        if key not in keys:
            raise ProbeError(f"{kind} spec: unknown key {key!r}{suggest(key, keys)}; keys: {', '.join(keys)}")
        pairs[key] = value
    return pairs


_PLAIN = frozenset({"bool", "int", "float", "str", "bytes", "Any", "Path", "object"})


def field_types(cls: Any) -> dict[str, str]:
    """Each field's annotation as text (:func:`annotation_text`), with a type alias of a
    ``Literal`` (``Method = Literal["a", "b"]``; ``method: Method``) spelled out, so that its choices
    are checked like an inline ``Literal[...]``."""
    texts = {f.name: annotation_text(f.type) for f in dataclasses.fields(cls)}
    aliases = [n for n, t in texts.items() if _bare_name(t.removesuffix("| None").strip())]
    if not aliases:
        return texts
    try:
        hints = typing.get_type_hints(cls if isinstance(cls, type) else type(cls))
    except Exception:  # a name imported only for type checkers: keep the text as written
        return texts
    for name in aliases:
        resolved = annotation_text(hints.get(name, texts[name]))
        if "Literal[" in resolved:
            texts[name] = resolved
    return texts


def _bare_name(text: str) -> bool:
    """``Method`` or ``mod.Method`` (a name that may be an alias), not ``int`` or ``tuple[int, ...]``."""
    return text.replace(".", "_").isidentifier() and text not in _PLAIN


SEED_MAX = 2**32 - 1  # numpy's RandomState accepts 0..2**32-1; torch accepts more, so this is the bound


def check_seed(seed: Any, where: str = "--seed") -> None:
    """Seeds are integers in 0..2**32-1 (what numpy, torch and Python's random all accept)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        raise ProbeError(f"{where} must be an integer from 0 to {SEED_MAX} (2**32-1), got {seed}")


def ranged(
    default: Any,
    *,
    min: float | None = None,
    max: float | None = None,
    above: float | None = None,
    below: float | None = None,
) -> Any:
    """A dataclass field whose value (or each element of a tuple value) must lie in a range:
    ``min``/``max`` inclusive, ``above``/``below`` exclusive. :func:`check_ranges` enforces it."""
    bounds = {k: v for k, v in {"min": min, "max": max, "above": above, "below": below}.items() if v is not None}
    return dataclasses.field(default=default, metadata={"range": bounds})


def range_text(bounds: dict[str, float]) -> str:
    """{'min': 1} -> 'at least 1'; {'above': 0, 'max': 1} -> 'in (0, 1]'."""
    lo = ("[", bounds["min"]) if "min" in bounds else ("(", bounds["above"]) if "above" in bounds else None
    hi = ("]", bounds["max"]) if "max" in bounds else (")", bounds["below"]) if "below" in bounds else None
    if lo and hi:
        return f"in {lo[0]}{lo[1]}, {hi[1]}{hi[0]}"
    if lo:
        return f"at least {lo[1]}" if lo[0] == "[" else f"greater than {lo[1]}"
    if hi is None:
        raise ValueError(f"range_text needs a bound, got {bounds}")
    return f"at most {hi[1]}" if hi[0] == "]" else f"less than {hi[1]}"


def _inside(value: float, bounds: dict[str, float]) -> bool:
    return (
        value >= bounds.get("min", value)
        and value <= bounds.get("max", value)
        and ("above" not in bounds or value > bounds["above"])
        and ("below" not in bounds or value < bounds["below"])
    )


def in_range(value: float, bounds: dict[str, float]) -> bool:
    """Whether ``value`` lies in ``bounds`` (:func:`ranged`); NaN and infinities never do."""
    return not (isinstance(value, float) and not math.isfinite(value)) and _inside(value, bounds)


def out_of_range(obj: Any) -> tuple[dataclasses.Field[Any], float, bool] | None:
    """The first :func:`ranged` field of the dataclass ``obj`` holding a value outside its range
    (NaN and infinities included): the field, the value, and whether the field is a tuple (each of
    its values checked); None when every value is in range."""
    for f in dataclasses.fields(obj):
        bounds = f.metadata.get("range")
        value = getattr(obj, f.name)
        if not bounds or value is None:
            continue
        for v in value if isinstance(value, tuple) else (value,):
            if isinstance(v, (int, float)) and not isinstance(v, bool) and not in_range(v, bounds):
                return f, v, isinstance(value, tuple)
    return None


def check_ranges(obj: Any, where: str) -> Any:
    """Fail with one line naming the range when a :func:`ranged` field of ``obj`` is outside it."""
    bad = out_of_range(obj)
    if bad is not None:
        f, v, each = bad
        raise ProbeError(
            f"{where} {f.name}={v} is out of range: {'each value of ' if each else ''}{f.name} must be "
            f"{range_text(f.metadata['range'])} (default {f.default})"
        )
    return obj
