"""Enumerated options are Literal[...] annotations; the options parser reads the choices from them."""

import dataclasses
from typing import Literal

import pytest

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.base.options import choices, coerce


@dataclasses.dataclass(frozen=True)
class Opts:
    method: Literal["mean", "zero"] = "mean"
    parser: Literal["en_core_web_sm", "custom"] | None = None


def _types():
    return {f.name: str(f.type) for f in dataclasses.fields(Opts)}


def test_choices_are_read_from_the_annotation():
    assert choices(_types()["method"]) in {("mean", "zero")}
    assert choices("int") is None


def test_a_choice_passes_and_a_wrong_one_is_refused_with_the_choices():
    t = _types()
    assert coerce("zero", t["method"], "option method") == "zero"
    with pytest.raises(ProbeError) as e:
        coerce("meen", t["method"], "native spec")
    assert str(e.value) == "native spec: unknown value 'meen' (did you mean 'mean'?); use mean or zero"
    with pytest.raises(ProbeError) as e:
        coerce("meen", t["method"], "task 'x' option method", key="method", flag="-O")
    assert str(e.value) == (
        "task 'x' option method: unknown method 'meen' (did you mean 'mean'?); use -O method=mean or -O method=zero"
    )


def test_python_callers_are_checked_too_and_optional_choices_take_none():
    t = _types()
    with pytest.raises(ProbeError, match="use mean or zero"):
        coerce(3, t["method"], "option method")
    assert coerce("none", t["parser"], "option parser") is None
    assert coerce(None, t["parser"], "option parser") is None
    assert coerce("custom", t["parser"], "option parser") == "custom"


def test_every_task_takes_its_options_and_description_from_its_card():
    from depthprobe.probes.engine.task import get_task
    from depthprobe.tasks import TASKS as TABLE
    from depthprobe.tasks.cards import CARDS

    assert sorted(CARDS) == sorted(TABLE)
    for name in TABLE:
        task = get_task(name)
        assert task.Options is CARDS[name].options, name
        assert task.description == CARDS[name].description, name
        assert dataclasses.fields(task.Options), name


def test_dataclasses_built_in_python_are_checked_by_check_choices():
    from depthprobe.probes.base.options import check_choices

    assert check_choices(Opts(method="zero"), "x") == Opts(method="zero")
    with pytest.raises(ProbeError) as e:
        check_choices(Opts(method="one"), "native model")
    assert str(e.value) == "native model: unknown method 'one'; use mean or zero"
    with pytest.raises(ProbeError, match="unknown parser 'x'"):
        check_choices(Opts(parser="x"), "native model")
