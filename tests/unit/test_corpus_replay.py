"""Replay every input under tests/data/corpus/ through the fuzz harness's check.

Each file is an input that once crashed or split the backends (the fuzz harness saves
findings there as crash-*; regressions found by hand carry a descriptive name). The check
runs the native and the pure backend on it and requires the same outcome.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORPUS = sorted(p for p in (ROOT / "tests" / "data" / "corpus").iterdir() if p.is_file())


def _harness() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fuzz_decode", ROOT / "tests/fuzz/fuzz_decode.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HARNESS = _harness()
SEEDS = HARNESS._seeds()


@pytest.mark.parametrize("path", CORPUS, ids=[p.name for p in CORPUS])
def test_corpus_input_gives_the_same_outcome_on_both_backends(path: Path) -> None:
    native = importlib.import_module("fastdata.io_native._native")
    pure = importlib.import_module("fastdata.io_native._pure")
    HARNESS.check(path.read_bytes(), native, pure, SEEDS)


def test_corpus_is_not_empty() -> None:
    assert CORPUS, "tests/data/corpus/ lost its regression inputs"


def test_seed_inputs_pass_the_check() -> None:
    native = importlib.import_module("fastdata.io_native._native")
    pure = importlib.import_module("fastdata.io_native._pure")
    for i, seed in enumerate(SEEDS):
        for mode in range(HARNESS.MODES):
            HARNESS.check(bytes([mode, i << 1]) + seed, native, pure, SEEDS)
