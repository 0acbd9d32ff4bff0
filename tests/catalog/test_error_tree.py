"""The one error tree: every error is a GpuplanError with an HTTP status, a code and a fix."""

from __future__ import annotations

import pytest

import errors
from errors import GpuplanError, InvalidInput, UnknownName, close_matches


def all_error_classes() -> list[type[GpuplanError]]:
    found: list[type[GpuplanError]] = []
    stack: list[type[GpuplanError]] = [GpuplanError]
    while stack:
        cls = stack.pop()
        found.append(cls)
        stack.extend(cls.__subclasses__())
    return found


def test_every_public_exception_derives_from_the_base() -> None:
    for name in dir(errors):
        obj = getattr(errors, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, GpuplanError), name


@pytest.mark.parametrize("cls", [c for c in all_error_classes() if c.__module__ == "errors"])
def test_each_class_has_a_status_and_code(cls: type[GpuplanError]) -> None:
    assert 400 <= cls.status_code < 600
    assert cls.code and cls.code.islower()


def test_unknown_gpu_suggests_the_closest_name() -> None:
    err = UnknownName("GPU", "H10", ["H100", "H200", "A100-80GB", "L4"])
    assert str(err).startswith("unknown GPU 'H10'; did you mean H100")
    assert err.to_dict()["code"] == "unknown_name"


def test_unknown_name_without_close_match_lists_valid_ones() -> None:
    err = UnknownName("cloud", "zzzz", ["aws", "gcp", "azure"])
    assert "valid clouds: aws, azure, gcp" in str(err)


def test_invalid_input_carries_the_path() -> None:
    err = InvalidInput("must be > 0", path="train.tokens")
    assert str(err) == "train.tokens: must be > 0"
    assert err.to_dict() == {"code": "invalid_input", "message": "train.tokens: must be > 0", "path": "train.tokens"}


def test_close_matches_is_case_insensitive_and_keeps_spelling() -> None:
    assert close_matches("h100", ["H100", "H200"])[0] == "H100"
