"""Small test inputs built in memory: tar shards and the like.

Shared by fastdata's tests and benchmarks, and usable by anyone testing a layout or a
store against fastdata.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Sequence

__all__ = ["tar_bytes"]


def tar_bytes(members: Sequence[tuple[str, bytes]], fmt: int = tarfile.GNU_FORMAT) -> bytes:
    """A tar archive holding ``members`` (``(name, data)`` pairs, in order).

    Args:
        members: Member names and contents, in archive order.
        fmt: ``tarfile.GNU_FORMAT`` (the default), ``PAX_FORMAT`` or ``USTAR_FORMAT``.
    """
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return out.getvalue()
