"""What a dataset *is*: one specification that every entry point builds and opens alike.

``fastdata.Dataset``, ``TokenDataset``, ``fastdata warm``, ``doctor``, ``stats``, ``clear``,
``pack`` and ``bench`` all describe a dataset with a :class:`DatasetSpec`, built once where
the user's arguments come in, validated here and nowhere else, and passed (not re-parsed)
down the flow: ``fastdata.index.open_index(spec, ...)`` opens its sample index, and
:meth:`DatasetSpec.store` is the one way a process opens the dataset's store. The epoch
order they follow is ``fastdata.plan.epoch_order``. So no two entry points can disagree
about which saved index, which cache keys (NOTE[cache-keys] in
``fastdata/index/_keys.py``) or which order a dataset has.

The spec sits just above the store: it imports nothing of the index, the plan or the
layouts, and every layer above takes it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from fastdata.config import StoreConfig
from fastdata.errors import ConfigError
from fastdata.store import Store, normalize_url

__all__ = ["Consistency", "DatasetSpec"]

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
