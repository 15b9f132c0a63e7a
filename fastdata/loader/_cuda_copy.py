"""The loader's copy to a CUDA device: each batch on a side stream, one batch ahead.

:func:`to_device` wraps the loader's batch iterator; the host batch (a view of a pinned
pool buffer) stays referenced until its copy has finished, so the pool cannot hand its
buffer out again while the GPU still reads it. :func:`check_device` validates the
loader's ``device=`` argument.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from fastdata.dataset import VarTensor
from fastdata.errors import ConfigError

__all__ = ["check_device", "to_device"]


def check_device(device: str | torch.device | None) -> torch.device | None:
    """The loader's ``device=`` as a ``torch.device`` (``None`` stays ``None``).

    Raises:
        ConfigError: Not a torch device, or CUDA asked for where torch sees none.
    """
    if device is None:
        return None
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"device {device!r} is not a torch device") from exc
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={device!r} but torch sees no CUDA device")
    return resolved


def to_device(source: Iterator[Any], device: torch.device) -> Iterator[Any]:
    """Copy each batch on a side stream while the loop computes on the previous one.

    The host batch (a view of a pinned pool buffer) stays referenced until its copy has
    finished, so the pool cannot hand its buffer out again while the GPU still reads it.
    """
    stream = torch.cuda.Stream(device=device)
    pending: tuple[Any, torch.cuda.Event, Any] | None = None
    try:
        for host in source:
            with torch.cuda.stream(stream):
                moved = _move(host, device)
                event = torch.cuda.Event()
                event.record(stream)
            if pending is not None:
                yield _finish(pending)
            pending = (moved, event, host)
        if pending is not None:
            yield _finish(pending)
            pending = None
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()


def _move(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, VarTensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, dict):
        return {k: _move(v, device) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_move(v, device) for v in value)
    return value


def _finish(pending: tuple[Any, torch.cuda.Event, Any]) -> Any:
    moved, event, host = pending
    stream = torch.cuda.current_stream()
    stream.wait_event(event)
    # The copies were allocated on the side stream: tell the caching allocator they are
    # used on the compute stream too, or their memory could be handed to the next copy
    # while kernels queued on the compute stream still read it.
    _record_stream(moved, stream)
    event.synchronize()
    del host
    return moved


def _record_stream(value: Any, stream: torch.cuda.Stream) -> None:
    if isinstance(value, torch.Tensor | VarTensor):
        value.record_stream(stream)
    elif isinstance(value, dict):
        for item in value.values():
            _record_stream(item, stream)
    elif isinstance(value, list | tuple):
        for item in value:
            _record_stream(item, stream)
