"""The C extension builds, imports, and allocates aligned writable buffers; pure agrees."""

from __future__ import annotations

import gc
import importlib
import os

import numpy as np
import pytest

from fastdata import io_native
from fastdata.io_native import _pure


def _backends() -> list[object]:
    out: list[object] = [_pure]
    try:
        out.append(importlib.import_module("fastdata.io_native._native"))
    except ImportError:
        pytest.fail("the C extension fastdata.io_native._native is not built")
    return out


@pytest.fixture(params=["native", "pure"])
def backend(request: pytest.FixtureRequest) -> object:
    return {"pure": _pure, "native": importlib.import_module("fastdata.io_native._native")}[
        request.param
    ]


def test_native_extension_is_built_and_selected_by_default() -> None:
    # CI runs the suite a second time with FASTDATA_DECODER=pure: the backend loaded is
    # the one asked for, and with none asked for (auto) the built extension, never a
    # silent fall back to pure.
    native = _backends()[1]
    asked = os.environ.get("FASTDATA_DECODER", "auto").strip().lower() or "auto"
    expected = asked if asked in ("native", "pure") else "native"
    assert expected == io_native.BACKEND
    assert io_native.backend_module is {"native": native, "pure": _pure}[expected]


@pytest.mark.parametrize("alignment", [1, 8, 64, 4096, 1 << 16, 1 << 21])
@pytest.mark.parametrize("nbytes", [0, 1, 4095, 4096, 1 << 20])
def test_aligned_empty_address_is_multiple_of_alignment(
    backend: object, nbytes: int, alignment: int
) -> None:
    buf = backend.aligned_empty(nbytes, alignment)  # type: ignore[attr-defined]
    view = np.frombuffer(buf, dtype=np.uint8)
    assert view.nbytes == nbytes
    if nbytes:
        assert view.ctypes.data % alignment == 0
        view[:] = 7
        assert int(view.sum()) == 7 * nbytes


def test_aligned_empty_defaults_to_page_alignment(backend: object) -> None:
    buf = backend.aligned_empty(10_000)  # type: ignore[attr-defined]
    assert np.frombuffer(buf, dtype=np.uint8).ctypes.data % 4096 == 0
    assert memoryview(buf).readonly is False


@pytest.mark.parametrize(
    ("nbytes", "alignment"),
    [(-1, 4096), (10, 0), (10, 3), (10, 1 << 31), (10, -4096), (True, 64), ("10", 64)],
)
def test_aligned_empty_rejects_bad_arguments(
    backend: object, nbytes: object, alignment: object
) -> None:
    with pytest.raises(ValueError, match=r"nbytes|alignment"):
        backend.aligned_empty(nbytes, alignment)  # type: ignore[attr-defined]


def test_native_buffer_counts_live_exports() -> None:
    native = importlib.import_module("fastdata.io_native._native")
    buf = native.aligned_empty(4096)
    assert buf.exports == 0
    arr = np.frombuffer(buf, dtype=np.uint8)
    mv = memoryview(buf)
    assert buf.exports == 2
    del arr, mv
    gc.collect()
    assert buf.exports == 0
    assert buf.nbytes == len(buf) == 4096
    assert buf.address % 4096 == 0
    assert "AlignedBuffer" in repr(buf)


def test_native_buffer_cannot_be_instantiated_directly() -> None:
    native = importlib.import_module("fastdata.io_native._native")
    with pytest.raises(TypeError, match=r"cannot create '.*AlignedBuffer' instances"):
        native.AlignedBuffer()


def test_native_huge_request_raises_memory_error() -> None:
    native = importlib.import_module("fastdata.io_native._native")
    with pytest.raises(MemoryError, match=r"^$"):  # the bare MemoryError of a failed malloc
        native.aligned_empty(1 << 62)
