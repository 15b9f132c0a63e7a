"""BufferPool: aligned, bounded, never hands out a buffer that something still views."""

from __future__ import annotations

import gc
import importlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

import fastdata.prefetch.pool as pool_mod
from fastdata import record
from fastdata.config import PrefetchConfig
from fastdata.errors import ConfigError, FastdataError
from fastdata.io_native import _pure
from fastdata.prefetch import PAGE_BYTES, BufferPool

_HAS_CUDA = torch.cuda.is_available()


@pytest.fixture(params=["native", "pure"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test on both allocators (CI also runs everything with FASTDATA_DECODER=pure)."""
    if request.param == "native":
        alloc = importlib.import_module("fastdata.io_native._native").aligned_empty
    else:
        alloc = _pure.aligned_empty
    monkeypatch.setattr(pool_mod, "aligned_empty", alloc)
    return str(request.param)


@pytest.fixture
def pool(backend: str) -> Iterator[BufferPool]:
    with BufferPool(64 * 1024, pin=False, wait_s=0.05) as p:
        yield p


def test_acquire_returns_exact_page_aligned_writable_bytes(pool: BufferPool) -> None:
    for nbytes in (0, 1, 4095, 4096, 10_000):
        buf = pool.acquire(nbytes)
        assert buf.dtype == np.uint8
        assert buf.nbytes == nbytes
        assert buf.flags.writeable
        assert buf.ctypes.data % PAGE_BYTES == 0
        buf[:] = 7
        assert int(buf.sum()) == 7 * nbytes


def _views(buf: np.ndarray) -> list[Any]:
    """The ways a batch keeps a pool buffer alive: arrays and tensors built on it."""
    return [
        np.frombuffer(buf, dtype=np.float32, count=16, offset=64).reshape(4, 4),
        buf[128:256].view(np.int64),
        torch.from_numpy(buf[256:512]),
        torch.frombuffer(buf, dtype=torch.uint8)[512:1024],
        memoryview(buf)[1024:2048],
    ]


def _snapshot(view: Any) -> bytes:
    return view.numpy().tobytes() if isinstance(view, torch.Tensor) else bytes(view)


def test_kept_batch_is_never_overwritten_while_the_pool_cycles(pool: BufferPool) -> None:
    first = pool.acquire(4096)
    first[:] = np.arange(4096) % 251
    kept = _views(first)
    expected = [_snapshot(v) for v in kept]
    del first
    for i in range(2000):
        buf = pool.acquire(4096)
        buf[:] = i % 256
        del buf
    assert [_snapshot(v) for v in kept] == expected
    stats = pool.stats()
    assert stats.reuses >= 1990
    assert stats.buffers == 2  # the kept one and the one that cycles
    assert stats.buffers_in_use == 1
    assert stats.overflows == 0
    del kept
    gc.collect()
    assert pool.stats().buffers_in_use == 0


@pytest.mark.parametrize("view_index", range(5))
def test_each_kind_of_view_keeps_its_buffer_out_of_reuse(pool: BufferPool, view_index: int) -> None:
    buf = pool.acquire(4096)
    view = _views(buf)[view_index]
    address = buf.ctypes.data
    del buf
    assert pool.stats().buffers_in_use == 1
    other = pool.acquire(4096)
    assert other.ctypes.data != address
    del other, view
    gc.collect()
    assert pool.stats().buffers_in_use == 0
    again = pool.acquire(4096)
    assert pool.stats().allocations == 2
    del again


def test_collated_batches_keep_their_buffer_until_every_field_is_dropped(pool: BufferPool) -> None:
    records = [
        record.encode({"x": np.full((8, 8), i, dtype=np.float32), "label": i, "name": b"s%d" % i})
        for i in range(16)
    ]
    kept = record.collate(records, alloc=pool.acquire)
    tensor = torch.from_numpy(kept["x"])
    names = kept["name"]
    del kept
    for _ in range(200):
        batch = record.collate(records[::-1], alloc=pool.acquire)
        del batch
    assert [int(t[0, 0]) for t in tensor] == list(range(16))
    assert bytes(names.values[: names.offsets[1]]) == b"s0"
    assert pool.stats().buffers_in_use == 1
    del tensor
    assert pool.stats().buffers_in_use == 1  # the variable-length field still views it
    del names
    assert pool.stats().buffers_in_use == 0
    assert pool.stats().allocations == 2


def test_views_dug_out_through_base_also_count(pool: BufferPool) -> None:
    buf = pool.acquire(4096)
    owner = buf.base.base.obj  # the memoryview numpy keeps, then the allocator's buffer
    raw = np.frombuffer(owner, dtype=np.uint8)
    del buf, owner
    assert pool.stats().buffers_in_use == 1
    del raw
    assert pool.stats().buffers_in_use == 0


def test_pooled_bytes_stay_within_capacity_with_mixed_sizes(backend: str) -> None:
    capacity = 128 * 1024
    held: list[np.ndarray] = []
    sizes = [4096, 8192, 12_288, 20_000, 30_000]
    with BufferPool(capacity, pin=False, wait_s=0) as p:
        for i in range(3000):
            buf = p.acquire(sizes[i % len(sizes)])
            buf[:] = 1
            if i % 7 == 0:
                held.append(buf)
            if len(held) > 2:
                held.pop(0)
            del buf
            assert p.stats().pooled_bytes <= capacity
        stats = p.stats()
    assert stats.evictions > 0
    assert stats.reuses > 2000
    assert stats.overflows == 0


def test_large_sizes_share_size_classes(backend: str) -> None:
    with BufferPool(16 * 2**20, pin=False) as p:
        first = p.acquire(1_000_000)
        address = first.ctypes.data
        del first
        second = p.acquire(1_040_000)  # the same size class: 16 x 64 KiB
        assert second.ctypes.data == address
        assert p.stats().allocations == 1


def test_full_pool_of_held_buffers_overflows_after_waiting_and_logs_once(
    pool: BufferPool, caplog: pytest.LogCaptureFixture
) -> None:
    held = [pool.acquire(16 * 1024) for _ in range(4)]  # the whole 64 KiB
    with caplog.at_level(logging.WARNING, logger="fastdata.prefetch.pool"):
        extra = [pool.acquire(16 * 1024) for _ in range(3)]
    assert all(e.ctypes.data % PAGE_BYTES == 0 for e in extra)
    assert len({e.ctypes.data for e in held + extra}) == 7
    stats = pool.stats()
    assert stats.overflows == 3
    assert stats.overflow_bytes == 3 * 16 * 1024
    assert stats.waits == 3
    assert stats.wait_s >= 3 * 0.05
    assert stats.pooled_bytes == 64 * 1024
    warnings = [r for r in caplog.records if "unpooled" in r.getMessage()]
    assert len(warnings) == 1
    assert "pool_bytes" in warnings[0].getMessage()


def test_waiting_acquire_gets_a_buffer_the_user_drops(backend: str) -> None:
    with BufferPool(16 * 1024, pin=False, wait_s=30.0) as p:
        held = [p.acquire(8192), p.acquire(8192)]
        addresses = {b.ctypes.data for b in held}
        timer = threading.Timer(0.05, held.clear)
        timer.start()
        buf = p.acquire(8192)
        timer.join()
        assert buf.ctypes.data in addresses
        stats = p.stats()
        assert stats.overflows == 0
        assert stats.waits == 1


def test_request_larger_than_the_pool_gets_an_unpooled_buffer(pool: BufferPool) -> None:
    big = pool.acquire(1 << 20)
    assert big.nbytes == 1 << 20
    assert big.ctypes.data % PAGE_BYTES == 0
    assert pool.stats().overflows == 1
    assert pool.stats().pooled_bytes == 0


def test_threads_never_share_a_buffer(backend: str) -> None:
    errors: list[str] = []
    with BufferPool(64 * 1024, pin=False, wait_s=5.0) as p:

        def work(tag: int) -> None:
            for _ in range(300):
                buf = p.acquire(8192)
                buf[:] = tag
                for _ in range(3):
                    if not (buf == tag).all():
                        errors.append(f"thread {tag} saw its buffer overwritten")
                del buf

        threads = [threading.Thread(target=work, args=(t,)) for t in range(1, 5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
        assert errors == []
        assert p.stats().pooled_bytes <= 64 * 1024


def test_close_refuses_new_acquires_and_keeps_held_data(pool: BufferPool) -> None:
    buf = pool.acquire(4096)
    buf[:] = 9
    pool.close()
    pool.close()
    assert (buf == 9).all()
    with pytest.raises(FastdataError, match="closed"):
        pool.acquire(10)
    assert pool.stats().buffers == 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"capacity_bytes": 100}, "capacity_bytes"),
        ({"capacity_bytes": True}, "capacity_bytes"),
        ({"capacity_bytes": 1 << 20, "pin": "yes"}, "pin"),
        ({"capacity_bytes": 1 << 20, "wait_s": -1}, "wait_s"),
        ({"capacity_bytes": 1 << 20, "wait_s": float("nan")}, "wait_s"),
    ],
)
def test_bad_pool_arguments_raise_config_error(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        BufferPool(**kwargs)


@pytest.mark.parametrize("nbytes", [-1, 1.5, True, "10"])
def test_acquire_rejects_bad_sizes(pool: BufferPool, nbytes: Any) -> None:
    with pytest.raises(ConfigError, match="acquire"):
        pool.acquire(nbytes)


def test_from_config_uses_pool_bytes_and_wait() -> None:
    cfg = PrefetchConfig(pool_bytes=3 * 2**20, pool_wait_s=0.25)
    with BufferPool.from_config(cfg, pin=False) as p:
        assert p.capacity_bytes == 3 * 2**20
        assert p.wait_s == 0.25


@pytest.mark.skipif(_HAS_CUDA, reason="checks the CPU-only behaviour")
def test_without_cuda_buffers_are_not_pinned_and_pin_true_is_refused() -> None:
    with BufferPool(1 << 20) as p:
        assert not p.is_pinned
        assert not p.stats().is_pinned
    with pytest.raises(ConfigError, match="needs CUDA"):
        BufferPool(1 << 20, pin=True)


class _FakeCudart:
    """Records host (un)registrations in place of the CUDA runtime."""

    def __init__(self) -> None:
        self.registered: dict[int, int] = {}
        self.events: list[tuple[str, int]] = []
        self.fail_next = False

    def register(self, address: int, nbytes: int) -> bool:
        if self.fail_next:
            self.fail_next = False
            return False
        assert address % PAGE_BYTES == 0
        self.registered[address] = nbytes
        self.events.append(("register", address))
        return True

    def unregister(self, address: int, owner: Any) -> None:
        # The memory must still be alive while it is unregistered.
        assert np.frombuffer(owner, dtype=np.uint8).ctypes.data == address
        del self.registered[address]
        self.events.append(("unregister", address))


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch, backend: str) -> _FakeCudart:
    fake = _FakeCudart()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(pool_mod, "_cuda_host_register", fake.register)
    monkeypatch.setattr(pool_mod, "_cuda_host_unregister", fake.unregister)
    monkeypatch.setattr(pool_mod, "_record_fence", _CompletedEvent)
    return fake


class _CompletedEvent:
    """A CUDA event that has already completed (no copy in flight)."""

    def query(self) -> bool:
        return True


def test_pinned_buffers_are_unregistered_before_they_are_freed(fake_cuda: _FakeCudart) -> None:
    p = BufferPool(64 * 1024, wait_s=0)
    assert p.is_pinned
    held = p.acquire(8192)
    free = p.acquire(8192)
    held_address, free_address = held.ctypes.data, free.ctypes.data
    del free
    assert set(fake_cuda.registered) == {held_address, free_address}
    tensor = torch.from_numpy(held)
    del held
    p.close()
    # The free buffer is unpinned at close; the held one only when its last view dies.
    assert set(fake_cuda.registered) == {held_address}
    del tensor
    gc.collect()
    assert fake_cuda.registered == {}
    assert [e for e, _ in fake_cuda.events] == ["register"] * 2 + ["unregister"] * 2


def test_evicted_pinned_buffers_are_unregistered(fake_cuda: _FakeCudart) -> None:
    with BufferPool(16 * 1024, wait_s=0) as p:
        small = p.acquire(16 * 1024)
        del small
        bigger = p.acquire(12 * 1024)  # another size class: evicts the free 16 KiB one
        assert p.stats().evictions == 1
        assert list(fake_cuda.registered) == [bigger.ctypes.data]
    del bigger
    gc.collect()
    assert fake_cuda.registered == {}


def test_pinning_failure_is_counted_and_the_buffer_still_works(fake_cuda: _FakeCudart) -> None:
    fake_cuda.fail_next = True
    with BufferPool(64 * 1024, wait_s=0) as p:
        buf = p.acquire(4096)
        buf[:] = 3
        assert p.stats().pin_failures == 1
        assert fake_cuda.registered == {}


def test_garbage_collected_pool_unpins_everything(fake_cuda: _FakeCudart) -> None:
    p = BufferPool(64 * 1024, wait_s=0)
    kept = p.acquire(4096)
    p.acquire(8192)
    del p
    gc.collect()
    assert list(fake_cuda.registered) == [kept.ctypes.data]
    del kept
    gc.collect()
    assert fake_cuda.registered == {}


@pytest.mark.gpu
@pytest.mark.skipif(not _HAS_CUDA, reason="needs CUDA")
def test_real_pinned_buffers_copy_to_the_gpu_without_blocking() -> None:
    with BufferPool(8 * 2**20) as p:
        assert p.is_pinned
        buf = p.acquire(2**20)
        buf[:] = np.arange(2**20) % 256
        host = torch.from_numpy(buf)
        assert host.is_pinned()
        device = host.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
        assert torch.equal(device.cpu(), host)
        assert p.stats().pin_failures == 0


class _FakeEvent:
    """A CUDA event whose completion the test decides."""

    done = False

    def query(self) -> bool:
        return _FakeEvent.done


def test_a_pinned_buffer_is_reused_only_after_its_copy_fence_completes(
    fake_cuda: _FakeCudart, monkeypatch: pytest.MonkeyPatch
) -> None:
    # NOTE[pool-fence]: a non_blocking copy may still read the buffer after the batch
    # is dropped; the pool waits for an event recorded once the buffer is seen unheld.
    fences: list[_FakeEvent] = []

    def record() -> _FakeEvent:
        fences.append(_FakeEvent())
        return fences[-1]

    monkeypatch.setattr(pool_mod, "_record_fence", record)
    monkeypatch.setattr(_FakeEvent, "done", False)
    with BufferPool(8192, wait_s=0) as p:
        first = p.acquire(4096)
        address = first.ctypes.data
        del first
        second = p.acquire(4096)  # the first is unheld but its fence is pending
        assert second.ctypes.data != address
        assert len(fences) == 1
        del second
        assert p.acquire(4096).ctypes.data not in (address,)  # pool full: overflow
        assert p.stats().overflows == 1
        monkeypatch.setattr(_FakeEvent, "done", True)
        assert p.acquire(4096).ctypes.data == address
        assert len(fences) == 2  # the second slot's fence, recorded while looking


def test_unpinned_buffers_need_no_fence(monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    monkeypatch.setattr(pool_mod, "_record_fence", lambda: pytest.fail("fence recorded"))
    with BufferPool(8192, pin=False, wait_s=0) as p:
        first = p.acquire(4096)
        address = first.ctypes.data
        del first
        assert p.acquire(4096).ctypes.data == address
