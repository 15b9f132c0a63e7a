"""The ``fastdata`` command: argv and environment in, config out, public API called.

Built on click (subcommands, typed options, help text, exit codes) and rich (tables and
progress bars), so that none of that is hand-written here. One module per job:
``_main.py`` (the command group, its error handling, :func:`main`), ``_options.py``
(the shared options and what they become: store options, ``DatasetSpec``, config,
``NodePlan``), and one module per command family: ``_pack.py``, ``_warm.py``,
``_ops.py`` (stats, doctor, clear), ``_bench.py``. ``python -m fastdata`` and the
``fastdata`` console script both call :func:`main`.
"""

from __future__ import annotations

from fastdata.cli._main import cli as cli
from fastdata.cli._main import main
from fastdata.cli._options import load_config as load_config

__all__ = ["main"]
