"""What every cache ``SampleSource`` over an index shares: the index and the store it binds
together, and the cache namespace it is read under (id, URL and the name shown for it).

:class:`BoundSource` is the base of ``fastdata.index.IndexSource`` (samples) and
``fastdata.tokens.BlockSource`` (token chunks); each adds its ``__len__``, ``keys``,
``fingerprints``, ``read_samples`` and ``describe``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, Protocol, Self, TypeVar

from fastdata.errors import ConfigError
from fastdata.index._keys import namespace_name
from fastdata.store import Store

__all__ = ["BoundSource", "Namespaced"]


class Namespaced(Protocol):
    """An index as a source needs it: its namespace, where it was built from and with
    which storage options."""

    @property
    def dataset_id(self) -> bytes: ...

    @property
    def namespace(self) -> bytes: ...

    @property
    def url(self) -> str: ...

    @property
    def store_identity(self) -> str: ...

    @property
    def storage_options(self) -> Mapping[str, Any]: ...


IndexT = TypeVar("IndexT", bound=Namespaced)


class BoundSource(Generic[IndexT]):
    """An index bound to a :class:`Store`: the part of a cache ``SampleSource`` that does
    not depend on what its samples are.

    Args:
        index: What the samples are and where they lie.
        store: Where they are read from.
    """

    def __init__(self, index: IndexT, store: Store) -> None:
        self.index = index
        self.store = store

    @classmethod
    def bind(cls, index: IndexT, store: Store | None = None) -> Self:
        """``index`` bound to ``store``, or to a store opened on the index URL with the
        storage options the index was opened with (``store=None``).

        Raises:
            ConfigError: ``store`` reads another server than the index was built from.
        """
        if store is None:
            store = Store(index.url, storage_options=index.storage_options)
        elif store.identity != index.store_identity:
            raise ConfigError(
                f"the index of {index.url} was built from {index.store_identity}, but the "
                f"store given reads {store.identity}: open the index with that store's "
                "storage options (each server has its own index and cache entries)"
            )
        return cls(index, store)

    @property
    def dataset_id(self) -> bytes:
        """The 8-byte record namespace of the store (the first half of every key, what
        the tiers count and evict by: NOTE[cache-keys]); not the spec's ``dataset_id``."""
        return self.index.namespace

    @property
    def url(self) -> str:
        """The normalized root URL (the name the cache registers the namespace under)."""
        return self.index.url

    @property
    def name(self) -> str:
        """What ``fastdata stats`` shows for the namespace (``namespace_name``)."""
        return namespace_name(self.index.store_identity)
