"""How a client reaches a test server: :mod:`fastdata.server`'s ``S3Target``, re-exported."""

from __future__ import annotations

from fastdata.server import ACCESS_KEY, REGION, SECRET_KEY, S3Target

__all__ = ["ACCESS_KEY", "REGION", "SECRET_KEY", "S3Target"]
