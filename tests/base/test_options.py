"""key=value strings read as typed fields, with one-line errors."""

import pytest

from depthprobe.probes import ProbeError
from depthprobe.probes.base.options import coerce, parse_pairs


@pytest.mark.parametrize(
    "value,typ,expected",
    [
        ("3", "int", 3),
        ("0.5", "float", 0.5),
        ("yes", "bool", True),
        ("0", "bool", False),
        ("none", "int | None", None),
        ("7", "int | None", 7),
        ("1,2,4", "tuple[int, ...]", (1, 2, 4)),
        ("a,b", "tuple[str, ...]", ("a", "b")),
        ("e-spa", "str", "e-spa"),
        (5, "int", 5),
    ],
)
def test_coerce_known_answers(value, typ, expected):
    assert coerce(value, typ, "x") == expected


@pytest.mark.parametrize("value,typ", [("two", "int"), ("maybe", "bool"), ("1,x", "tuple[int, ...]"), ("none", "int")])
def test_coerce_errors_name_the_field(value, typ):
    with pytest.raises(ProbeError, match=f"field: cannot read '{value}' as"):
        coerce(value, typ, "field")


def test_parse_pairs_normalises_dashes_and_suggests():
    assert parse_pairs("native:attn-only=true,layers=2", "native", ["attn_only", "layers"], "e.g.") == {
        "attn_only": "true",
        "layers": "2",
    }
    with pytest.raises(ProbeError, match="did you mean 'layers'"):
        parse_pairs("native:layres=2", "native", ["layers"], "e.g.")
    with pytest.raises(ProbeError, match="expected key=value"):
        parse_pairs("native:layers", "native", ["layers"], "e.g.")
