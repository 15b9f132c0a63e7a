"""``fastdata clear``: remove one dataset from the node cache, or everything.

Records belong to the store, not to a dataset (NOTE[cache-keys]): clearing a dataset
evicts the records of its samples, key by key, so records it shares with another
dataset over the same objects go too (they are refetched on the next read); the other
dataset's saved index stays.

Safe while other processes read: the LMDB tier deletes in bounded write transactions
and a reader keeps its snapshot until its read transaction ends, then sees misses
(docs/cache.md); saved indexes are renamed away whole (``_saved.remove_index``), so a
process opening one finds all of it or none and rebuilds. The empty claim files of
``warm`` (NOTE[warm-claims]) stay: a running ``warm`` may hold locks in them.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from fastdata.cache import DatasetInfo, LmdbTier
from fastdata.config import CacheConfig
from fastdata.errors import ConfigError
from fastdata.index import normalize_url
from fastdata.ops._saved import SavedIndex, open_saved, remove_index, saved_indexes

__all__ = ["ClearResult", "clear_cache", "match_datasets"]

logger = logging.getLogger(__name__)

_HEX_RE = re.compile(r"[0-9a-fA-F]+")
_ID_HEX_DIGITS = 16
_EVICT_BATCH = 8192  # keys per write transaction of a dataset's eviction


@dataclass(frozen=True)
class ClearResult:
    """What ``clear_cache`` removed."""

    dataset_ids: tuple[str, ...]
    """The datasets cleared (hex ids); every dataset for a whole-cache clear."""
    entries: int
    """Cache entries removed."""
    indexes: int
    """Saved indexes removed."""
    urls: tuple[str, ...] = field(default=())
    """The URLs of the removed indexes."""

    def as_dict(self) -> dict[str, object]:
        """A JSON-ready dict."""
        fields = dataclasses.asdict(self).items()
        return {k: list(v) if isinstance(v, tuple) else v for k, v in fields}


def match_datasets(
    dataset: str, known: Sequence[DatasetInfo], saved: list[SavedIndex]
) -> tuple[set[bytes], list[SavedIndex]]:
    """The record namespaces and saved indexes ``dataset`` names.

    ``dataset`` is a unique prefix of an id as ``fastdata stats`` prints it (hex digits,
    any case; a whole id always names itself): a dataset id names its saved indexes, a
    namespace id the namespace (every cached record of one store). Else it is a URL,
    which matches every saved index of that URL (any layout or pattern) and the
    namespaces of the earlier per-dataset scheme registered under it
    (``<url> @ <identity>`` or the bare URL). ``known`` are the namespaces the cache knows.

    Raises:
        ConfigError: The prefix matches several ids (the message lists them).
    """
    if _HEX_RE.fullmatch(dataset):
        names = {d.dataset_id: d.name for d in known}
        names.update({s.dataset_id: s.url for s in saved})
        prefix = dataset.lower()
        matches = sorted(d for d in names if d.hex().startswith(prefix))
        if len(matches) > 1:
            listed = ", ".join(f"{d.hex()} ({names[d] or 'no name'})" for d in matches)
            raise ConfigError(
                f"dataset id prefix {dataset!r} is ambiguous: it matches {len(matches)} "
                f"datasets: {listed}; give more digits of the id (see `fastdata stats`)"
            )
        if matches or len(dataset) == _ID_HEX_DIGITS:
            wanted = matches[0] if matches else bytes.fromhex(dataset)
            indexes = [s for s in saved if s.dataset_id == wanted]
            return (set() if indexes else {wanted}), indexes
    url = normalize_url(dataset)
    indexes = [s for s in saved if s.url == url]
    # Namespaces of the earlier per-dataset scheme were named "<url> @ <identity>" (or
    # the bare URL); a store's namespace is named by its identity, never a URL.
    ids = {d.dataset_id for d in known if d.name.split(" @ ")[0] in (url, dataset)}
    return ids, indexes


def _evict_records(tier: LmdbTier, saved: SavedIndex) -> int:
    """Evict the cached records of a saved index's samples (records other datasets over
    the same objects share go too: NOTE[cache-keys])."""
    index = open_saved(saved)
    if index is None:
        return 0
    removed = 0
    for start in range(0, len(index), _EVICT_BATCH):
        removed += tier.evict(index.keys(np.arange(start, min(start + _EVICT_BATCH, len(index)))))
    return removed


def clear_cache(config: CacheConfig, *, dataset: str | None = None) -> ClearResult:
    """Remove one dataset's cache entries and saved indexes, or the whole cache.

    Args:
        config: The cache settings (directory).
        dataset: A dataset URL, or a unique prefix of a hex id as ``fastdata stats``
            shows it; ``None`` clears every dataset.

    Returns:
        What was removed (nothing, when the dataset is not cached).

    Raises:
        ConfigError: A bad argument, or an id prefix that matches several datasets.
        CacheError: The cache directory belongs to another user.
    """
    if not isinstance(config, CacheConfig):
        raise ConfigError(f"clear_cache takes a CacheConfig, not {type(config).__name__}")
    if dataset is not None and (not isinstance(dataset, str) or not dataset.strip()):
        raise ConfigError(f"dataset must be a URL or a dataset id, got {dataset!r}")
    cache_dir = config.resolved_dir()
    if not cache_dir.exists():
        return ClearResult((), 0, 0)
    saved = saved_indexes(cache_dir)
    has_lmdb = (cache_dir / "lmdb").is_dir()
    with LmdbTier(config) as tier:
        if dataset is None:
            ids = {s.dataset_id for s in saved}
            # Namespaces no saved index reads from (older schemes, deleted indexes).
            held = {s.namespace for s in saved}
            known = tier.datasets() if has_lmdb else []
            ids |= {d.dataset_id for d in known if d.entries and d.dataset_id not in held}
            entries = tier.clear() if has_lmdb else 0
            indexes = saved
        else:
            known = tier.datasets() if has_lmdb else []
            spaces, indexes = match_datasets(dataset.strip(), known, saved)
            entries = sum(tier.clear(d) for d in sorted(spaces)) if has_lmdb else 0
            if has_lmdb:
                entries += sum(_evict_records(tier, s) for s in indexes)
            ids = spaces | {s.dataset_id for s in indexes}
    for index in indexes:
        remove_index(index)
    return ClearResult(
        dataset_ids=tuple(sorted(d.hex() for d in ids)),
        entries=entries,
        indexes=len(indexes),
        urls=tuple(sorted({s.url for s in indexes})),
    )
