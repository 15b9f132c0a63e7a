"""The examples in docs/prefetch.md run, so they cannot drift from the code."""

from __future__ import annotations

import doctest
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_prefetch_doc_examples_run() -> None:
    result = doctest.testfile(str(DOCS / "prefetch.md"), module_relative=False)
    assert result.attempted >= 8
    assert result.failed == 0
