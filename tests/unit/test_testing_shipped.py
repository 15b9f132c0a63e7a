"""fastdata.testing ships what a third party needs to prove its tier or store."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path


def test_a_tier_outside_fastdata_runs_the_shipped_contract(tmp_path: Path) -> None:
    # A project of its own (no tests/ package of fastdata's on its path): it subclasses
    # the shipped suite, as a third-party tier would, and pytest runs the contract.
    (tmp_path / "conftest.py").write_text(
        'import pytest\npytest.register_assert_rewrite("fastdata.testing.tier_contract")\n'
    )
    (tmp_path / "test_my_tier.py").write_text(
        textwrap.dedent(
            """
            import pytest
            from fastdata.cache import RamTier
            from fastdata.testing.tier_contract import TierContract

            class TestMyTier(TierContract):
                @pytest.fixture
                def make_tier(self):
                    return lambda config, clock=None: (
                        RamTier(config, clock=clock) if clock else RamTier(config)
                    )
            """
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"],
        cwd=tmp_path,
        # Not our run's options (CI's --allowed-skips is an option of our conftest only).
        env={
            k: v
            for k, v in os.environ.items()
            if k not in ("PYTEST_ADDOPTS", "PYTEST_ALLOWED_SKIPS")
        },
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert " passed" in done.stdout
    assert "failed" not in done.stdout
