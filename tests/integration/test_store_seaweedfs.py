"""The store contract and the fault contract against the real S3-compatible server
(SeaweedFS), with both backends.

Every test gets its own folder in one bucket per module instead of a bucket of its own:
SeaweedFS gives each bucket a collection with several volumes of its own, and a server on
a small disk runs out of volumes after a dozen buckets.
"""

from __future__ import annotations

import os
import uuid

import pytest

from fastdata.config import StoreConfig
from fastdata.store import Store
from fastdata.testing.s3 import S3Target
from fastdata.testing.seaweedfs import SeaweedServer
from tests.contracts.store_contract import MakeStore, StoreContract, StoreFaultContract

pytestmark = pytest.mark.integration


SeaweedRoot = S3Target
"""A fresh folder in the module's bucket, with what clients need to reach it."""


@pytest.fixture(scope="module")
def store_bucket(s3_server: SeaweedServer) -> str:
    name = f"fastdata-store-{os.getpid()}"
    s3_server.create_bucket(name)
    return name


@pytest.fixture
def seaweed_root(s3_server: SeaweedServer, store_bucket: str, aws_env: None) -> SeaweedRoot:
    return SeaweedRoot(s3_server.endpoint_url, store_bucket, f"t-{uuid.uuid4().hex[:12]}")


class _SeaweedStore(StoreContract):
    backend = "auto"

    @pytest.fixture
    def make_store(self, seaweed_root: SeaweedRoot) -> MakeStore:
        def make(config: StoreConfig | None = None) -> Store:
            config = config or StoreConfig()
            config = StoreConfig(**{**config.__dict__, "backend": self.backend})
            store = Store(
                seaweed_root.url, storage_options=seaweed_root.storage_options, config=config
            )
            assert store.backend == self.backend
            return store

        return make


class TestSeaweedFsspecStore(_SeaweedStore):
    backend = "fsspec"


class TestSeaweedObstoreStore(_SeaweedStore):
    backend = "obstore"


class TestSeaweedFsspecFaults(StoreFaultContract):
    backend = "fsspec"

    @pytest.fixture
    def upstream(self, seaweed_root: SeaweedRoot) -> SeaweedRoot:
        return seaweed_root


class TestSeaweedObstoreFaults(StoreFaultContract):
    backend = "obstore"

    @pytest.fixture
    def upstream(self, seaweed_root: SeaweedRoot) -> SeaweedRoot:
        return seaweed_root
