"""Deprecated alias of :mod:`fastdata.cache.lmdb` (the LMDB tier's package), kept for one
release so that ``from fastdata.cache.lmdb_tier import ...`` keeps working."""

from __future__ import annotations

from fastdata.cache.lmdb import *  # noqa: F403
from fastdata.cache.lmdb import __all__ as __all__
