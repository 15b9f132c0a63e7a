"""NOTE[store-verify]: which reads are checked against what, under each policy; no server."""

from __future__ import annotations

import base64
import hashlib
import logging
import re
import zlib

import google_crc32c
import pytest

from fastdata.config import FastdataConfig, StoreConfig
from fastdata.errors import ConfigError
from fastdata.store import ByteRange, Store
from fastdata.store._faults import CorruptTransfer
from fastdata.store._job import ReadJob
from fastdata.store._retry import Counters
from fastdata.store._verify import PartSizeNeeded, Verifier, checksums_in, multipart_etag

DATA = bytes(range(256)) * 40


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


CRC32C = _b64(int(google_crc32c.value(DATA)).to_bytes(4, "big"))
CRC32 = _b64(zlib.crc32(DATA).to_bytes(4, "big"))
SHA256 = _b64(hashlib.sha256(DATA).digest())
MD5 = hashlib.md5(DATA).hexdigest()


def _job(
    start: int = 0,
    end: int | None = None,
    etag: str | None = MD5,
    checksums: dict[str, str] | None = None,
) -> ReadJob:
    job = ReadJob(ByteRange("k.bin", start, end))
    job.note_response(len(DATA), etag, checksums)
    return job


def _verifier(mode: str, plain_http: bool = True) -> Verifier:
    return Verifier(mode, plain_http=plain_http, counters=Counters(), endpoint="h:1")  # type: ignore[arg-type]


def _flip(data: bytes) -> bytearray:
    out = bytearray(data)
    out[100] ^= 0x40
    return out


@pytest.mark.parametrize(
    "checksums", [{"crc32c": CRC32C}, {"crc32": CRC32}, {"sha256": SHA256}], ids=str
)
@pytest.mark.parametrize("plain_http", [True, False])
def test_a_stored_checksum_is_checked_under_auto_on_every_endpoint(
    checksums: dict[str, str], plain_http: bool
) -> None:
    verifier = _verifier("auto", plain_http)
    assert verifier.check(_job(etag="not-an-md5-etag", checksums=checksums), DATA)
    with pytest.raises(CorruptTransfer, match=next(iter(checksums)).upper()):
        verifier.check(_job(etag="x", checksums=checksums), bytes(_flip(DATA)))
    snap = verifier.counters.snapshot("t")
    assert (snap.verified_reads, snap.corrupt_transfers) == (1, 1)


def test_the_md5_etag_is_checked_on_plain_http_or_always_but_not_by_auto_over_https() -> None:
    assert _verifier("auto", plain_http=True).check(_job(), DATA)
    assert _verifier("always", plain_http=False).check(_job(), DATA)
    assert not _verifier("auto", plain_http=False).check(_job(), bytes(_flip(DATA)))
    with pytest.raises(CorruptTransfer, match="MD5"):
        _verifier("auto", plain_http=True).check(_job(), _flip(DATA))


def test_nothing_is_checked_under_never() -> None:
    verifier = _verifier("never")
    assert not verifier.ask_checksums
    assert not verifier.check(_job(checksums={"crc32c": CRC32C}), bytes(_flip(DATA)))


def test_ranges_multipart_etags_and_composite_checksums_are_not_checkable() -> None:
    verifier = _verifier("always")
    assert not verifier.check(_job(0, 100), DATA[:100])
    assert not verifier.check(_job(5), DATA[5:])
    # No usual part size gives 3 parts of 10 KiB: the backend is asked for the first
    # part's size; one that cannot tell leaves the read unverified.
    with pytest.raises(PartSizeNeeded):
        verifier.check(_job(etag=f"{MD5[:-2]}ab-3"), DATA)
    assert not verifier.check(_job(etag=f"{MD5[:-2]}ab-3"), DATA, part_bytes=0)
    assert not verifier.check(_job(etag=f"{MD5[:-2]}ab-3"), DATA)  # asked once per object
    headers = {"x-amz-checksum-crc32": "iiyQ6Q==-3", "x-amz-checksum-type": "COMPOSITE"}
    assert checksums_in(headers) == {}
    assert checksums_in({"x-amz-checksum-crc32c": CRC32C}) == {"crc32c": CRC32C}
    # A range that covers the whole object is a whole read.
    assert verifier.check(_job(0, 10**9), DATA)


def test_the_first_part_size_verifies_a_multipart_body_of_unusual_parts() -> None:
    """NOTE[multipart-etag]: HEAD ?partNumber=1 gave 4096 bytes: that size verifies the
    body, and a damaged body fails, whatever PART_SIZES holds."""
    verifier = _verifier("always")
    etag = f"{multipart_etag(DATA, 4096).hex()}-3"
    with pytest.raises(PartSizeNeeded):
        verifier.check(_job(etag=etag), DATA)
    assert verifier.check(_job(etag=etag), DATA, part_bytes=4096)
    assert verifier.check(_job(etag=etag), DATA)  # the size is kept for the object
    damaged = bytes([DATA[0] ^ 1]) + DATA[1:]
    with pytest.raises(CorruptTransfer, match=r"parts of 4096 bytes \(its first part's size\)"):
        verifier.check(_job(etag=etag), damaged)


def test_an_etag_that_two_identical_bodies_contradict_is_not_an_md5(
    caplog: pytest.LogCaptureFixture,
) -> None:
    verifier = _verifier("always")
    job = _job(etag="0" * 32)
    with pytest.raises(
        CorruptTransfer, match=r"MD5 of the 10240-byte body of 'k\.bin' is .*its ETag"
    ):
        verifier.check(job, DATA)
    job.restart()
    job.note_response(len(DATA), "0" * 32)
    with caplog.at_level(logging.WARNING):
        assert not verifier.check(job, DATA)  # the same bytes again: the ETag is no MD5
    assert "not MD5 digests" in caplog.text
    assert not verifier.md5
    assert not verifier.check(_job(etag="1" * 32), DATA)


def test_verify_transfers_is_validated_and_read_from_the_environment() -> None:
    with pytest.raises(ConfigError, match="verify_transfers"):
        StoreConfig(verify_transfers="sometimes")  # type: ignore[arg-type]
    env = {"FASTDATA_STORE_VERIFY_TRANSFERS": "always"}
    assert FastdataConfig.from_env(env).store.verify_transfers == "always"
    with pytest.raises(ConfigError, match="FASTDATA_STORE_VERIFY_TRANSFERS='yes': choose one of"):
        FastdataConfig.from_env({"FASTDATA_STORE_VERIFY_TRANSFERS": "yes"})


def test_count_corrupt_transfer_counts_and_checks_its_arguments(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = Store("memory://fastdata-verify-count")
    with caplog.at_level(logging.WARNING):
        store.count_corrupt_transfer("shard-0.bin", 100, 200)
    assert store.stats().corrupt_transfers == 1
    assert "bytes [100, 200) of memory://fastdata-verify-count/shard-0.bin" in caplog.text
    for bad, match in [
        (("", 0, 1), "count_corrupt_transfer: object path must be a non-empty str"),
        (("/abs", 0, 1), "(no leading '/'), got '/abs'"),
        (("k", -1, None), "ByteRange('k') start must be an int >= 0, got -1"),
        (("k", 5, 2), "ByteRange('k') end must be None or an int >= start (5), got 2"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(match)):
            store.count_corrupt_transfer(*bad)  # type: ignore[arg-type]
    store.close()
