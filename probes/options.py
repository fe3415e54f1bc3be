"""Reading `key=value` strings (CLI options, model specs) into typed dataclass fields."""
from __future__ import annotations

import dataclasses
from typing import Any

from probes.errors import ProbeError, suggest

_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


def coerce(value: Any, typ: str, where: str) -> Any:
    """Read ``value`` as the (string) annotation ``typ``: bool, int, float, tuple[...], X | None.

    Non-strings pass through unchanged (Python callers give typed values)."""
    if not isinstance(value, str):
        return value
    kinds = [k.strip() for k in str(typ).split("|")]
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
            inner = base[len("tuple["):].split(",")[0].strip()
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


def field_types(cls: type) -> dict[str, str]:
    return {f.name: str(f.type) for f in dataclasses.fields(cls)}


SEED_MAX = 2**32 - 1  # numpy's RandomState accepts 0..2**32-1; torch accepts more, so this is the bound


def check_seed(seed: Any, where: str = "--seed") -> None:
    """Seeds are integers in 0..2**32-1 (what numpy, torch and Python's random all accept)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        raise ProbeError(f"{where} must be an integer from 0 to {SEED_MAX} (2**32-1), got {seed}")
