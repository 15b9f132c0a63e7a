"""The cached-record format: encode in Python; decode and gather through ``io_native``.

This is the only module that imports ``fastdata.io_native``; the layers above get the
aligned allocator from here.
"""

from __future__ import annotations

from fastdata.io_native import BACKEND, aligned_empty

__all__ = ["BACKEND", "aligned_empty"]
