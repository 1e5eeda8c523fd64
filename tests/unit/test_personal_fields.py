"""What an agent declares personal and what compaction keeps of a document without it."""

from __future__ import annotations

import re

import pytest

from pipeline import PersonalData
from pipeline.errors import DefinitionError
from pipeline.runs.redaction import without

INVOICES = {
    "invoices": [
        {"client": "acme", "email": "ana@acme.example", "amount": 120},
        {"client": "globex", "email": None, "amount": 80},
    ],
    "note": {"by": "Ana", "seen": ["Ana", "Bo"]},
}


def test_a_declared_field_is_dropped_and_every_other_field_stays() -> None:
    kept = without(INVOICES, ["invoices.*.email", "note.seen.*", "missing.field", "amount"])
    assert kept == {
        "invoices": [
            {"client": "acme", "email": "[redacted]", "amount": 120},
            {"client": "globex", "email": None, "amount": 80},  # nothing was there
        ],
        "note": {"by": "Ana", "seen": ["[redacted]", "[redacted]"]},
    }
    assert INVOICES["invoices"][0]["email"] == "ana@acme.example", "the document is not changed"
    assert without(INVOICES, ["*"]) == {"invoices": "[redacted]", "note": "[redacted]"}
    assert without(INVOICES, []) == INVOICES


def test_a_declaration_splits_a_tools_fields_and_adds_the_states_to_the_results() -> None:
    declared = PersonalData(
        result="text",  # one field, not four letters
        state=("facts.contact",),
        tools={"send": ("args.body", "result.to", "result.headers.*")},
    )
    assert declared.result == ("text",)
    assert declared.of_result() == ("text", "state.facts.contact")
    assert declared.of_tool("send", "args") == ("body",)
    assert declared.of_tool("send", "result") == ("to", "headers.*")
    assert declared.of_tool("other", "args") == ()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"input": 5}, "personal_data.input must be a tuple of field names (got 5)"),
        ({"tools": ["send"]}, "personal_data.tools must map tool names to their fields"),
        ({"tools": {"send": [1]}}, "personal_data.tools['send'] must be a tuple of field names"),
    ],
)
def test_a_malformed_declaration_is_one_line_naming_the_field(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(DefinitionError, match=re.escape(message)):
        PersonalData(**fields)  # type: ignore[arg-type]
