"""The API's input types (scheduler.inputs): what they take can be stored and printed, whatever was sent."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from scheduler.inputs import JsonObject, JsonRule, Name, TextRule, printable, refused_character

# Any code point, lone surrogates included (json.loads makes them from "\ud800").
ANY_TEXT = st.text(st.characters(codec=None, categories=None), max_size=80)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | ANY_TEXT | st.floats() | st.integers(min_value=-(2**80), max_value=2**80),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ANY_TEXT, inner, max_size=4),
    max_leaves=20,
)


def _refused(text: str) -> bool:
    return any(ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F or 0xD800 <= ord(ch) <= 0xDFFF for ch in text)


@given(ANY_TEXT)
def test_text_is_taken_only_when_every_store_and_terminal_can_hold_it(text: str) -> None:
    rule = TextRule(40)
    try:
        taken = rule.check(text)
    except ValueError:  # PydanticCustomError
        assert _refused(text) or len(text) > 40
        return
    assert taken == text and not _refused(text) and len(text) <= 40
    text.encode("utf-8")


@given(ANY_TEXT)
def test_printable_always_encodes_and_changes_only_refused_characters(text: str) -> None:
    shown = printable(text)
    shown.encode("utf-8")
    assert not _refused(shown)
    assert (shown == text) == (refused_character(text) is None)


@given(JSON_VALUES)
def test_a_taken_json_document_is_storable_as_json_on_any_database(value: Any) -> None:
    document = {"spec": value}
    try:
        JsonRule().check(document)
    except ValueError:
        return
    text = json.dumps(document, allow_nan=False, ensure_ascii=False)  # no NaN/Infinity: PostgreSQL refuses them
    text.encode("utf-8")
    assert "\\u0000" not in text


@pytest.mark.parametrize(("document", "message"), [
    ({"train": {"data": "a\x00"}}, "train.data contains a NUL byte (U+0000) at character 2; remove it"),
    ({"resources": {"accelerators": ["H100", "\ud800"]}},
     "resources.accelerators[1] contains a lone surrogate (U+D800) at character 1, which is not Unicode; "
     "send UTF-8 text"),
    ({"train": {"seed": -(2**63) - 1}},
     "train.seed is an integer of 19 digits; at most ±9223372036854775807 is allowed"),
    ({"train": {"tokens": math.inf}}, "train.tokens is not a finite number; write one such as 1e6"),
    ({"a\x1b": 1}, "the key 'a\\x1b' contains the control character U+001B at character 2; remove it"),
    ({"model": "m" * 5000}, "model is 5000 characters long; at most 4096 are allowed"),
])
def test_a_refused_json_document_names_the_field(document: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as err:
        TypeAdapter(JsonObject).validate_python(document)
    assert err.value.errors()[0]["msg"] == message


def test_a_name_is_checked_for_characters_before_its_form() -> None:
    """Characters and length here; the spelling rule is the service's (one message on every path)."""
    names = TypeAdapter(Name)
    assert names.validate_python("ml team") == "ml team"
    for name, message in [("ml\x00", "contains a NUL byte (U+0000) at character 3; remove it"),
                          ("m" * 65, "is 65 characters long; at most 64 are allowed")]:
        with pytest.raises(ValidationError) as err:
            names.validate_python(name)
        assert err.value.errors()[0]["msg"] == message
