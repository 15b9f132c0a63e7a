"""Test helpers fastdata ships, for its own tests, ``bench/`` and anyone testing against it.

- ``s3``: :class:`~fastdata.testing.s3.S3Target`, how a client reaches a test server;
- ``seaweedfs``: an embedded S3-compatible server; ``faultproxy``: a fault-injecting proxy
  (with its private parts ``_faults`` and ``_proxy_handler``);
- ``data``: test inputs built in memory (``tar_bytes``);
- ``cli``: run the ``fastdata`` command and read its ``--json`` output;
- ``store_contract``, ``tier_contract``: the contract suites a store or a cache tier must
  pass (pytest classes to subclass; docs/architecture.md, "Tests → fastdata.testing").

Importing this package imports nothing else: each module is imported on its own.
"""
