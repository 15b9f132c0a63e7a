"""The embedded S3-compatible server for tests: :mod:`fastdata.server`'s, re-exported."""

from __future__ import annotations

from fastdata.server import ACCESS_KEY, SECRET_KEY, SeaweedServer, find_weed, free_port

__all__ = ["ACCESS_KEY", "SECRET_KEY", "SeaweedServer", "find_weed", "free_port"]
