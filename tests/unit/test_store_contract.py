"""The store contract on file://, memory:// and moto (both backends), and the fault contract
through the proxy on moto. moto is the one server unit tests may use."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fastdata.config import StoreConfig
from fastdata.store import Store
from tests.contracts.store_contract import MakeStore, StoreContract, StoreFaultContract


class TestFileStore(StoreContract):
    @pytest.fixture
    def make_store(self, tmp_path: Path) -> MakeStore:
        def make(config: StoreConfig | None = None) -> Store:
            return Store(f"file://{tmp_path}/root", config=config)

        return make


class TestMemoryStore(StoreContract):
    @pytest.fixture
    def make_store(self) -> Iterator[MakeStore]:
        root = f"memory://fastdata-test-{uuid.uuid4().hex}"

        def make(config: StoreConfig | None = None) -> Store:
            return Store(root, config=config)

        yield make
        cleanup = Store(root)
        cleanup.delete_many([info.path for info in cleanup.list()])
        cleanup.close()


class _MotoStore(StoreContract):
    backend = "auto"

    @pytest.fixture
    def make_store(self, moto_bucket: Any, aws_env: None) -> MakeStore:
        def make(config: StoreConfig | None = None) -> Store:
            config = config or StoreConfig()
            config = StoreConfig(**{**config.__dict__, "backend": self.backend})
            store = Store(
                f"{moto_bucket.url}/root",
                storage_options=moto_bucket.storage_options,
                config=config,
            )
            assert store.backend == self.backend
            return store

        return make


class TestMotoFsspecStore(_MotoStore):
    backend = "fsspec"


class TestMotoObstoreStore(_MotoStore):
    backend = "obstore"


class TestMotoFsspecFaults(StoreFaultContract):
    backend = "fsspec"

    @pytest.fixture
    def upstream(self, moto_bucket: Any, aws_env: None) -> Any:
        return moto_bucket


class TestMotoObstoreFaults(StoreFaultContract):
    backend = "obstore"

    @pytest.fixture
    def upstream(self, moto_bucket: Any, aws_env: None) -> Any:
        return moto_bucket
