"""The shape of the house (issue 19): one package per concept behind a thin face.

These read the source tree, not the running code, so a new flat module, a module grown
past its size, a private import across packages or a layers contract that lists modules
again fails here the day it is written.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "fastdata"
MAX_FLAT_MODULES = 10
MAX_MODULE_LINES = 600
BASE = {"_counters", "_fork", "_pagecache"}
"""Base modules every layer may import (they import nothing of ours)."""
FLAT_IN_LAYERS = {"errors", "config", "spec", "pack", "fork", "counters"}
"""The flat modules the layers contract may name; everything else it names is a package."""
SEAMS: set[tuple[str, str]] = set()
"""Documented private imports across top-level packages: (importing package, imported
module). None are needed today; a new one is named here and in docs/architecture.md."""


def _modules(root: Path = ROOT) -> list[Path]:
    return sorted(p for p in (root / "fastdata").rglob("*.py") if "__pycache__" not in p.parts)


def _dotted(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top(dotted: str) -> str:
    return ".".join(dotted.split(".")[:2])


def _private_imports_across_packages(root: Path = ROOT) -> list[str]:
    found = []
    for path in _modules(root):
        here = _top(_dotted(path, root))
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith(
                "fastdata"
            ):
                continue
            target = node.module or ""
            names = [a.name for a in node.names]
            if target == "fastdata":
                private = [n for n in names if n.startswith("_") and n.strip("_") not in BASE]
                private = [n for n in private if not (n.startswith("__") and n.endswith("__"))]
            elif _top(target) == here or _top(target).removeprefix("fastdata.") in BASE:
                continue
            else:
                inner = target.split(".")[1:]
                private = names if any(p.startswith("_") for p in inner) else []
                private += [n for n in names if n.startswith("_") and n not in private]
            if private and (here, target) not in SEAMS:
                found.append(f"{path.relative_to(root)}:{node.lineno}: {target} {private}")
    return found


def test_at_most_ten_modules_sit_directly_in_fastdata() -> None:
    flat = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(flat) <= MAX_FLAT_MODULES, flat


def test_no_module_is_longer_than_600_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_no_private_module_or_name_is_imported_across_packages() -> None:
    assert _private_imports_across_packages() == []


def test_the_layers_contract_names_at_most_twenty_packages() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["name"] == "Data flows one way")["layers"]
    assert len(layers) <= 20
    named = [m.strip(" ()") for layer in layers for m in layer.split("|")]
    for name in named:
        path = ROOT / Path(*name.split("."))
        assert path.is_dir() or path.with_suffix(".py").is_file(), name
        if path.with_suffix(".py").is_file():
            assert path.name.lstrip("_") in {
                "errors",
                "config",
                "spec",
                "pack",
                "fork",
                "counters",
            }, name


def test_the_check_finds_private_imports_across_packages_only(tmp_path: Path) -> None:
    loader = tmp_path / "fastdata" / "loader"
    loader.mkdir(parents=True)
    (loader / "_a.py").write_text(
        "from fastdata.cache.lmdb._env import handles_open\n"  # private module: found
        "from fastdata.dataset import _OPEN\n"  # private name: found
        "from fastdata.loader._b import x\n"  # same package: fine
        "from fastdata.cache.lmdb import handles_open\n"  # through the face: fine
        "from fastdata._fork import this_process\n"  # the base: fine
        "from fastdata import __version__\n"  # a dunder: fine
    )
    found = _private_imports_across_packages(tmp_path)
    assert [line.split(": ", 1)[1] for line in found] == [
        "fastdata.cache.lmdb._env ['handles_open']",
        "fastdata.dataset ['_OPEN']",
    ]
