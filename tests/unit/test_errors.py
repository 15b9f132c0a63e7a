from __future__ import annotations

import pickle

import pytest

from fastdata import errors


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [
        (errors.ConfigError, ValueError),
        (errors.StoreError, OSError),
        (errors.ObjectNotFoundError, FileNotFoundError),
        (errors.AccessDeniedError, PermissionError),
        (errors.CorruptRecordError, ValueError),
    ],
)
def test_errors_have_builtin_second_parents(cls: type, builtin: type) -> None:
    assert issubclass(cls, errors.FastdataError)
    assert issubclass(cls, builtin)


def test_every_error_is_a_fastdata_error() -> None:
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.FastdataError)


def test_corrupt_record_error_carries_context_through_pickle() -> None:
    exc = errors.CorruptRecordError("bad magic", sample_id=42, offset=7)
    back = pickle.loads(pickle.dumps(exc))
    assert (back.sample_id, back.offset, str(back)) == (42, 7, "bad magic")
