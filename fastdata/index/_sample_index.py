"""An opened sample index: :class:`SampleIndex` and :class:`IndexSource`, the cache's view.

A :class:`SampleIndex` maps one saved table version (``fastdata.layouts.table``) and
answers per-sample questions batch by batch with numpy: ids, places, cache keys and
fingerprints (NOTE[cache-keys] in ``fastdata/index/_keys.py``), field kinds, read units;
its reads run in ``fastdata/index/_read.py``. ``fastdata.index`` opens and builds it and
re-exports both classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fastdata.errors import ConfigError, CorruptRecordError
from fastdata.index._keys import key_words, mix, namespace_id
from fastdata.index._manifest import ManifestParts
from fastdata.index._read import UnitReader
from fastdata.index._source_base import BoundSource
from fastdata.layouts import Layout, Sample, make_layout
from fastdata.layouts.ranges import SharedRanges
from fastdata.layouts.table import SampleTable
from fastdata.layouts.tar import member_names
from fastdata.store import ObjectInfo, Store

__all__ = ["IndexSource", "SampleIndex"]


class SampleIndex:
    """An opened sample index (use :func:`fastdata.index.open_index`).

    Sample ``i`` is row ``i`` of the table; ids are stable for an unchanged source.
    The index pickles as its directory, URL and storage options, and maps the arrays
    again in the receiving process.
    """

    def __init__(
        self,
        table: SampleTable,
        *,
        storage_options: Mapping[str, Any] | None = None,
        store: Store | None = None,
    ) -> None:
        self._table = table
        meta = table.meta
        self.url: str = meta["url"]
        """The normalized dataset URL."""
        self.dataset_id: bytes = bytes.fromhex(meta["dataset_id"])
        """8 bytes naming this spec's root: a digest of the store identity and the URL
        (NOTE[cache-keys]); its saved index, warm claims and ``fastdata stats`` row."""
        self.store_identity: str = meta["store_identity"]
        """``Store.identity`` of the store the index was built from."""
        self.namespace: bytes = namespace_id(self.store_identity)
        """8 bytes, the record namespace of the store (NOTE[cache-keys]): every key of
        its samples starts with it, shared by every spec over the same store."""
        self.built_at: float = float(meta.get("built_at", 0.0))
        """When the index version was built (seconds since the epoch)."""
        self.fingerprint: str = meta["fingerprint"]
        """Digest of the source listing (paths, sizes, ETags)."""
        self.pattern: str = meta["pattern"]
        """The glob that selected the objects."""
        options = dict(meta["layout_options"])
        self.layout: Layout = make_layout(
            meta["layout"], fields=options.pop("fields", None), **options
        )
        """The layout that reads the samples."""
        self.storage_options = dict(storage_options or {})
        self._prefix = np.frombuffer(self.namespace, dtype=np.uint8)
        self._recipe, self._salt = key_words(self.store_identity, self.layout)
        self._shard_sizes: np.ndarray | None = None
        self._reader = UnitReader(table, self.layout, self.url)
        self.chunk_bytes: int = self._reader.chunk_bytes
        """The fetch chunk of shard layouts (packed, tar), 0 for others (NOTE[shard-chunks])."""
        # NOTE[shared-ranges]: rows of a fetched row group (or chunk) kept until they are read.
        self._shared: SharedRanges | None = self._reader.shared
        # NOTE[manifest-parts]: a table opened from a manifest fetches its rows lazily.
        self._parts: ManifestParts | None = None
        if "manifest" in meta:
            # The rows parts come through the store the index was opened with, else
            # through one on its URL (a reader's own store is used where it passes one).
            parts_store = store or Store(self.url, storage_options=storage_options)
            self._parts = ManifestParts(table, parts_store)

    @property
    def generation(self) -> str | None:
        """The manifest generation this index was opened from (``fastdata publish``), or
        ``None`` for an index built from a listing."""
        manifest = self._table.meta.get("manifest")
        return str(manifest["generation"]) if manifest is not None else None

    def __reduce__(self) -> tuple[Any, ...]:
        return (_reopen, (str(self._table.directory), self.storage_options))

    def __repr__(self) -> str:
        return (
            f"SampleIndex({self.url!r}, layout={self.layout.name!r}, samples={len(self)}, "
            f"objects={self.object_count}, fingerprint={self.fingerprint[:12]!r})"
        )

    def __len__(self) -> int:
        return len(self._table)

    @property
    def path(self) -> Path:
        """The directory holding this index version."""
        return self._table.directory

    @property
    def object_count(self) -> int:
        """Number of source objects."""
        return self._table.object_count

    @property
    def classes(self) -> list[str] | None:
        """ImageFolder class names in label order (files layout with ``labels=True``)."""
        found = self._table.meta.get("layout_meta", {}).get("classes")
        return list(found) if found is not None else None

    @property
    def field_kinds(self) -> dict[str, str]:
        """NOTE[field-kinds]: what each field of a sample is, decided when the index was
        built, never by a batch: ``"bytes"``, ``"str"``, ``"scalar"``, ``"fixed"`` (an
        array of one shape in every sample) or ``"var"`` (an array whose shape varies).

        A ``"*"`` entry gives the kind of every field not named (tar members). Fields
        absent here (arrays of packed records, whose shards carry no schema) are
        decided per batch: ``[N, *shape]`` when the shapes agree.
        """
        saved = self._table.meta.get("layout_meta", {}).get("field_kinds")
        if saved is None and self.layout.name == "parquet":  # an index saved before kinds
            table = self._table
            infos = [table.object_info(i) for i in range(table.object_count)]
            extras = [table.extra(i) for i in range(table.object_count)]
            saved = self.layout._field_kinds(infos, extras)  # type: ignore[attr-defined]
            table.meta.setdefault("layout_meta", {})["field_kinds"] = saved
        kinds: dict[str, str] = dict(saved) if saved is not None else {}
        options = self.layout.options()
        if self.layout.name == "files":
            kinds.setdefault("data", "bytes")
            if options.get("labels"):
                kinds.setdefault("label", "scalar")
        elif self.layout.name == "tar":
            kinds.setdefault("*", "bytes")
            if options.get("decode_cls"):
                kinds.setdefault("cls", "scalar")
        return kinds

    def object_info(self, i: int) -> ObjectInfo:
        """Source object ``i`` as listed when the index was built."""
        if not 0 <= i < self.object_count:
            raise ConfigError(f"object {i} out of range: {self.url} has {self.object_count}")
        return self._table.object_info(i)

    def locations(self, sample_ids: Any) -> np.ndarray:
        """The table rows of ``sample_ids`` (fields ``obj``, ``aux``, ``offset``, ``length``)."""
        return np.asarray(self._table.rows[self._ids(sample_ids)])

    def _ids(self, sample_ids: Any, store: Store | None = None) -> np.ndarray:
        ids = np.asarray(sample_ids)
        if ids.ndim != 1:
            raise ConfigError(f"sample_ids must be a 1-D sequence of ints, got shape {ids.shape}")
        if ids.size == 0:
            return np.zeros(0, dtype=np.int64)
        if ids.dtype.kind not in "iu":
            raise ConfigError(f"sample_ids must be integers, got dtype {ids.dtype}")
        low, high = ids.min(), ids.max()
        if low < 0 or high >= len(self):
            bad = low if low < 0 else high
            raise ConfigError(
                f"sample id {int(bad)} out of range: {self.url} has {len(self)} samples "
                f"(ids 0..{len(self) - 1})"
            )
        ids = ids.astype(np.int64, copy=False)
        if self._parts is not None:
            self._parts.ensure(ids, store)
        return ids

    def _content_words(self, sample_ids: Any) -> tuple[np.ndarray, ...]:
        """Per sample: the object's digest halves, offset, length and content ``aux``."""
        rows = self._table.rows[self._ids(sample_ids)]
        objects = self._table.objects[rows["obj"]]
        aux = rows["aux"].astype(np.uint64)
        if not self.layout.aux_is_content:
            aux = np.zeros_like(aux)
        return objects["d0"], objects["d1"], rows["offset"], rows["length"], aux

    def keys(self, sample_ids: Any) -> list[bytes]:
        """16-byte cache keys: the namespace, then 8 bytes of the sample's source version.

        NOTE[cache-keys]: the first half is the store's namespace, the second depends
        only on the object's version (full name, size, ETag), the sample's byte range
        and the record settings, never on the spec that found the sample, so specs over
        the same objects share entries.
        """
        d0, d1, offset, length, aux = self._content_words(sample_ids)
        word = mix(d0 ^ mix(d1 ^ mix(offset ^ mix(length ^ mix(aux ^ self._recipe)))))
        out = np.empty((len(word), 16), dtype=np.uint8)
        out[:, :8] = self._prefix
        out[:, 8:] = word.astype(">u8").view(np.uint8).reshape(-1, 8)
        flat = out.tobytes()
        return [flat[i : i + 16] for i in range(0, len(flat), 16)]

    def fingerprints(self, sample_ids: Any) -> list[bytes]:
        """16 bytes per sample: its object's digest (path, size, ETag) mixed with its place.

        The place (offset, length, content ``aux``), the record settings and the store
        identity are mixed in, so an entry is served only for the very bytes it was
        made from (NOTE[cache-keys]); a key that collides is a miss.
        """
        d0, d1, offset, length, aux = self._content_words(sample_ids)
        words = np.empty((len(d0), 2), dtype="<u8")
        words[:, 0] = d0 ^ mix(offset ^ mix(length ^ self._salt[0]))
        words[:, 1] = d1 ^ mix(aux ^ mix(offset ^ mix(self._recipe ^ self._salt[1])))
        flat = words.tobytes()
        return [flat[i : i + 16] for i in range(0, len(flat), 16)]

    def index_fields(self, sample_ids: Any) -> dict[str, np.ndarray]:
        """Fields that come from the table rather than the fetched bytes (the files
        layout's ``label``), one array per field in the order of ``sample_ids``."""
        return self.layout.index_fields(self._table.rows[self._ids(sample_ids)])

    def object_keys(self, sample_ids: Any) -> list[str]:
        """Each sample's object key relative to the URL (``Dataset(metadata=("__key__",))``)."""
        objects = self._table.rows["obj"][self._ids(sample_ids)]
        unique, inverse = np.unique(objects, return_inverse=True)
        paths = [self._table.path(int(o)) for o in unique.tolist()]
        return [paths[i] for i in inverse.tolist()]

    def member_names(self, sample_ids: Any) -> list[str]:
        """Each tar sample's member name in its shard, the key its members share
        (``Dataset(metadata=("__member__",))``; NOTE[tar-members]), read from the index.

        Raises:
            ConfigError: The layout is not tar, an id is out of range, or the index holds
                no names (saved by ``save_index``).
            CorruptRecordError: The saved names do not fit the table.
        """
        if self.layout.name != "tar":
            raise ConfigError(
                f"member names are kept by the 'tar' layout only; {self.url} has the "
                f"{self.layout.name!r} layout (its object keys are '__key__')"
            )
        ids = self._ids(sample_ids)
        objects = self._table.rows["obj"][ids]
        starts = self._table.first_rows()
        out: list[str] = [""] * len(ids)
        for obj in np.unique(objects).tolist():
            where = np.flatnonzero(objects == obj)
            first = int(starts[obj])
            try:
                names = member_names(self._table.extra_view(obj), ids[where] - first)
            except (ValueError, IndexError, KeyError, TypeError, AttributeError) as exc:
                raise CorruptRecordError(
                    f"the member names saved in index {self.path} for object "
                    f"{self._table.path(obj)!r} are malformed ({exc}): delete {self.path} "
                    "to index the dataset again"
                ) from exc
            if names is None:
                raise ConfigError(
                    f"index {self.path} of {self.url} holds no tar member names (object "
                    f"{self._table.path(obj)!r}): it was saved by save_index or an older "
                    "fastdata. Delete it and open the dataset again to scan the shards, "
                    "or leave '__member__' out of metadata"
                )
            for i, name in zip(where.tolist(), names, strict=True):
                out[i] = name
        return out

    def shard_sizes(self) -> np.ndarray:
        """Samples per source object, in id order (the shards of ``shard_window``)."""
        if self._shard_sizes is None and self._parts is not None:
            counts = np.diff(self._table.first_rows())
            self._shard_sizes = counts[counts > 0]
        if self._shard_sizes is None:
            objects = np.asarray(self._table.rows["obj"])
            boundaries = np.flatnonzero(np.diff(objects)) + 1
            self._shard_sizes = np.diff(np.concatenate(([0], boundaries, [len(objects)])))
        return self._shard_sizes

    @property
    def shares_ranges(self) -> bool:
        """Whether reads fetch ranges shared by several rows: Parquet row groups
        (NOTE[row-ranges]), or the fetch chunks of packed and tar shards
        (NOTE[shard-chunks]). The default shuffle walks them (``epoch_order``)."""
        return self._shared is not None

    def mean_sample_bytes(self) -> int:
        """Fetched bytes per sample on average (a shared range counted once)."""
        if len(self) == 0:
            return 0
        return int(np.asarray(self._reader.range_fetch_bytes()).sum()) // len(self)

    def unit_sizes(self) -> np.ndarray:
        """Samples per read unit in id order: per row group where rows share fetch ranges
        (Parquet), per fetch chunk of packed and tar shards (NOTE[shard-chunks]), else per
        source object. The shards the epoch plan walks (``fastdata.plan.epoch_order``)."""
        if self._shared is None:
            return self.shard_sizes()
        return np.diff(np.append(self._reader.range_starts(), len(self)))

    def describe(self, sample_id: int) -> str:
        """Where sample ``sample_id`` lives: ``object 'path' bytes [start, end)``."""
        row = self._table.rows[self._ids([sample_id])[0]]
        start, end = self.layout.fetch_spans(np.asarray([row]))
        path = self._table.path(int(row["obj"]))
        return f"object {path!r} bytes [{int(start[0])}, {int(end[0])}) of {self.url}"

    def read_samples(
        self, store: Store, sample_ids: Any, *, index_fields: bool = True
    ) -> list[Sample]:
        """Fetch and decode samples, in the order of ``sample_ids``.

        The ids are grouped into fetch units (one object; a run of tar samples; a
        Parquet row group; a run of packed records), all fetched with one
        ``store.get_many`` call, each pinned to the ETag the index saw. With
        ``index_fields`` the fields that come from the table (the files layout's
        ``label``) are added to each sample dict; the cache reads without them, so that
        its records hold only what the fetched bytes say (NOTE[cache-keys]).

        Raises:
            ConfigError: An id is out of range.
            CorruptRecordError: Malformed bytes; names object, offset and sample.
            StoreError: The store failed (``ObjectChangedError`` when an object changed
                since the index was built: reopen with ``consistency="validate"``).
        """
        ids = self._ids(sample_ids, store)
        if len(ids) == 0:
            return []
        out = self._reader.read(store, ids)
        extra = self.layout.index_fields(self._table.rows[ids]) if index_fields else {}
        for name, values in extra.items():
            for sample, value in zip(out, values.tolist(), strict=True):
                if isinstance(sample, dict):
                    sample[name] = value
        return out

    def hint(self, store: Store, sample_ids: Any, elsewhere: Any = None) -> None:
        """The samples read next, in order (the cache's hint): plan the readahead of
        their Parquet row groups or shard chunks (NOTE[range-readahead] in
        ``fastdata/layouts/_readahead.py``). Fetches nothing by itself. ``elsewhere``: ids
        other processes read instead (NOTE[worker-share]), left out of fetched chunks.

        Raises:
            ConfigError: An id is out of range.
        """
        other = None if elsewhere is None else self._ids(elsewhere, store)
        self._reader.hint(store, self._ids(sample_ids, store), other)

    def source(self, store: Store | None = None) -> IndexSource:
        """This index bound to a store: the cache's ``SampleSource``.

        Args:
            store: The store to read from; ``None`` opens one on the index URL with the
                storage options given to :func:`fastdata.index.open_index`.

        Raises:
            ConfigError: ``store`` reads another server than the index was built from.
        """
        return IndexSource.bind(self, store)


def _reopen(directory: str, storage_options: dict[str, Any]) -> SampleIndex:
    return SampleIndex(SampleTable.open(Path(directory)), storage_options=storage_options)


class IndexSource(BoundSource[SampleIndex]):
    """A :class:`SampleIndex` bound to a :class:`Store` (the cache's ``SampleSource``).

    Pickles as configuration: the index as its directory, the store as its URL and
    options; each process maps and connects again.
    """

    def __len__(self) -> int:
        return len(self.index)

    def keys(self, sample_ids: Any) -> list[bytes]:
        """See :meth:`SampleIndex.keys`."""
        return self.index.keys(sample_ids)

    def fingerprints(self, sample_ids: Any) -> list[bytes]:
        """See :meth:`SampleIndex.fingerprints`."""
        return self.index.fingerprints(sample_ids)

    def read_samples(self, sample_ids: Any) -> list[Sample]:
        """The samples as :meth:`SampleIndex.read_samples` reads them, without the fields
        that come from the table: what the cache stores (NOTE[cache-keys])."""
        return self.index.read_samples(self.store, sample_ids, index_fields=False)

    def hint(self, sample_ids: Any, elsewhere: Any = None) -> None:
        """The samples read next, in order: see :meth:`SampleIndex.hint`."""
        self.index.hint(self.store, sample_ids, elsewhere)

    def describe(self, sample_id: int) -> str:
        """See :meth:`SampleIndex.describe`."""
        return self.index.describe(sample_id)
