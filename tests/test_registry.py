"""The registry refuses duplicates and suggests close matches."""
import pytest

from probes import ProbeError
from probes.registry import Registry


class Thing:
    name = "attention-stats"


def test_duplicates_refused_and_typos_suggested():
    reg = Registry("widget")
    reg.register_class(Thing)
    assert isinstance(reg.get("attention-stats"), Thing) and reg.names() == ["attention-stats"]
    with pytest.raises(ValueError, match="already registered"):
        reg.register_class(Thing)
    with pytest.raises(ProbeError, match="unknown widget 'atention-stats' \\(did you mean 'attention-stats'\\?\\)"):
        reg.get("atention-stats")


def test_cli_task_choices_come_from_the_registry():
    from probes.task import TASKS, task_names

    assert task_names() == TASKS.names()
    assert {"attention-stats", "syntax", "coref", "induction", "kernels"} <= set(task_names())
