"""The cache's source side: the :class:`SampleSource` protocol, and reading records from
it with the transfer retry (NOTE[transfer-retry]).

NOTE[transfer-retry]: a record that arrives whole from the source (packed shards, read by
byte ranges the store cannot check) carries its own CRC, which ``record.to_record``
verifies. A mismatch means the bytes were damaged on the way, so the sample is read
again, at most ``_TRANSFER_ATTEMPTS`` times in all; only a mismatch that persists raises,
naming the object and the byte range.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from fastdata import record
from fastdata.cache.tier import StatsRecorder
from fastdata.errors import ConfigError, CorruptRecordError

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = ["SampleSource", "read_records"]

_log = logging.getLogger("fastdata.cache.chain")  # the chain's logger: this is its part
_TRANSFER_ATTEMPTS = 4


@runtime_checkable
class SampleSource(Protocol):
    """A dataset bound to its store: what the cache reads misses from.

    ``fastdata.index.SampleIndex.source(store)`` provides one; tests use small fakes.
    """

    @property
    def dataset_id(self) -> bytes:
        """8 bytes, the prefix of every key of this dataset."""
        ...

    @property
    def url(self) -> str:
        """Where the dataset lives (the index's normalized URL); the tiers register the
        dataset under it, so ``fastdata stats`` and ``fastdata clear --dataset URL`` find it."""
        ...

    def __len__(self) -> int:
        """Number of samples."""
        ...

    def keys(self, sample_ids: Sequence[int]) -> list[bytes]:
        """16-byte cache keys: ``dataset_id + be_u64(sample_id)``."""
        ...

    def fingerprints(self, sample_ids: Sequence[int]) -> list[bytes]:
        """16-byte fingerprints of the source objects (a digest of ETag and size)."""
        ...

    def read_samples(self, sample_ids: Sequence[int]) -> list[Any]:
        """The samples (dicts of fields, or raw records), in the order of ``sample_ids``."""
        ...


def read_records(source: SampleSource, sample_ids: list[int], stats: StatsRecorder) -> list[Buffer]:
    """The records of ``sample_ids``, read from ``source`` and encoded (NOTE[transfer-retry]).

    Args:
        source: Where the samples are read from.
        sample_ids: The ids, in the order the records come back.
        stats: The chain's counters (``corrupt_transfers`` counts each record read again).

    Raises:
        CorruptRecordError: A record failed its checksum in every attempt.
        ConfigError: The source returned a different number of samples.
    """
    out: list[Buffer | None] = [None] * len(sample_ids)
    todo = list(range(len(sample_ids)))
    for attempt in range(1, _TRANSFER_ATTEMPTS + 1):
        samples = source.read_samples([sample_ids[i] for i in todo])
        if len(samples) != len(todo):
            raise ConfigError(
                f"source.read_samples returned {len(samples)} samples for {len(todo)} ids"
            )
        failed: list[tuple[int, CorruptRecordError]] = []
        for i, sample in zip(todo, samples, strict=True):
            try:
                out[i] = record.to_record(sample)
            except CorruptRecordError as exc:
                failed.append((i, exc))
        if not failed:
            break
        stats.add(corrupt_transfers=len(failed))
        where = _describe(source, sample_ids[failed[0][0]])
        if attempt == _TRANSFER_ATTEMPTS:
            first, cause = failed[0]
            raise CorruptRecordError(
                f"sample {sample_ids[first]} ({where}) failed its record checksum in each "
                f"of {attempt} reads from the store: {cause}. The stored bytes are "
                "damaged; rewrite the shard (fastdata pack) or exclude it with `pattern`",
                sample_id=sample_ids[first],
                offset=cause.offset,
            ) from cause
        _log.warning(
            "%d record(s) read from the store failed their checksum (first: sample %d, "
            "%s); reading them again (attempt %d of %d)",
            len(failed),
            sample_ids[failed[0][0]],
            where,
            attempt + 1,
            _TRANSFER_ATTEMPTS,
        )
        todo = [i for i, _ in failed]
    return out  # type: ignore[return-value]  # every slot was filled or we raised


def _describe(source: SampleSource, sample_id: int) -> str:
    describe = getattr(source, "describe", None)
    return str(describe(sample_id)) if callable(describe) else f"of {source.url}"
