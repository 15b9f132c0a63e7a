"""What a dataset *is*: one specification that every entry point builds and opens alike.

``fastdata.Dataset``, ``fastdata warm``, ``doctor``, ``stats``, ``clear``, ``pack`` and
``bench`` all describe a dataset with a :class:`DatasetSpec` and open it with
:meth:`DatasetSpec.open`; the epoch order they follow is :func:`epoch_order`. So no two
entry points can disagree about which saved index, which cache keys (NOTE[cache-keys] in
``fastdata/index.py``) or which order a dataset has.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from fastdata.config import StoreConfig
from fastdata.errors import ConfigError
from fastdata.index import SampleIndex, normalize_url, open_index
from fastdata.plan import EpochOrder, PlanConfig
from fastdata.store import Store

__all__ = ["WALK_CHUNKS", "WALK_WINDOW_BYTES", "Consistency", "DatasetSpec", "epoch_order"]

logger = logging.getLogger(__name__)

Consistency = Literal["validate", "immutable"]
_CONSISTENCY = ("validate", "immutable")


@dataclass(frozen=True)
class DatasetSpec:
    """A dataset: where it is, how it is laid out, and which part of it to read.

    Raises:
        ConfigError: A field has the wrong type or value.
    """

    url: str
    """Dataset root (``s3://bucket/prefix``, ``file:///data``, a local path)."""
    layout: str | None = None
    """``files``, ``tar``, ``parquet`` or ``packed``; detected when ``None``."""
    pattern: str | None = None
    """Glob selecting objects below ``url``; the layout's default when ``None``."""
    fields: Sequence[str] | None = None
    """Tar extensions or Parquet columns to keep; ``None`` keeps all."""
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    """Passed to the store untouched (credentials, endpoint); the endpoint they resolve
    to is part of the dataset's identity."""
    consistency: Consistency = "validate"
    """``validate`` (default): list on open and see added, removed and overwritten
    objects at once; ``immutable``: trust the saved index without a request (huge,
    frozen datasets)."""
    strict: bool = False
    """With ``validate``, refuse a changed dataset instead of warning."""
    layout_options: Mapping[str, Any] = field(default_factory=dict)
    """The layout's own options (``labels=True`` for the files layout, ...)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", normalize_url(self.url))
        for name in ("storage_options", "layout_options"):
            value = getattr(self, name)
            if value is None:
                object.__setattr__(self, name, {})
            elif not isinstance(value, Mapping):
                raise ConfigError(f"{name} must be a mapping (a dict), got {value!r}")
        fields = self.fields
        if fields is not None:
            if isinstance(fields, str) or not all(isinstance(f, str) and f for f in fields):
                raise ConfigError(f"fields must be a sequence of field names, got {fields!r}")
            object.__setattr__(self, "fields", tuple(fields))
        if self.pattern is not None and (not isinstance(self.pattern, str) or not self.pattern):
            raise ConfigError(
                f"pattern must be a non-empty glob such as '**/*.jpg', got {self.pattern!r}"
            )
        if self.layout is not None and not isinstance(self.layout, str):
            raise ConfigError(f"layout must be a layout name or None, got {self.layout!r}")
        if self.consistency not in _CONSISTENCY:
            raise ConfigError(
                f"consistency must be 'validate' or 'immutable', got {self.consistency!r}"
            )
        if not isinstance(self.strict, bool):
            raise ConfigError(f"strict must be True or False, got {self.strict!r}")

    def store(self, config: StoreConfig | None = None) -> Store:
        """A store rooted at the dataset URL with the spec's storage options."""
        return Store(self.url, storage_options=dict(self.storage_options), config=config)

    def open(
        self, store: Store | None = None, cache_dir: str | os.PathLike[str] | Path | None = None
    ) -> SampleIndex:
        """Open (or build and save) the dataset's sample index.

        Args:
            store: A store from :meth:`store` (``None`` opens one with default settings).
            cache_dir: The node cache directory (indexes live under ``index/``).

        Raises:
            ConfigError: A bad option, or nothing to read at the URL.
            StoreError: The store could not be listed or scanned.
            CacheError: The index cannot be saved under ``cache_dir`` (no space).
        """
        return open_index(
            self.url,
            layout=self.layout,
            pattern=self.pattern,
            fields=list(self.fields) if self.fields is not None else None,
            storage_options=dict(self.storage_options),
            store=store if store is not None else self.store(),
            cache_dir=cache_dir,
            consistency=self.consistency,
            strict=self.strict,
            **dict(self.layout_options),
        )

    def summary(self) -> str:
        """A short description for logs, ``fastdata stats`` and error messages."""
        parts = [self.url]
        if self.layout:
            parts.append(f"layout={self.layout}")
        if self.pattern:
            parts.append(f"pattern={self.pattern}")
        if self.fields:
            parts.append(f"fields={','.join(self.fields)}")
        parts.extend(f"{k}={v}" for k, v in sorted(self.layout_options.items()))
        return " ".join(parts)


WALK_WINDOW_BYTES = 512 * 1024**2
"""With ``shuffle="auto"`` over row groups, the window holds about this many bytes at
most (``window_samples`` is lowered to fit), so that the rows kept while a window is read
(NOTE[shared-ranges]) fit the index's budget of ``SHARED_RANGE_BYTES``."""
WALK_CHUNKS = 16
"""With ``shuffle="auto"`` over the fetch chunks of packed and tar shards
(NOTE[shard-chunks]), the window holds about this many chunks' bytes at most (128 MiB of
8 MiB chunks): a batch mixes samples of about this many places of the dataset, and the
first batch of a cold epoch waits for about this many chunks (docs/plan.md, "Chunk walk")."""

_warned_global: set[str] = set()


def epoch_order(index: SampleIndex, config: PlanConfig, epoch: int) -> EpochOrder:
    """The canonical global order of ``epoch``: the same on every rank, worker and tool.

    NOTE[row-group-walk]: where rows share fetch ranges (Parquet row groups, and the
    fetch chunks of packed and tar shards, NOTE[shard-chunks]), the shards of
    ``shuffle="shard_window"`` and of ``"auto"`` (the default of ``fastdata.Dataset``) are
    those ranges, not the files: ranges in a shuffled order, samples shuffled within
    windows of ``window_samples`` (for ``auto`` at most ``WALK_WINDOW_BYTES`` of data, and
    over chunks at most ``WALK_CHUNKS`` chunks' bytes). A cold epoch then fetches each
    range once (docs/plan.md, "Row-group walk", "Chunk walk"). Everything here is a
    function of the saved index (never of what is cached), so every rank agrees.
    """
    shard_sizes = None
    if config.shuffle == "shard_window":
        shard_sizes = index.unit_sizes()
    elif config.shuffle == "auto" and index.shares_ranges:
        shard_sizes = index.unit_sizes()
        window_bytes = WALK_WINDOW_BYTES
        chunk_bytes = int(getattr(index, "chunk_bytes", 0) or 0)
        if chunk_bytes:
            window_bytes = min(window_bytes, WALK_CHUNKS * chunk_bytes)
        fits = max(1, window_bytes // max(1, index.mean_sample_bytes()))
        if fits < config.window_samples:
            config = replace(config, window_samples=fits)
    elif (
        config.shuffle == "global"
        and index.shares_ranges
        and not getattr(index, "chunk_bytes", 0)
        and index.url not in _warned_global
    ):
        _warned_global.add(index.url)
        logger.warning(
            "%s: shuffle='global' over Parquet row groups: while the cache is cold, nearly "
            "every batch needs its own row groups, so an epoch larger than the rows a "
            "process keeps (1 GiB) fetches them many times over. Warm the cache first "
            "(`fastdata warm`), or keep the default shuffle (True), which walks row groups "
            "and fetches each once",
            index.url,
        )
    return EpochOrder(len(index), config, epoch=epoch, shard_sizes=shard_sizes)
