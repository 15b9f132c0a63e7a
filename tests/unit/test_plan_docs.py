"""The examples in docs/plan.md run, so the worked example cannot drift from the code."""

from __future__ import annotations

import doctest
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_plan_doc_examples_run() -> None:
    result = doctest.testfile(
        str(DOCS / "plan.md"), module_relative=False, optionflags=doctest.ELLIPSIS
    )
    assert result.attempted >= 8
    assert result.failed == 0
