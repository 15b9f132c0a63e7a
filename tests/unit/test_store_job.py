"""ReadJob.receive: the one loop both backends stream a response body through."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from fastdata.store import ByteRange
from fastdata.store._faults import ShortBodyError
from fastdata.store._fsspec import FsspecBackend
from fastdata.store._job import ReadJob
from fastdata.store._obstore import ObstoreBackend

DATA = bytes(range(256)) * 40  # 10,240 bytes


async def chunks_of(parts: Sequence[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


def receive(job: ReadJob, parts: Sequence[bytes], size: int, counted: list[int]) -> bytearray:
    return asyncio.run(job.receive(chunks_of(parts), size, "etag-1", counted.append))


def test_a_whole_body_arrives_in_order_and_is_counted() -> None:
    job, counted = ReadJob(ByteRange("a")), []
    got = receive(job, [DATA[:4000], DATA[4000:9000], DATA[9000:]], len(DATA), counted)
    assert bytes(got) == DATA
    assert counted == [4000, 5000, 1240]
    assert job.pin == "etag-1"


def test_a_short_body_keeps_what_arrived_and_the_resumed_part_completes_it() -> None:
    job, counted = ReadJob(ByteRange("a")), []
    with pytest.raises(ShortBodyError, match="ended at 6000/10240"):
        receive(job, [DATA[:6000]], len(DATA), counted)
    assert (job.filled, job.next_start, job.pin) == (6000, 6000, "etag-1")
    assert bytes(receive(job, [DATA[6000:]], len(DATA) - 6000, counted)) == DATA


@pytest.mark.parametrize("parts", [[DATA + b"x"], [DATA[:10_000], DATA[10_000:] + b"xyz"]])
def test_a_body_longer_than_announced_is_dropped_whole(parts: list[bytes]) -> None:
    job = ReadJob(ByteRange("a", etag="caller-pin"))
    with pytest.raises(ShortBodyError, match="longer than its announced 10240 bytes"):
        receive(job, parts, len(DATA), [])
    assert (job.buf, job.filled, job.pin) == (None, 0, "caller-pin")  # next: from scratch


def test_a_resumed_body_of_another_length_restarts_the_read() -> None:
    job = ReadJob(ByteRange("a"))
    with pytest.raises(ShortBodyError, match="body of 'a' ended at 6000/10240"):
        receive(job, [DATA[:6000]], len(DATA), [])
    with pytest.raises(ShortBodyError, match="unexpected length"):
        receive(job, [DATA[6000:]], len(DATA), [])  # announces the whole object again
    assert (job.buf, job.filled, job.pin) == (None, 0, None)


class _Body:
    """aiobotocore's StreamingBody as the fsspec backend reads it."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    async def read(self, n: int = -1) -> bytes:
        chunk, self._data = self._data[:n], self._data[n:]
        return chunk


class _Result:
    """obstore's GetResult as the obstore backend streams it."""

    def __init__(self, data: bytes) -> None:
        self.meta = {"e_tag": '"etag-1"'}
        self._data = data

    async def stream(self, min_chunk_size: int) -> AsyncIterator[bytes]:
        for i in range(0, len(self._data), 3000):
            yield self._data[i : i + 3000]


def _backend_self() -> Any:
    counted: list[int] = []
    counters = SimpleNamespace(add=lambda name, n=1: counted.append(n))
    fake = SimpleNamespace(counters=counters, counted=counted)
    fake._count_read = lambda n: counters.add("bytes_read", n)
    return fake


@pytest.mark.parametrize("backend", ["fsspec", "obstore"])
def test_both_backends_refuse_a_body_longer_than_announced(backend: str) -> None:
    fake, job = _backend_self(), ReadJob(ByteRange("big"))
    if backend == "fsspec":
        read = FsspecBackend._s3_stream(fake, job, _Body(DATA + b"extra"), len(DATA), '"etag-1"')
    else:
        read = ObstoreBackend._stream(fake, job, _Result(DATA + b"extra"), len(DATA))
    with pytest.raises(ShortBodyError, match="longer than"):
        asyncio.run(read)
    assert job.buf is None


@pytest.mark.parametrize("backend", ["fsspec", "obstore"])
def test_both_backends_stream_an_exact_body(backend: str) -> None:
    fake, job = _backend_self(), ReadJob(ByteRange("big"))
    if backend == "fsspec":
        read = FsspecBackend._s3_stream(fake, job, _Body(DATA), len(DATA), '"etag-1"')
    else:
        read = ObstoreBackend._stream(fake, job, _Result(DATA), len(DATA))
    assert bytes(asyncio.run(read)) == DATA
    assert sum(fake.counted) == len(DATA)
    assert job.pin == "etag-1"
