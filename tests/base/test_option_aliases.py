"""A ``Literal`` written through a type alias is checked like an inline one: by ``check_choices``
(dataclasses built in Python), by ``coerce`` through ``field_types`` (CLI options and specs)."""

from __future__ import annotations

import dataclasses
from typing import Literal

import pytest

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.base.options import check_choices, coerce, field_types

Method = Literal["eap", "eap-ig", "patch"]


@dataclasses.dataclass(frozen=True)
class Settings:
    method: Method = "eap"
    fallback: Method | None = None
    steps: int = 4
    widths: tuple[int, ...] = (1, 2)

    def __post_init__(self) -> None:
        check_choices(self, "settings:")


def test_field_types_spell_out_the_alias() -> None:
    types = field_types(Settings)
    assert types["method"] == "Literal['eap', 'eap-ig', 'patch']"
    assert types["fallback"] == "Literal['eap', 'eap-ig', 'patch'] | None"
    assert types["steps"] == "int"
    assert types["widths"] == "tuple[int, ...]"


def test_check_choices_refuses_a_value_outside_the_alias() -> None:
    with pytest.raises(ProbeError, match=r"unknown method 'eapig'.*did you mean 'eap-ig'.*eap, eap-ig or patch"):
        Settings(method="eapig")  # type: ignore[arg-type]
    with pytest.raises(ProbeError, match="unknown fallback 'grad'"):
        Settings(fallback="grad")  # type: ignore[arg-type]


def test_check_choices_accepts_the_aliased_choices_and_none() -> None:
    assert Settings(method="patch", fallback=None).method == "patch"
    assert Settings(fallback="eap-ig").fallback == "eap-ig"


def test_coerce_reads_an_aliased_option_from_text() -> None:
    types = field_types(Settings)
    assert coerce("patch", types["method"], "-O method", key="method", flag="-O") == "patch"
    assert coerce("none", types["fallback"], "-O fallback") is None
    with pytest.raises(ProbeError, match="use -O method=eap or -O method=eap-ig or -O method=patch"):
        coerce("all", types["method"], "-O method", key="method", flag="-O")
