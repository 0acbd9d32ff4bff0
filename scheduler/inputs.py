"""The input types of the REST API: every text, name, id and free-form JSON document a client sends
is one of these, in the request models and in the path and query parameters alike.

They refuse, with a message that says what was wrong and where, what no column, log line or
terminal should receive: NUL bytes (PostgreSQL cannot store them), other control characters, lone
surrogates (not Unicode, so not encodable), text longer than its column, and numbers that are not
finite or do not fit 64 bits. :func:`printable` is the same rule for text going out (error
messages that quote an input).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Annotated, Any

from annotated_types import Interval
from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

# C0 controls, DEL, C1 controls and the surrogate block (a valid str never holds one alone).
_REFUSED = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_INT64 = 2**63 - 1
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
NAME_FORM = "letters, digits, '.', '_' or '-', starting with a letter or digit"


def refused_character(text: str) -> str | None:
    """Why ``text`` cannot be taken (its first refused character and where), or None."""
    found = _REFUSED.search(text)
    if found is None:
        return None
    code, at = ord(found.group()), found.start() + 1
    if code == 0:
        return f"contains a NUL byte (U+0000) at character {at}; remove it"
    if 0xD800 <= code <= 0xDFFF:
        return f"contains a lone surrogate (U+{code:04X}) at character {at}, which is not Unicode; send UTF-8 text"
    return f"contains the control character U+{code:04X} at character {at}; remove it"


def printable(text: str, limit: int | None = None) -> str:
    """``text`` with each refused character written as an escape (\\x00, \\ud800), for messages;
    with ``limit``, cut to about that many characters (a quoted input may be 10k long)."""
    if limit is not None and len(text) > limit:
        text = text[:limit] + f"... ({len(text)} characters)"
    return _REFUSED.sub(lambda m: repr(m.group())[1:-1], text)


@dataclass(frozen=True)
class TextRule:
    """Pydantic metadata for one kind of text: ``Annotated[str, TextRule(64, ...)]``.

    Checked in this order so the message names the real problem: refused characters, length,
    then ``pattern`` (described to the user as ``form``). The limits also go into the OpenAPI schema.
    """

    max_length: int
    min_length: int = 0
    pattern: str | None = None
    form: str = ""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        json_schema = handler(schema)
        json_schema["maxLength"] = self.max_length
        if self.min_length:
            json_schema["minLength"] = self.min_length
        if self.pattern:
            json_schema["pattern"] = self.pattern
        return json_schema

    def check(self, value: str) -> str:
        problem = refused_character(value)
        if problem is None and len(value) > self.max_length:
            problem = f"is {len(value)} characters long; at most {self.max_length} are allowed"
        if problem is None and len(value) < self.min_length:
            problem = f"must have at least {self.min_length} character(s)"
        if problem is None and self.pattern and not re.fullmatch(self.pattern, value):
            problem = f"must be {self.form}"
        if problem is not None:
            raise PydanticCustomError("invalid_text", problem)
        return value


@dataclass(frozen=True)
class JsonRule:
    """Pydantic metadata for a free-form JSON document (a job spec): every key and string is text
    under ``max_text`` characters, every number finite and within 64 bits, nesting under ``max_depth``."""

    max_text: int = 4096
    max_depth: int = 16

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    def check(self, value: dict[str, Any]) -> dict[str, Any]:
        problem = self._problem(value, "", 0)
        if problem is not None:
            raise PydanticCustomError("invalid_json", problem)
        return value

    def _problem(self, value: Any, where: str, depth: int) -> str | None:
        at = where or "the document"
        if depth > self.max_depth:
            return f"{at} nests deeper than {self.max_depth} levels"
        if isinstance(value, str):
            return self._text_problem(value, at)
        if isinstance(value, bool) or value is None:
            return None
        if isinstance(value, int):
            if abs(value) > _INT64:
                return f"{at} is an integer of {len(str(abs(value)))} digits; at most ±{_INT64} is allowed"
            return None
        if isinstance(value, float):
            return None if math.isfinite(value) else f"{at} is not a finite number; write one such as 1e6"
        if isinstance(value, dict):
            for key, item in value.items():
                path = f"{where}.{printable(key, 40)}" if where else printable(key, 40)
                problem = self._text_problem(key, f"the key '{path}'") or self._problem(item, path, depth + 1)
                if problem is not None:
                    return problem
            return None
        if isinstance(value, list):
            for index, item in enumerate(value):
                problem = self._problem(item, f"{where}[{index}]", depth + 1)
                if problem is not None:
                    return problem
        return None

    def _text_problem(self, text: str, at: str) -> str | None:
        problem = refused_character(text)
        if problem is None and len(text) > self.max_text:
            problem = f"is {len(text)} characters long; at most {self.max_text} are allowed"
        return f"{at} {problem}" if problem else None


Name = Annotated[str, TextRule(64)]
"""A team name: printable text here; its spelling rule (scheduler.store.models.team_name_error) is checked by the
service on every path, so the API and the CLI give one message with a valid spelling to use instead."""
JobId = Annotated[str, TextRule(32, min_length=1, pattern=NAME_PATTERN, form="a job id such as j-1a2b3c4d5e6f7a8b")]
Label = Annotated[str, TextRule(64, min_length=1)]
"""A token's name: any printable text."""
Key = Annotated[str, TextRule(200, min_length=1)]
"""An idempotency key: any printable text."""
Word = Annotated[str, TextRule(64)]
"""A short query value: a state, GPU, cloud or window."""
Reason = Annotated[str, TextRule(500)]
JsonObject = Annotated[dict[str, Any], JsonRule()]
RowId = Annotated[int, Interval(ge=1, le=2**31 - 1)]
"""A table's id (a token's): PostgreSQL's INTEGER, so a larger one is refused, not a 500 from the driver."""


def accept(kind: Any, value: Any, where: str) -> Any:
    """``value`` checked against one of the types above, for an edge that takes input without the
    API's request validation (the in-process CLI): the same rule and the same message as the API
    (``where`` is the API's parameter name), so a NUL byte typed at the terminal never reaches the
    database there either."""
    from pydantic import TypeAdapter, ValidationError

    from errors import InvalidInput

    try:
        return TypeAdapter(kind).validate_python(value)
    except ValidationError as exc:
        raise InvalidInput(exc.errors()[0]["msg"], path=where) from None


def check_utf8_url(raw_path: bytes, query: bytes) -> None:
    """Refuse a URL whose percent-escapes are not UTF-8 (%ED%A0%80, a lone surrogate): a server would
    otherwise read them as U+FFFD and look up a value the client never sent. The API and the dashboard
    each check their requests with it (scheduler.api.deps, scheduler.ui.web)."""
    from urllib.parse import unquote_to_bytes

    from errors import InvalidInput

    for part, raw in (("path", raw_path), ("query", query)):
        try:
            unquote_to_bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"the URL's {part} is not UTF-8 once its %-escapes are decoded (byte "
                               f"0x{exc.object[exc.start]:02X})", hint="percent-encode text as UTF-8") from None
