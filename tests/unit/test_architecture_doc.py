"""docs/architecture.md's module table matches the tree (issue 14): every module under
``fastdata/`` is named in a row (packages in a row of their own), and every path the
table names exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = (".py", ".c", ".h", ".pyi")
PATHLIKE = re.compile(r"^[\w./-]+(\.py|\.c|\.h|\.pyi|/)$")


def _tracked() -> set[str]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "fastdata", "bench"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return set(out.split())


def _table() -> tuple[set[str], set[str], list[str]]:
    """(paths the rows name, the first path of each row, names that resolve to nothing)."""
    tracked = _tracked()
    dirs = {f"{p}/" for f in tracked for p in PurePosixPath(f).parents if str(p) != "."}
    rows = [
        line
        for line in (ROOT / "docs" / "architecture.md").read_text().splitlines()
        if line.startswith("| `")
    ]
    named: set[str] = set()
    firsts: set[str] = set()
    missing: list[str] = []
    for row in rows:
        first = re.findall(r"`([^`]+)`", row.split(" | ")[0])[0]
        firsts.add(first)
        base = first if first.endswith("/") else f"{PurePosixPath(first).parent}/"
        for name in re.findall(r"`([^`]+)`", row):
            if not PATHLIKE.match(name) or name.startswith("."):
                continue
            found = next(
                (c for c in (name, base + name, f"fastdata/{name}") if c in tracked or c in dirs),
                None,
            )
            if found is None:
                missing.append(f"{name} (row {first})")
            else:
                named.add(found)
    return named, firsts, missing


def test_every_module_is_named_in_the_table() -> None:
    named, firsts, _ = _table()
    modules = [f for f in sorted(_tracked()) if f.startswith("fastdata/") and f.endswith(SOURCES)]
    unnamed = [f for f in modules if not f.endswith("/__init__.py") and f not in named]
    packages = {f.removesuffix("__init__.py") for f in modules if f.endswith("/__init__.py")} - {
        "fastdata/"
    }
    assert unnamed == []
    assert sorted(packages - firsts) == []


def test_every_path_the_table_names_exists() -> None:
    _, _, missing = _table()
    assert missing == []
