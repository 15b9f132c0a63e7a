"""The ``tar`` layout: WebDataset-style shards, members grouped into samples by key.

A member ``dir/000123.seg.png`` belongs to the sample with key ``dir/000123`` and gives
it the field ``seg.png`` (the part of the file name after its first dot). Consecutive
members with the same key form one sample; a sample never spans two shards. Members
without an extension and non-file members (directories, links) are skipped. GNU long
names and POSIX pax headers (``path``, ``size``) are honoured.

NOTE[tar-scan]: index time reads headers with few, large ranged reads. A shard of at most
``SCAN_WHOLE_BYTES`` is one read of the whole object. A larger one is walked window after
window: every header that lies in a window is parsed from it, and the next window starts
at the first header that does not. The first window is a ``SCAN_PROBE_BYTES`` probe; a
window after one whose walk ended inside it, or jumped less than ``SCAN_READ_BYTES`` past
its end, is ``SCAN_READ_BYTES + SCAN_SLACK_BYTES`` long; a window after a jump of at
least ``SCAN_READ_BYTES`` over a large member is a probe again, so that large payloads
are skipped, not downloaded. The count: a full read moves the walk on by at least
``SCAN_READ_BYTES``; a probe follows a window whose walk jumped at least that far past
its end, which moved the walk on by that much beyond its own length (twice
``SCAN_READ_BYTES`` for a full read), so each run of probes is paid for by the jumps
that start and continue it. Only the first probe and the last window go unpaid, and a
shard of ``n`` bytes takes at most ``n / SCAN_READ_BYTES + 2`` requests
while its metadata headers (pax, long names) stay below ``SCAN_SLACK_BYTES``. Shards are
walked concurrently, one thread each, up to the store's ``max_concurrency`` (at most
``SCAN_MAX_SHARDS``), which bounds the scan's memory to that many windows.

A sidecar ``<shard>.tar.fdidx`` (:func:`write_tar_index`, ``fastdata pack --index-only``)
holds a shard's member table with the shard's size and ETag; when it is listed beside a
shard and matches it, the shard's rows come from the sidecar and no shard byte is read.

NOTE[tar-members]: a shard's scan saves, in its per-object extra bytes, a JSON head
(``{"fields": {field: samples}, "names": n}``), a newline, then the member name of each
of its ``n`` samples (the key its members share, ``train/00001``: what WebDataset calls
the sample's ``__key__``) as ``n`` little-endian ``uint32`` end offsets and the UTF-8
names back to back. ``Dataset(metadata=("__member__",))`` reads them from the index with
no request (:func:`member_names`); sidecars hold every member's name, so a build from
sidecars saves them too. Indexes saved before names were stored hold the JSON head alone
and a ``scan_version`` below 2: they are scanned again when opened (NOTE[scan-version]).

Each sample row covers the bytes from its first header to the end of its last member's
data, so one sample (or a run of consecutive samples) is one ranged read.

The header walk is the part ``_tar_walk.py`` and the sidecar format the part
``_tar_sidecar.py``; this module is the layout over them, and re-exports their names.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from fastdata.errors import ConfigError
from fastdata.layouts._tar_sidecar import (
    SIDECAR_FORMAT,
    SIDECAR_SUFFIX,
    SIDECAR_VERSION,
    _read_sidecar,
    _sidecar_bytes,
)
from fastdata.layouts._tar_walk import (
    BLOCK,
    SCAN_MAX_SHARDS,
    SCAN_PROBE_BYTES,
    SCAN_READ_BYTES,
    SCAN_SLACK_BYTES,
    SCAN_WHOLE_BYTES,
    _concurrently,
    _field_of,
    _Member,
    _Walker,
    split_member_name,
    walk_shard,
)
from fastdata.layouts.base import (
    BuildResult,
    ObjectScan,
    PreviousScans,
    Sample,
    UnitView,
    concat_scans,
    corrupt,
    empty_rows,
    scan_with_reuse,
)
from fastdata.layouts.chunks import CHUNK_BYTES
from fastdata.store import ObjectInfo, Store, glob_to_regex

__all__ = [
    "BLOCK",
    "SCAN_MAX_SHARDS",
    "SCAN_PROBE_BYTES",
    "SCAN_READ_BYTES",
    "SCAN_SLACK_BYTES",
    "SCAN_WHOLE_BYTES",
    "SIDECAR_FORMAT",
    "SIDECAR_SUFFIX",
    "SIDECAR_VERSION",
    "TarLayout",
    "member_names",
    "split_member_name",
    "walk_shard",
    "write_tar_index",
]

logger = logging.getLogger(__name__)


def _field_counts(extra: bytes) -> dict[str, int] | None:
    """The per-field sample counts a scan saved in its extra bytes (None: none saved)."""
    if not extra:
        return None
    found = json.loads(extra.partition(b"\n")[0]).get("fields")
    return found if isinstance(found, dict) else None


def _scan_extra(counts: Mapping[str, int], names: Sequence[str]) -> bytes:
    """A shard's extra bytes (NOTE[tar-members]): the JSON head, then the member names."""
    head = json.dumps(
        {"fields": dict(sorted(counts.items())), "names": len(names)}, separators=(",", ":")
    )
    encoded = [name.encode("utf-8", "surrogateescape") for name in names]
    ends = np.cumsum([len(e) for e in encoded], dtype=np.int64)
    if len(ends) and ends[-1] > 0xFFFFFFFF:
        raise ConfigError(f"the member names of one tar shard exceed 4 GiB ({ends[-1]} bytes)")
    return b"".join([head.encode(), b"\n", ends.astype("<u4").tobytes(), *encoded])


def member_names(extra: np.ndarray | bytes, positions: np.ndarray) -> list[str] | None:
    """The member names (NOTE[tar-members]) of the samples at ``positions`` in their
    shard, from the shard's extra bytes (or a ``uint8`` array of them, not copied:
    ``SampleTable.extra_view``); ``None`` when the scan that
    made them stored none (an index saved before names were stored, or by ``save_index``).

    Raises:
        ValueError: The extra bytes are malformed.
    """
    data = extra if isinstance(extra, np.ndarray) else np.frombuffer(extra, dtype=np.uint8)
    view = data.data.cast("B")
    cut = bytes(view[:4096]).find(b"\n")
    if cut < 0:
        cut = bytes(view).find(b"\n")
    if cut < 0:
        return None
    count = json.loads(bytes(view[:cut])).get("names")
    if not isinstance(count, int):
        return None
    ends = np.frombuffer(view, dtype="<u4", count=count, offset=cut + 1)
    blob = view[cut + 1 + 4 * count :]
    if count and int(ends[-1]) != len(blob):
        raise ValueError(f"{len(blob)} bytes of member names where {int(ends[-1])} were saved")
    stops = ends[positions].tolist()
    starts = np.where(positions > 0, ends[np.maximum(positions - 1, 0)], 0).tolist()
    return [
        bytes(blob[a:b]).decode("utf-8", "surrogateescape")
        for a, b in zip(starts, stops, strict=True)
    ]


def write_tar_index(
    url: str,
    *,
    pattern: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    store: Store | None = None,
) -> list[str]:
    """Write a sidecar index ``<shard>.tar.fdidx`` next to every tar shard under ``url``.

    A sidecar holds the shard's member table (offsets, sizes and names of every member)
    with the shard's size and ETag. Indexing the dataset afterwards reads the sidecars
    instead of the shards' headers: no shard byte is read for a shard whose sidecar
    matches it. A shard rewritten later no longer matches its sidecar and is read as if
    it had none (with a warning). Truncated shards are described as they are, so
    ``on_truncated`` still decides at index time.

    Args:
        url: The dataset root.
        pattern: Glob selecting the shards (default ``**/*.tar``).
        storage_options: Passed to the store.
        store: An open store rooted at ``url`` to use instead.

    Returns:
        The paths of the sidecars written, relative to ``url``.

    Raises:
        ConfigError: No shard matches, or the pattern selects objects that are not tar.
        CorruptRecordError: A shard's headers are malformed (names shard and offset).
        StoreError: The store failed.
    """
    if pattern is not None and (not isinstance(pattern, str) or not pattern):
        raise ConfigError(f"pattern must be a non-empty glob such as '**/*.tar', got {pattern!r}")
    if store is None:
        store = Store(url, storage_options=dict(storage_options or {}))
    regex = glob_to_regex(pattern or TarLayout.default_pattern)
    shards = [
        info
        for info in store.list("")
        if regex.match(info.path) and not info.path.endswith(SIDECAR_SUFFIX)
    ]
    if not shards:
        raise ConfigError(
            f"no tar shards under {url!r} match {pattern or TarLayout.default_pattern!r}: "
            "check the URL and the pattern"
        )

    def one(info: ObjectInfo) -> str:
        path = info.path + SIDECAR_SUFFIX
        store.put_many([(path, _sidecar_bytes(info, walk_shard(store, info)))])
        return path

    return _concurrently(store, shards, one)


@dataclass(frozen=True)
class TarLayout:
    """WebDataset-style tar shards.

    Args:
        fields: Extensions to keep (``("jpg", "cls")``); ``None`` keeps every member.
            Samples with none of them are left out of the index.
        decode_cls: Decode the ``cls`` field (ASCII digits) to ``int``; otherwise it
            stays ``bytes`` like every other field.
        on_truncated: ``"raise"`` (default) refuses a shard whose last member is cut
            short; ``"skip"`` indexes the complete samples before it and warns.
    """

    name: ClassVar[str] = "tar"
    default_pattern: ClassVar[str] = "**/*.tar"
    scan_version: ClassVar[int] = 2
    """What its scans save (NOTE[scan-version]): 2 adds the member names
    (NOTE[tar-members]); an index saved by an older scan is scanned again."""
    fields: tuple[str, ...] | None = None
    decode_cls: bool = False
    on_truncated: Literal["raise", "skip"] = "raise"

    def __post_init__(self) -> None:
        if self.on_truncated not in ("raise", "skip"):
            raise ConfigError(
                f"tar layout on_truncated must be 'raise' or 'skip', got {self.on_truncated!r}"
            )
        if not isinstance(self.decode_cls, bool):
            raise ConfigError(
                f"tar layout decode_cls must be True or False, got {self.decode_cls!r}"
            )

    aux_is_content: ClassVar[bool] = True
    unit_extra: ClassVar[bool] = False
    """Decoding needs no extra bytes: a unit is not handed a copy of the names."""
    chunk_bytes: ClassVar[int] = CHUNK_BYTES
    """A cold read fetches whole chunks of a shard (NOTE[shard-chunks])."""

    def record_options(self) -> dict[str, Any]:
        """Every setting: each one changes what a record holds."""
        return self.options()

    def index_fields(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """None: every field comes from the fetched bytes."""
        return {}

    def options(self) -> dict[str, Any]:
        """The settings that shape the samples (part of the dataset id)."""
        return {
            "fields": list(self.fields) if self.fields is not None else None,
            "decode_cls": self.decode_cls,
            "on_truncated": self.on_truncated,
        }

    def build(
        self, store: Store, objects: Sequence[ObjectInfo], previous: PreviousScans | None
    ) -> BuildResult:
        """Read every shard's headers (NOTE[tar-scan]); no sidecars are looked for."""
        return self.build_with_companions(store, objects, previous, {})

    def build_with_companions(
        self,
        store: Store,
        objects: Sequence[ObjectInfo],
        previous: PreviousScans | None,
        companions: Mapping[str, ObjectInfo],
    ) -> BuildResult:
        """Index the shards, from their sidecar indexes where ``companions`` (the other
        listed objects, by path) hold matching ones, else by reading their headers.

        Raises:
            ConfigError: A field of ``fields`` is in no sample of any shard.
            CorruptRecordError: A shard is malformed (names it and the byte offset).
        """
        scans = scan_with_reuse(
            objects,
            previous,
            lambda batch: _concurrently(store, batch, lambda i: self._index(store, i, companions)),
            batch=max(1, len(objects)),
        )
        self._check_fields(objects, scans)
        return BuildResult(rows=concat_scans(scans), extras=[s.extra for s in scans])

    def _index(
        self, store: Store, info: ObjectInfo, companions: Mapping[str, ObjectInfo]
    ) -> ObjectScan:
        sidecar = companions.get(info.path + SIDECAR_SUFFIX)
        walker = _read_sidecar(store, info, sidecar) if sidecar is not None else None
        return self._rows(walker if walker is not None else walk_shard(store, info))

    def _check_fields(self, objects: Sequence[ObjectInfo], scans: Sequence[ObjectScan]) -> None:
        if self.fields is None:
            return
        counts: Counter[str] = Counter()
        for scan in scans:
            found = _field_counts(scan.extra)
            if found is None:  # scanned by an older version: nothing to compare with
                return
            counts.update(found)
        missing = [f for f in self.fields if f not in counts]
        if not missing:
            return
        have = ", ".join(f"{name!r} ({n} samples)" for name, n in counts.most_common(20))
        examples = ", ".join(repr(o.path) for o in objects[:3]) + (
            ", ..." if len(objects) > 3 else ""
        )
        raise ConfigError(
            f"no sample of the {len(objects)} tar shard(s) ({examples}) "
            f"has the field(s) {missing}; the fields they have: {have or 'none'}. A tar field "
            "is a member's extension after the first dot of its name ('jpg', 'seg.png'): fix "
            "fields=, or leave it out to keep every field"
        )

    def _rows(self, walker: _Walker) -> ObjectScan:
        members = walker.members
        if walker.truncated_at is not None:
            if self.on_truncated == "raise":
                walker.raise_if_truncated()
            members = self._drop_partial_sample(walker)
        groups = self._group(members, walker.path)
        counts = Counter(_field_of(m) for group in groups for m in group)
        if self.fields is not None:
            wanted = set(self.fields)
            groups = [g for g in groups if any(_field_of(m) in wanted for m in g)]
        rows = empty_rows(len(groups))
        for i, group in enumerate(groups):
            last = group[-1]
            rows[i]["offset"] = group[0].start
            rows[i]["length"] = last.data_start + last.size - group[0].start
            rows[i]["aux"] = len(group)
        names = [(split_member_name(g[0].name) or ("", ""))[0] for g in groups]
        return ObjectScan(rows, _scan_extra(counts, names))

    def _drop_partial_sample(self, walker: _Walker) -> list[_Member]:
        members = list(walker.members)
        cut = walker.truncated_at
        split = split_member_name(walker.truncated_name)
        lost_key = split[0] if split else None
        # The members of the cut sample that came before the cut go too.
        while members and lost_key is not None:
            split = split_member_name(members[-1].name)
            if split is None or split[0] != lost_key:
                break
            members.pop()
        message = (
            f"tar shard {walker.path!r} is truncated at byte {cut}; indexing the "
            f"{len(members)} complete members before it (on_truncated='skip')"
        )
        logger.warning(message)
        warnings.warn(message, stacklevel=2)
        return members

    def _group(self, members: list[_Member], path: str) -> list[list[_Member]]:
        groups: list[list[_Member]] = []
        keys: list[str] = []
        for member in members:
            split = split_member_name(member.name)
            if split is None:
                continue
            key, ext = split
            if groups and keys[-1] == key:
                if any(split_member_name(m.name) == split for m in groups[-1]):
                    raise corrupt(path, member.start, f"sample {key!r} has two {ext!r} members")
                groups[-1].append(member)
            else:
                groups.append([member])
                keys.append(key)
        return groups

    def fetch_spans(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """From the first header to the end of the last member's data."""
        return rows["offset"], rows["offset"] + rows["length"]

    def decode_unit(self, unit: UnitView) -> list[Sample]:
        """One dict per row: each member's extension maps to its bytes (a zero-copy
        ``memoryview`` of the response)."""
        out: list[Sample] = []
        for offset, length, sid in zip(
            unit.rows["offset"].tolist(),
            unit.rows["length"].tolist(),
            unit.sample_ids.tolist(),
            strict=True,
        ):
            begin = offset - unit.start
            walker = _Walker(unit.path, offset + length, offset, sample_id=sid)
            walker.feed(unit.view[begin : begin + length], offset)
            walker.raise_if_truncated()
            if not walker.done:
                raise corrupt(
                    unit.path, walker.pos, "a tar header runs past the sample", sample_id=sid
                )
            out.append(self._sample(unit, walker.members, sid))
        return out

    def _sample(self, unit: UnitView, members: list[_Member], sid: int) -> dict[str, Any]:
        sample: dict[str, Any] = {}
        for member in members:
            split = split_member_name(member.name)
            if split is None or (self.fields is not None and split[1] not in self.fields):
                continue
            begin = member.data_start - unit.start
            # A zero-copy view of the response: the record encoder copies it once.
            data = unit.view[begin : begin + member.size]
            if split[1] == "cls" and self.decode_cls:
                sample["cls"] = _decode_cls(data.tobytes(), unit.path, member.data_start, sid)
            else:
                sample[split[1]] = data
        return sample

    def estimate_bytes(self, rows: np.ndarray) -> np.ndarray:
        """The sample's byte range (headers included)."""
        return rows["length"].astype(np.int64)


def _decode_cls(data: bytes, path: str, offset: int, sid: int) -> int:
    text = data.strip()
    if not text or not text.lstrip(b"-").isdigit():
        raise corrupt(path, offset, f"cls member {data[:32]!r} is not an integer", sample_id=sid)
    return int(text)
